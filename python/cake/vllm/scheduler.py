"""The connector's scheduler half, and vLLM's scheduler with Cake's split.

_SchedulerSide (in the scheduler process's CakeConnector): get_num_new_matched_tokens sends the prompt's tokens to
caked's Lookup on a thread of its own and answers None (ask again) until the answer is in; then the tokens cached
beyond vLLM's own prefix hit, in whole chunks, leaving at least one token to compute (cake.split.split_end). It
turns vLLM's allocations into LoadSpecs and finished requests into StoreSpecs for the next step's metadata.

SplitScheduler (the split's scheduler half, inside _SchedulerSide when cake_split is on): at admission it decides
whether a request takes the split (cake.split.check_eligibility) and then answers vLLM "no external tokens", so the
engine computes forward from its local prefix hit while caked loads the back; each step it turns the book's
SplitStep into the connector's metadata, and it reads the workers' WorkerMeta.

CakeScheduler / CakeAsyncScheduler (CakeSchedulerMixin before vLLM's Scheduler or AsyncScheduler):

    vllm serve MODEL --scheduler-cls cake.vllm.scheduler.CakeScheduler \\
        --kv-transfer-config '{"kv_connector": "CakeConnector", "kv_connector_module_path": "cake.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"cake_split": true}}'

(CakeAsyncScheduler under --async-scheduling; cake.vllm_scheduler.CakeScheduler, the older name, is the same class.)
Stock vLLM keeps one contiguous num_computed_tokens per request and asks a connector only while the request waits
with nothing computed, so an external load can only continue the local prefix (I/O-only). The mixin adds one thing
before vLLM schedules each step: a running split request whose loads cover [F, H) on every tensor-parallel rank (F
its computed front, H the cached end) has its num_computed_tokens moved from F to H. vLLM then allocates and hashes
the blocks for [F, H) like any prefill chunk's, and the connector's metadata tells the workers to copy those rows
from their regions into the blocks in start_load_kv, before the forward (the step's has_sync_kv_loads is set so vLLM
calls it then). Every decision lives in cake.split's SplitBook, which the connector (CakeConnector with cake_split
on) owns; without such a connector, or with split mode off, the classes are vLLM's schedulers unchanged.

vLLM loads the class by qualified name (SchedulerConfig.scheduler_cls) and says its interface is not public: the
mixin overrides only __init__ and schedule, passing every argument through (their signatures changed between
releases), and follows the adjust-then-super pattern of vLLM's own DiffusionAsyncScheduler.schedule(). Checked
against vLLM 0.34.0 (docs/engines.md, "Cake's split in vLLM").

vLLM is imported when a scheduler class is first used (module __getattr__), so this module imports without it.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from cake.engine_config import parse_flag
from cake.namespace import Namespace
from cake.split import DEFAULT_MIN_CHUNKS, SplitBook, SplitConfig, WorkerMeta, check_eligibility, split_end
from cake.vllm.config import extra_config, namespace_for, request_flag, request_namespace
from cake.vllm.data import CakeConnectorMetadata, LoadSpec, SplitMetadata, StoreSpec
from cake.vllm.log import forget_all, log, once


def split_config(extra: Mapping, *, block_size: int, world_size: int = 1) -> SplitConfig:
    """The split's configuration from vLLM's kv_connector_extra_config (cake_split, cake_split_min_chunks,
    cake_chunk_tokens), vLLM's block size and the tensor-parallel ranks."""
    return SplitConfig(enabled=parse_flag(extra.get("cake_split", False), "cake_split"),
                       min_chunks=int(extra.get("cake_split_min_chunks", DEFAULT_MIN_CHUNKS)),
                       chunk_tokens=int(extra.get("cake_chunk_tokens", 256)), block_size=int(block_size),
                       world_size=int(world_size))


# --- the split's scheduler half ------------------------------------------------------------------------------

def forced_split_at(request) -> object:
    """A request's kv_transfer_params["cake_split_at"] (tokens): the benchmarks' forced split, whose load reads
    only [at, H) so the engine computes at least [0, at). None when absent; a value that is no integer comes back
    as given, for admit() to refuse by name."""
    params = getattr(request, "kv_transfer_params", None) or {}
    value = params.get("cake_split_at") if isinstance(params, dict) else None
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return value


class SplitScheduler:
    """The book and what the connector's scheduler half asks of it. `bound` turns true when CakeScheduler (or
    CakeAsyncScheduler) binds itself: without it nobody would ever jump, so every request stays I/O-only."""

    def __init__(self, config: SplitConfig, speculative: bool = False):
        self.config = config
        self.book = SplitBook(config)
        self.speculative = speculative
        self.bound = False
        self._prompts: dict = {}  # req_id -> (tokens[:H], model_id) of its current page
        self._said: set = set()   # reasons already logged (once each)

    def bind_scheduler(self) -> None:
        self.bound = True

    def _say_once(self, reason: str, request_id: str) -> None:
        key = reason.split(":")[0]
        if key not in self._said:
            self._said.add(key)
            log.info("Cake split not used for request %s (and others like it; they load I/O-only): %s",
                     request_id, reason)

    def admit(self, request, ns: Optional[Namespace], local_tokens: int, cached_chunks: int) -> bool:
        """Whether the split takes this request (the connector then answers 0 external tokens). ns None: a
        multimodal request."""
        params = getattr(request, "sampling_params", None)
        eligibility = check_eligibility(
            self.config, local_tokens=local_tokens, cached_chunks=cached_chunks,
            num_prompt_tokens=int(request.num_prompt_tokens), is_multimodal=ns is None,
            wants_prompt_logprobs=getattr(params, "prompt_logprobs", None) is not None,
            speculative=self.speculative, scheduler_bound=self.bound)
        if not eligibility:
            if request.request_id in self.book:  # asked again, no longer eligible (its local hit grew)
                self.book.request_finished(request.request_id)
                self._prompts.pop(request.request_id, None)
            self._say_once(eligibility.reason, request.request_id)
            return False
        at = forced_split_at(request)
        chunk = self.book.config.chunk_tokens
        if at is not None and not (isinstance(at, int) and eligibility.local <= at < eligibility.end
                                   and at % chunk == 0):
            self._say_once(f"cake_split_at={at!r} is not a chunk-aligned point in [local hit {eligibility.local}, "
                           f"H {eligibility.end})", request.request_id)
            return False
        self.book.add(request.request_id, eligibility.local, eligibility.end, int(request.num_prompt_tokens), at=at)
        self._prompts[request.request_id] = (tuple(request.prompt_token_ids[:eligibility.end]), ns.model_id)
        return True

    def build(self, scheduler_output, block_ids_of: Callable) -> Optional[SplitMetadata]:
        """This step's SplitMetadata from vLLM's SchedulerOutput (None when there is nothing to send)."""
        computed_before = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed_before.update(zip(cached.req_ids, cached.num_computed_tokens))
        step = self.book.build_step(scheduler_output.num_scheduled_tokens, block_ids_of,
                                    computed_before=computed_before,
                                    preempted=getattr(scheduler_output, "preempted_req_ids", None) or (),
                                    finished=scheduler_output.finished_req_ids or ())
        prompts = {}
        for start in step.starts:
            prompts[start.key] = self._prompts.pop(start.req_id)
        for req_id in [r for r in self._prompts if r not in self.book]:
            del self._prompts[req_id]
        return None if step.is_empty() else SplitMetadata(step, prompts)

    def on_worker_meta(self, meta) -> None:
        if isinstance(meta, WorkerMeta):
            self.book.on_worker_meta(meta)

    def finished(self, request) -> Optional[list]:
        """The chunk ranges to store of a finished split request, or None for one the split never had."""
        if request.request_id not in self.book:
            return None
        self._prompts.pop(request.request_id, None)
        computed = min(int(request.num_prompt_tokens), int(getattr(request, "num_computed_tokens", 0) or 0))
        return self.book.request_finished(request.request_id, computed)


# --- the connector's scheduler half --------------------------------------------------------------------------

@dataclass
class _Lookup:
    """A waiting request's lookup, from vLLM's first ask until vLLM has allocated for it (or it finished)."""
    future: concurrent.futures.Future  # of the cached chunks
    started: float                     # monotonic time the lookup was asked for
    matched: Optional[tuple] = None    # (start, end, model id): the tokens promised to vLLM


class _SchedulerSide:
    """Lookups, the block ids vLLM gave each load, and what the next step's metadata carries."""

    def __init__(self, vllm_config, client):
        extra = extra_config(vllm_config)
        self.client = client
        self.ns = namespace_for(vllm_config, tp_rank=0)  # every rank stores its shard alike: rank 0 stands for all
        self.block_size = int(vllm_config.cache_config.block_size)
        self.load_async = bool(extra.get("cake_load_async", True))
        self.lookup_wait_s = float(extra.get("cake_lookup_wait_s", 0.002))
        # The first lookup of a waiting request asks the daemon to copy its hit from disk or Redis into DRAM
        # meanwhile (cake_prefetch = false: not), so the load that follows reads it from memory.
        self.prefetch = parse_flag(extra.get("cake_prefetch", True), "cake_prefetch")
        # A lookup still unanswered after this long (queued behind lookups a silent daemon holds) is a miss.
        self.lookup_timeout_s = float(extra.get("cake_timeout_s", 30.0))
        # The worker's region holds this many chunks: a longer hit could not land whole, so none is promised.
        self.region_chunks = int(extra.get("cake_region_chunks", 64))
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="cake-lookup")
        self._lookups: dict = {}  # request id -> _Lookup
        self._loads: list = []
        self._stores: list = []
        self._lock = threading.Lock()
        # Split mode: the book of split loads, which CakeSchedulerMixin binds to (and jumps by).
        self.split: Optional[SplitScheduler] = None
        if parse_flag(extra.get("cake_split", False), "cake_split"):
            world = int(getattr(vllm_config.parallel_config, "tensor_parallel_size", 1) or 1)
            self.split = SplitScheduler(split_config(extra, block_size=self.block_size, world_size=world),
                                        speculative=getattr(vllm_config, "speculative_config", None) is not None)
        self.block_ids_of: Optional[Callable] = None  # the connector sets it: vLLM's KVCacheManager.get_block_ids

    def _lookup(self, ns: Namespace, tokens: list) -> int:
        try:
            cached = self.client.lookup(ns, tokens=tokens, prefetch=self.prefetch).cached_chunks
        except Exception as error:  # anything: a lookup thread that raised would leave the request unanswered
            reason = getattr(getattr(error, "code", None), "name", None) or type(error).__name__
            once(logging.WARNING, f"lookup:{reason}", "caked lookup failed, computing instead (said once until "
                 "lookups work again): %s", error)
            return 0
        if forget_all("lookup:"):
            log.info("caked lookups work again")
        return cached

    def _forget(self, request_id: str) -> Optional[_Lookup]:
        with self._lock:
            return self._lookups.pop(request_id, None)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple:
        tokens = list(request.prompt_token_ids or [])
        chunk = self.ns.chunk_tokens
        ns = request_namespace(self.ns, request)
        if len(tokens) < chunk or ns is None or request_flag(request, "cake_load") is False:
            return 0, False
        with self._lock:
            asked = self._lookups.get(request.request_id)
            first_ask = asked is None
            if first_ask:
                asked = _Lookup(self._pool.submit(self._lookup, ns, tokens[:len(tokens) // chunk * chunk]),
                                time.monotonic())
                self._lookups[request.request_id] = asked
        # Only the first ask waits (a little): a step with many waiting requests must not wait on each of them.
        if not asked.future.done() and not first_ask:
            if time.monotonic() - asked.started < self.lookup_timeout_s:
                return None, False
            asked.future.cancel()  # still queued: never sent; running: its own deadline ends it
            self._forget(request.request_id)
            once(logging.WARNING, "lookup:unanswered", "caked lookup of request %s unanswered after %.1f s, "
                 "computing instead (said once until lookups work again)", request.request_id, self.lookup_timeout_s)
            return 0, False
        try:
            cached_chunks = asked.future.result(timeout=self.lookup_wait_s)
        except concurrent.futures.TimeoutError:
            return None, False  # not known yet: vLLM asks again on a later step
        if self.split is not None and request_flag(request, "cake_split") is not False and \
                self.split.admit(request, ns, num_computed_tokens, cached_chunks):
            return 0, False  # the engine computes from its local hit; the split's load starts when it runs
        # No more than the worker's region holds past vLLM's own hit, and at least one token computed (vLLM needs
        # one to sample from): a whole chunk less, so loads stay chunk- and block-aligned. num_tokens, not the
        # prompt's: a request preempted after its first output tokens computes from those.
        cached_chunks = min(cached_chunks, num_computed_tokens // chunk + self.region_chunks)
        cached = split_end(cached_chunks, request.num_tokens, chunk)
        external = cached - num_computed_tokens
        if external <= 0:
            self._forget(request.request_id)
            return 0, False
        with self._lock:
            asked.matched = (num_computed_tokens, cached, ns.model_id)
        return external, self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        asked = self._forget(request.request_id)
        matched = asked.matched if asked is not None else None
        if num_external_tokens <= 0 or matched is None:
            return  # nothing to load (or the second call after an asynchronous load)
        start, end, model_id = matched
        if end - start != num_external_tokens:
            log.warning("vLLM allocated %d external tokens for request %s, %d were offered; loading what it took",
                        num_external_tokens, request.request_id, end - start)
            end = start + min(end - start, num_external_tokens) // self.block_size * self.block_size
        block_ids = list(blocks.get_block_ids()[0])
        with self._lock:
            self._loads.append(LoadSpec(request.request_id, list(request.prompt_token_ids)[:end], block_ids, start,
                                        end, self.load_async, model_id))

    def build_connector_meta(self, scheduler_output) -> CakeConnectorMetadata:
        with self._lock:
            meta = CakeConnectorMetadata(loads=self._loads, stores=self._stores)
            self._loads, self._stores = [], []
        if self.split is not None:
            meta.split = self.split.build(scheduler_output, self.block_ids_of)
        return meta

    def on_worker_meta(self, meta) -> None:
        """The workers' reports of the last step (vLLM's KVConnectorOutput.kv_connector_worker_meta)."""
        if self.split is not None:
            self.split.on_worker_meta(meta)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def request_finished(self, request, block_ids: list) -> tuple:
        """Holds the finished request's blocks until the worker has stored the full chunks of its prompt that
        were computed: a request aborted mid-prefill, or before its load ended, stores only what its blocks truly
        hold (nothing, for one still waiting on its load)."""
        self._forget(request.request_id)
        ranges = self.split.finished(request) if self.split is not None else None
        if "WAITING" in str(getattr(request, "status", "")):
            return False, None  # never ran: its blocks hold nothing of it (and vLLM frees them its own way)
        ns = request_namespace(self.ns, request)
        tokens = list(request.prompt_token_ids or [])
        chunk = self.ns.chunk_tokens
        computed = min(len(tokens), int(getattr(request, "num_computed_tokens", 0) or 0))
        if ranges is None:
            ranges = [(0, computed // chunk)] if computed >= chunk else []
        ranges = [(first, end) for first, end in ranges if end > first]
        full = max((end for _, end in ranges), default=0) * chunk
        blocks_needed = full // self.block_size
        if ns is None or full == 0 or len(block_ids) < blocks_needed:
            return False, None
        with self._lock:
            self._stores.append(StoreSpec(request.request_id, tokens[:full], list(block_ids[:blocks_needed]),
                                          ns.model_id, [tuple(r) for r in ranges]))
        return True, None


# --- vLLM's scheduler with the split -------------------------------------------------------------------------

class CakeSchedulerMixin:
    """Put before vLLM's Scheduler or AsyncScheduler in the bases. The split's book is the KV connector's
    `cake_split` (a SplitScheduler), present only when split mode is on."""

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


_SCHEDULERS: dict = {}


def _make_scheduler(name: str) -> type:
    if name not in _SCHEDULERS:
        if name == "CakeScheduler":
            from vllm.v1.core.sched.scheduler import Scheduler as base
        else:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler as base
        cls = type(name, (CakeSchedulerMixin, base), {
            "__module__": __name__,
            "__doc__": f"vLLM's {base.__name__} with Cake's split (cake.vllm.scheduler.CakeSchedulerMixin)."})
        _SCHEDULERS[name] = cls
    return _SCHEDULERS[name]


def __getattr__(name: str):
    if name in ("CakeScheduler", "CakeAsyncScheduler"):
        return _make_scheduler(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
