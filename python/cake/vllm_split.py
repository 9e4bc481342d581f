"""Cake's split in cake.vllm: the scheduler's and the worker's halves around cake.split's logic.

The scheduler half (SplitScheduler) lives in the scheduler's CakeConnector: at admission it decides whether a
request takes the split (cake.split.check_eligibility) and then answers vLLM "no external tokens", so the engine
computes forward from its local prefix hit while caked loads the back; each step it turns the book's SplitStep into
the connector's metadata, and it reads the workers' WorkerMeta. CakeScheduler (cake.vllm_scheduler) moves the
request's num_computed_tokens once every rank holds [F, H).

The worker half (SplitWorker) lives in each worker's CakeConnector: it opens a cake-mode Load per SplitStart into a
window of its own region (one window per load, so loads of several requests run side by side), sends Progress,
copies the rows [F, H) from the region into the request's blocks in start_load_kv before the step's forward (the
splice), releases a load only once that copy is done (after a CUDA event on a GPU), and reports what landed.

Nothing here imports vLLM; torch only where a worker copies.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from cake.split import (COMPUTE_ONLY, LoadKey, SplitBook, SplitConfig, SplitStep, WorkerMeta,
                        check_eligibility, resident_low_of)
from cake.vllm_log import log, once, region_unknown



@dataclass
class SplitMetadata:
    """The split's part of CakeConnectorMetadata: the book's step, and what a worker needs to open each started
    load (the prompt's tokens up to H and the request's namespace, by load key)."""
    step: SplitStep = field(default_factory=SplitStep)
    prompts: dict = field(default_factory=dict)  # LoadKey -> (tokens tuple, model_id)


# --- scheduler -----------------------------------------------------------------------------------------------

def forced_split_at(request):
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

    def admit(self, request, ns, local_tokens: int, cached_chunks: int) -> bool:
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


# --- worker --------------------------------------------------------------------------------------------------

class WindowPool:
    """Chunk slots of the worker's split region, handed out as contiguous windows (first fit of the largest run
    up to what a load asks for: a window smaller than the load is fine, the daemon loads the top of the range)."""

    def __init__(self, chunks: int):
        self._free = [True] * chunks

    def take(self, want: int) -> Optional[tuple]:
        best, run_start = None, None
        for i, free in enumerate(self._free + [False]):
            if free and run_start is None:
                run_start = i
            elif not free and run_start is not None:
                length = i - run_start
                if best is None or length > best[1]:
                    best = (run_start, length)
                if length >= want:
                    best = (run_start, length)
                    break
                run_start = None
        if best is None or want <= 0:
            return None
        first, count = best[0], min(best[1], want)
        for i in range(first, first + count):
            self._free[i] = False
        return first, count

    def give(self, first: int, count: int) -> None:
        for i in range(first, first + count):
            self._free[i] = True

    @property
    def free_chunks(self) -> int:
        return sum(self._free)


@dataclass
class _Load:
    key: LoadKey
    session: object
    window: tuple            # (first chunk slot, chunks)
    end_chunk: int
    region: object = None    # the region its window is in
    pool: object = None      # the WindowPool its window goes back to
    landed: set = field(default_factory=set)
    seen: int = 0            # ChunkLoaded events taken from the session
    reported_low: Optional[int] = None
    failed_said: bool = False


class SplitWorker:
    """One worker's split loads. apply() runs in start_load_kv, meta() in build_connector_worker_meta. `layers`
    are cake.vllm_layout's PagedLayer of each registered KV cache; `slot` the worker's split region
    (cake.vllm_log.RegionSlot: registered again when the daemon has lost it)."""

    def __init__(self, client, ns, slot, rank: int, block_size: int, layers, device, chunk_view: Callable):
        self.client, self.ns, self.slot, self.rank = client, ns, slot, rank
        self.block_size, self.layers, self.device = block_size, layers, device
        self._chunk_view = chunk_view  # (region chunk slot, region) -> [layers, 2, tokens, heads, dim] view
        self.region = None
        self.windows = WindowPool(0)
        self._generation = 0          # the slot's registration the windows belong to
        self._region_lost = False     # a call naming the region was answered NOT_FOUND
        self._loads: dict = {}        # LoadKey -> _Load, live
        self._copying: list = []      # (_Load, CUDA event): spliced, released once the copy is done
        self._draining: list = []     # _Load released or cancelled: its window is free once the stream ends
        self._ended: set = set()
        self._failed: dict = {}
        self._errors: set = set()     # block ids of failed splices (vLLM recomputes from the first)
        self.spliced_tokens = 0

    # --- start_load_kv ------------------------------------------------------------------------------------------
    def apply(self, split: Optional[SplitMetadata], ns_for: Callable) -> None:
        """Cancels, starts, progress and splices of one step, in that order. ns_for(model_id) is the request's
        namespace on this rank."""
        self._reap()
        self._refresh_region()
        if split is None:
            return
        step = split.step
        for cancel in step.cancels:
            load = self._loads.pop(LoadKey(*cancel.key), None)
            if load is not None:
                self._end(load)
        for start in step.starts:
            tokens, model_id = split.prompts[start.key]
            self._start(start, tokens, ns_for(model_id))
        for key, computed_through in step.progress.items():
            load = self._loads.get(LoadKey(*key))
            if load is not None:
                load.session.progress(computed_through)
        for splice in step.splices:
            self._splice(splice)

    def _refresh_region(self) -> None:
        """The split region, registered again when the daemon lost it (restarted, or let the lease run out while
        unreachable). The loads in the old one are let go first (their streams ended with the daemon's loss of it;
        their copies, if any, are waited for) and reported failed, so their requests compute on."""
        lost = self._region_lost or (self.slot.region is not None and not self.slot.valid())
        if lost:
            self._abandon("the daemon no longer holds the split region")
            self.slot.lost()
            self._region_lost = False
        region = self.slot.get()
        if region is not None and self.slot.generation != self._generation:
            self._abandon("the split region was registered again")
            self._generation = self.slot.generation
            self.windows = WindowPool(region.size // self.ns.chunk_bytes)
        self.region = region

    def _abandon(self, why: str) -> None:
        for load, event in self._copying:
            event.synchronize()
            self._end(load)
        self._copying = []
        for key, load in list(self._loads.items()):
            self._failed.setdefault(key, why)
            self._end(load)
        self._loads.clear()
        self._draining = []  # their windows belong to the old region's pool, which goes with it

    def _start(self, start, tokens, ns) -> None:
        key = LoadKey(*start.key)
        if self.region is None:
            self._failed[key] = "no split region (caked could not be reached to register one)"
            return
        window = self.windows.take(start.end_chunk - start.computed_through)
        if window is None:
            self._failed[key] = f"no free window in the split region ({self.windows.free_chunks} chunks free)"
            return
        chunk_bytes = self.ns.chunk_bytes
        try:
            session = self.client.load(ns, tokens=list(tokens), region=self.region,
                                       region_offset=window[0] * chunk_bytes, region_bytes=window[1] * chunk_bytes,
                                       mode="cake", computed_through=start.computed_through)
        except Exception as error:  # anything: the request computes on
            self.windows.give(*window)
            self._failed[key] = f"the load did not start: {error}"
            self._region_lost |= region_unknown(error)
            return
        self._loads[key] = _Load(key, session, window, start.end_chunk, self.region, self.windows)

    def _take_landed(self, load: _Load) -> None:
        events = load.session.loaded_since(load.seen)
        load.seen += len(events)
        load.landed.update(event.chunk for event in events)

    def _splice(self, splice) -> None:
        """Copies the rows [F, H) of the request from the window into its blocks; on any failure the blocks are
        load errors (vLLM recomputes from the first) and the book hears it."""
        key = LoadKey(*splice.key)
        load = self._loads.pop(key, None)
        try:
            if load is None:
                raise RuntimeError("no live load on this rank")
            self._take_landed(load)
            rows = splice.rows(self.ns.chunk_tokens)
            missing = [r.chunk for r in rows if r.chunk not in load.landed]
            if missing:
                raise RuntimeError(f"chunks {missing} have not landed")
            self._copy_rows(load, splice, rows)
            self.spliced_tokens += splice.end - splice.start
        except Exception as error:  # anything: those blocks must not be taken for computed
            once(logging.WARNING, f"splice:{self.rank}", "Cake splice of request %s failed on rank %d, vLLM "
                 "recomputes it (said once; the daemon's stats count every load): %s", splice.req_id, self.rank, error)
            log.debug("Cake splice of request %s failed on rank %d: %s", splice.req_id, self.rank, error)
            self._failed[key] = f"splice failed: {error}"
            self._errors.update(splice.block_ids)
            if load is not None:
                self._end(load)
            return
        if self.device.type == "cuda":
            import torch
            event = torch.cuda.Event()
            event.record()  # on the current (compute) stream, after the copies
            self._copying.append((load, event))
        else:
            self._end(load)

    def _copy_rows(self, load: _Load, splice, rows) -> None:
        """One scatter of K and one of V per layer over the whole range: the rows of every chunk are gathered first
        (one torch.cat each, a single kernel), since a scatter per chunk per layer costs a kernel launch and its
        index tensors each, thousands for a long prefix (on an H200 that ran at 17 to 31 GB/s, docs/benchmarks.md
        section 14)."""
        import torch
        if not rows:
            return
        chunk_bytes, bs = self.ns.chunk_bytes, self.block_size
        block_ids = torch.tensor(splice.block_ids, dtype=torch.int64)
        positions = torch.cat([torch.arange(r.token_start, r.token_end) for r in rows])
        blocks = block_ids[positions // bs - splice.first_block].to(self.device)
        offsets = (positions % bs).to(self.device)
        views = [(self._chunk_view(load.session.region_offset(r.chunk) // chunk_bytes, load.region), r.row_start,
                  r.row_end) for r in rows]
        for index, layer in enumerate(self.layers):
            k = torch.cat([view[index, 0, start:end] for view, start, end in views])
            v = torch.cat([view[index, 1, start:end] for view, start, end in views])
            layer.write(blocks, offsets, k.to(layer.cache.dtype), v.to(layer.cache.dtype))

    def _end(self, load: _Load) -> None:
        """Release (never a cancel: the daemon's reads still in flight land before the stream ends, and only then
        is the window free, protocol.md "Ending a load")."""
        try:
            load.session.release(wait=False)
        except Exception:  # a stream that already failed: its end is what we wait for
            pass
        self._draining.append(load)

    def _reap(self) -> None:
        still = []
        for load, event in self._copying:
            if event.query():
                self._end(load)
            else:
                still.append((load, event))
        self._copying = still
        draining = []
        for load in self._draining:
            if load.session.ended:
                load.pool.give(*load.window)
            else:
                draining.append(load)
        self._draining = draining

    # --- build_connector_worker_meta ----------------------------------------------------------------------------
    def meta(self) -> Optional[WorkerMeta]:
        """What changed on this rank since the last step: the resident suffix of each live load, loads that ended
        without our word, loads this rank cannot use."""
        self._reap()
        resident = {}
        for key, load in list(self._loads.items()):
            self._take_landed(load)
            low = resident_low_of(load.landed, load.end_chunk)
            if load.reported_low is None or low < load.reported_low:
                load.reported_low = low
                resident[key] = low
            try:
                plan = load.session.wait_plan(timeout=0)  # never waits: None until the Plan is in
            except Exception as error:  # not in yet (a TimeoutError), or the daemon refused the load
                plan = None
                if load.session.ended:
                    self._failed.setdefault(key, f"the load failed: {error}")
                    self._region_lost |= region_unknown(error)
            if plan is not None and plan.strategy == "compute_only" and not load.failed_said:
                load.failed_said = True
                self._failed.setdefault(key, COMPUTE_ONLY)
            if load.session.ended:
                self._ended.add(key)
                self._loads.pop(key)
                self._draining.append(load)
        meta = WorkerMeta.for_rank(self.rank, resident_low=resident, ended=self._ended, failed=self._failed)
        self._ended, self._failed = set(), {}
        return None if meta.is_empty() else meta

    def load_errors(self) -> set:
        errors, self._errors = self._errors, set()
        return errors

    def shutdown(self) -> None:
        for load in list(self._loads.values()):
            self._end(load)
        self._loads.clear()
        for load, event in self._copying:
            event.synchronize()
            self._end(load)
        self._copying = []
        for load in self._draining:
            try:
                load.session.wait_ended(5.0)
            except Exception:
                pass
        self._draining = []

