"""vLLM's scheduler with Cake's split: the engine computes the front of a prompt while caked loads the back.

    vllm serve MODEL --scheduler-cls cake.vllm_scheduler.CakeScheduler \\
        --kv-transfer-config '{"kv_connector": "CakeConnector", "kv_connector_module_path": "cake.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"cake_split": true}}'

(CakeAsyncScheduler under --async-scheduling.) Stock vLLM keeps one contiguous num_computed_tokens per request and
asks a connector only while the request waits with nothing computed, so an external load can only continue the
local prefix (I/O-only). The mixin adds one thing before vLLM schedules each step: a running split request whose
loads cover [F, H) on every tensor-parallel rank (F its computed front, H the cached end) has its
num_computed_tokens moved from F to H. vLLM then allocates and hashes the blocks for [F, H) like any prefill
chunk's, and the connector's metadata tells the workers to copy those rows from their regions into the blocks in
start_load_kv, before the forward (the step's has_sync_kv_loads is set so vLLM calls it then). Every decision lives
in cake.split's SplitBook, which the connector (cake.vllm.CakeConnector with cake_split on) owns; without such a
connector, or with split mode off, the classes are vLLM's schedulers unchanged.

vLLM loads the class by qualified name (SchedulerConfig.scheduler_cls) and says its interface is not public: the
mixin overrides only __init__ and schedule, passing every argument through (their signatures changed between
releases), and follows the adjust-then-super pattern of vLLM's own DiffusionAsyncScheduler.schedule(). Checked
against vLLM 0.34.0 (docs/engines.md, "Cake's split in vLLM").

vLLM is imported when a class is first used (module __getattr__), so `import cake.vllm_scheduler` works without it.
"""
from __future__ import annotations

from cake.vllm_log import log


class CakeSchedulerMixin:
    """Put before vLLM's Scheduler or AsyncScheduler in the bases. The split's book is the KV connector's
    `cake_split` (a cake.vllm_split.SplitScheduler), present only when split mode is on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cake_split = getattr(getattr(self, "connector", None), "cake_split", None)
        if self._cake_split is not None:
            self._cake_split.bind_scheduler()
            log.info("Cake split on: %s jumps requests whose loads cover [front, cached end)", type(self).__name__)

    def schedule(self, *args, **kwargs):
        split = self._cake_split
        if split is None:
            return super().schedule(*args, **kwargs)
        book = split.book
        book.begin_step()
        from vllm.v1.request import RequestStatus
        for request in self.running:
            target = book.jump_target(request.request_id, request.num_computed_tokens, request.num_prompt_tokens,
                                      is_running=request.status == RequestStatus.RUNNING)
            if target is not None:
                book.note_jump(request.request_id, request.num_computed_tokens, target)
                request.num_computed_tokens = target
        output = super().schedule(*args, **kwargs)
        # build_connector_meta ran inside schedule(): a splice in this step's metadata must run before the forward.
        if book.spliced_this_step() and hasattr(output, "has_sync_kv_loads"):
            output.has_sync_kv_loads = True
        return output


_CLASSES = {}


def _make(name):
    if name not in _CLASSES:
        if name == "CakeScheduler":
            from vllm.v1.core.sched.scheduler import Scheduler as base
        else:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler as base
        cls = type(name, (CakeSchedulerMixin, base), {
            "__module__": __name__,
            "__doc__": f"vLLM's {base.__name__} with Cake's split (cake.vllm_scheduler.CakeSchedulerMixin)."})
        _CLASSES[name] = cls
    return _CLASSES[name]


def __getattr__(name):
    if name in ("CakeScheduler", "CakeAsyncScheduler"):
        return _make(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
