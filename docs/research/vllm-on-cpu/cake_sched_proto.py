"""Prototype of cake.vllm_scheduler: the mixin over vLLM's real Scheduler / AsyncScheduler."""
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

JUMPS = []


class CakeSchedulerMixin:
    """The adjust-then-super pattern: before vLLM schedules, move a running split request's num_computed_tokens from
    its computed front F to the cached end H (once the loads cover [F, H) on every rank)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cake_targets = {}  # req_id -> (min_front, H): the driver's stand-in for the split book
        import os
        self._env_jump = tuple(int(x) for x in os.environ["CAKE_PROTO_JUMP"].split(":")) \
            if os.environ.get("CAKE_PROTO_JUMP") else None  # engine runs: jump every request once
        self._env_jumped = set()

    def schedule(self, *args, **kwargs):
        spliced = False
        for request in self.running:
            target = self._cake_targets.get(request.request_id)
            if target is None and self._env_jump and request.request_id not in self._env_jumped:
                self._env_jumped.add(request.request_id)
                self._cake_targets[request.request_id] = target = self._env_jump
            if target is None:
                continue
            min_front, h = target
            front = request.num_computed_tokens
            if min_front <= front < h and front < request.num_prompt_tokens:
                JUMPS.append((request.request_id, front, h))
                print(f"PROBE jump {request.request_id}: {front} -> {h}", flush=True)
                request.num_computed_tokens = h
                del self._cake_targets[request.request_id]
                # block ids of [F, H) do not exist yet: the connector resolves them in build_connector_meta,
                # after super().schedule() allocated them
                if hasattr(self.connector, "_pending_splices"):
                    self.connector._pending_splices.append((request.request_id, front, h))
                spliced = True
        output = super().schedule(*args, **kwargs)
        if spliced and hasattr(output, "has_sync_kv_loads"):
            output.has_sync_kv_loads = True  # start_load_kv before the forward (PR #53333)
        return output


class CakeScheduler(CakeSchedulerMixin, Scheduler):
    pass


class CakeAsyncScheduler(CakeSchedulerMixin, AsyncScheduler):
    pass


