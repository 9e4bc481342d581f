"""Kept for older configurations: `--scheduler-cls cake.vllm_scheduler.CakeScheduler` (or CakeAsyncScheduler) names
the same classes as cake.vllm.scheduler, where vLLM's scheduler with Cake's split now lives. vLLM is imported when a
class is first used, so `import cake.vllm_scheduler` works without it."""
from cake.vllm import scheduler as _scheduler
from cake.vllm.scheduler import CakeSchedulerMixin

__all__ = ["CakeSchedulerMixin", "CakeScheduler", "CakeAsyncScheduler"]


def __getattr__(name):
    if name in ("CakeScheduler", "CakeAsyncScheduler"):
        return getattr(_scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
