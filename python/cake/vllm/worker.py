"""The connector's worker half: the region, the I/O-only loads and the stores of each step, and the split's loads.

_WorkerSide (in each worker's CakeConnector): an I/O-only Load of the chunks into a region of the daemon's (device
memory over CUDA IPC when the KV cache is on a GPU, host shared memory otherwise), then one scatter of the chunks'
tokens into vLLM's blocks (scatter_rows), in the layout the attention backend writes (cake.vllm.layout). Chunks
that fail to load become load errors on their blocks, which vLLM recomputes. A finished request's prompt chunks are
gathered out of its held blocks into the region and Stored.

SplitWorker (the split's worker half, when cake_split is on): it opens a cake-mode Load per SplitStart into a window
of its own region (one window per load, so loads of several requests run side by side), sends Progress, copies the
rows [F, H) from the region into the request's blocks in start_load_kv before the step's forward (the splice, the
same scatter_rows), releases a load only once that copy is done (after a CUDA event on a GPU), and reports what
landed.

Nothing here imports vLLM; torch only where a worker copies.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from cake.engine_config import parse_flag
from cake.layout import ChunkLayout
from cake.namespace import Namespace
from cake.regions import RegionClaim
from cake.split import COMPUTE_ONLY, ChunkRows, LoadKey, WorkerMeta, resident_low_of
from cake.vllm.config import extra_config, namespace_for, tensor_parallel_rank, with_model_id
from cake.vllm.data import LoadSpec, SplitMetadata, StoreSpec
from cake.vllm.layout import Geometry, LayoutError, PagedLayer, learn_layers, writer_of
from cake.vllm.log import RegionSlot, forget_all, log, once, region_unknown


def scatter_rows(layers: Sequence[PagedLayer], pieces: Sequence[tuple], block_ids: Sequence[int], block_size: int,
                 device, first_block: int = 0) -> None:
    """Copies token rows out of chunks in a region into vLLM's paged KV cache. pieces: (chunk view [layers, 2,
    tokens, heads, dim], cake.split.ChunkRows) of each run of rows, whose token positions go to the slots of
    block_ids (the request's blocks first_block, first_block + 1, ...).

    One scatter of K and one of V per layer over all the pieces: the rows of every chunk are gathered first (one
    torch.cat each, a single kernel), since a scatter per chunk per layer costs a kernel launch and its index
    tensors each, thousands for a long prefix (on an H200 that ran at 17 to 31 GB/s, docs/benchmarks.md section 14).
    """
    import torch
    if not pieces:
        return
    positions = torch.cat([torch.arange(rows.token_start, rows.token_end) for _, rows in pieces])
    blocks = torch.tensor(list(block_ids), dtype=torch.int64)[positions // block_size - first_block].to(device)
    offsets = (positions % block_size).to(device)
    for index, layer in enumerate(layers):
        k = _joined([view[index, 0, rows.row_start:rows.row_end] for view, rows in pieces])
        v = _joined([view[index, 1, rows.row_start:rows.row_end] for view, rows in pieces])
        layer.write(blocks, offsets, k.to(layer.cache.dtype), v.to(layer.cache.dtype))


def _joined(parts: list):
    import torch
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# --- the I/O-only loads and the stores -----------------------------------------------------------------------

class _WorkerSide:
    """The region, the loads and stores of each step, and what get_finished and the load errors report."""

    def __init__(self, vllm_config, client):
        extra = extra_config(vllm_config)
        self.vllm_config = vllm_config
        self.client = client
        self.ns = namespace_for(vllm_config, tp_rank=tensor_parallel_rank())
        self.layout = ChunkLayout.of(self.ns)
        self.region_chunks = int(extra.get("cake_region_chunks", 64))
        self.region_wait_s = float(extra.get("cake_region_wait_s", 1.0))
        self.layers: list = []
        self.region_slot: Optional[RegionSlot] = None  # made with the KV caches
        self.retry_s = float(extra.get("cake_region_retry_s", 1.0))
        self._region_claim = RegionClaim()  # one load or store uses the region at a time
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="cake-transfer")
        self._lock = threading.Lock()
        self._recved, self._sent, self._errors = set(), set(), set()
        self.split_enabled = parse_flag(extra.get("cake_split", False), "cake_split")
        self.split_region_chunks = int(extra.get("cake_split_region_chunks", self.region_chunks))
        self.split: Optional[SplitWorker] = None  # made with the KV caches

    def register_kv_caches(self, kv_caches: dict) -> None:
        """Learns each layer's layout from its attention backend and proves it (cake.vllm.layout), then registers
        the regions. A layout the connector cannot prove is refused here, before any byte is loaded or stored."""
        if len(kv_caches) != self.ns.num_layers:
            raise ValueError(f"{len(kv_caches)} KV caches were registered; the model has {self.ns.num_layers} "
                             "attention layers (hybrid, sliding-window and MLA models are not supported yet)")
        self.block_size = int(self.vllm_config.cache_config.block_size)
        compilation = getattr(self.vllm_config, "compilation_config", None)
        context = getattr(compilation, "static_forward_context", None) or {}
        writers = {name: writer_of(context.get(name), cache) for name, cache in kv_caches.items()}
        cache_config = self.vllm_config.cache_config
        geometry = Geometry(block_size=self.block_size, heads=self.ns.num_kv_heads, head_dim=self.ns.head_dim,
                            model_dtype=self.vllm_config.model_config.dtype,
                            cache_dtype=str(getattr(cache_config, "cache_dtype", "auto")))
        try:
            self.layers = learn_layers(kv_caches, geometry, {n: w for n, w in writers.items() if w is not None})
        except LayoutError as error:
            log.error("caked's connector refuses this KV cache: %s", error)
            raise
        first = self.layers[0]
        log.info("caked's connector learned the KV cache layout from the attention backend and proved it on %d "
                 "layers (%s)", len(self.layers), first.kind)
        self.device = first.cache.device
        # Device memory where the daemon serves it (CUDA IPC), host shared memory otherwise. The ordinal is this
        # process's: under CUDA_VISIBLE_DEVICES it must be the daemon's numbering too (docs/engines.md).
        # A daemon that is down now, restarts later or lets a region lapse while unreachable costs the cache, never
        # the engine: the slots register their regions (again) when they can (cake.vllm.log.RegionSlot).
        kind = "auto" if self.device.type == "cuda" else "host"
        self.region_slot = RegionSlot(self.client, self.region_chunks * self.ns.chunk_bytes, kind,
                                      self.device.index or 0, "load and store", self.retry_s)
        self.region_slot.get()
        if self.split_enabled:
            # The split's loads run while the engine computes, several at once, each in a window of its own: a
            # region of their own, so an I/O-only load or a store never waits behind them.
            split_slot = RegionSlot(self.client, self.split_region_chunks * self.ns.chunk_bytes, kind,
                                    self.device.index or 0, "split", self.retry_s)
            split_slot.get()
            self.split = SplitWorker(self.client, self.ns, split_slot, self.ns.tp_rank, self.block_size,
                                     self.layers, self.device, self._chunk_view)

    def _chunk_view(self, index: int, region):
        """Chunk slot `index` of the region as [layers, 2, tokens, heads, dim] of the namespace's dtype."""
        return self.layout.chunk(region.torch(), index * self.ns.chunk_bytes)

    def _namespace_of(self, model_id: str) -> Namespace:
        """This rank's namespace under a request's model id (LoRA adapter, cache salt)."""
        return with_model_id(self.ns, model_id)

    def _slots(self, block_ids: list, first: int, last: int) -> tuple:
        import torch
        positions = torch.arange(first, last)
        blocks = torch.tensor(block_ids, dtype=torch.int64)[positions // self.block_size]
        return blocks.to(self.device), (positions % self.block_size).to(self.device)

    def _blocks_of(self, spec: LoadSpec, first: int, last: int) -> set:
        bs = self.block_size
        return set(spec.block_ids[first // bs:(last + bs - 1) // bs]) if last > first else set()

    def _sync(self, region) -> None:
        # Copies into or out of a device region run on the current stream: done before the region is reused
        # (another load) or read by the daemon (Store).
        if self.device.type == "cuda" or getattr(region, "kind", "host") == "cuda":
            import torch
            torch.cuda.synchronize(self.device if self.device.type == "cuda" else None)

    def _load(self, spec: LoadSpec) -> None:
        """Loads chunks of [spec.start, spec.end) into the region and scatters their tokens into the blocks, once
        the load has ended. The tokens that did not arrive (read failures, chunks evicted since the lookup, a window
        too small) make their blocks load errors: vLLM recomputes from the first."""
        chunk = self.ns.chunk_tokens

        def load_into(region):
            """The loaded tokens, [lo, hi): the daemon reports a suffix of the cached chunks."""
            valid = (spec.end, spec.end)
            pieces = []
            with self.client.load(self._namespace_of(spec.model_id), tokens=spec.tokens, region=region,
                                  mode="io_only", computed_through=spec.start // chunk) as load:
                for event in load:
                    first = event.chunk * chunk
                    lo, hi = max(spec.start, first), min(spec.end, first + chunk)
                    if lo < hi:
                        view = self._chunk_view(event.region_offset // self.ns.chunk_bytes, region)
                        pieces.append((view, ChunkRows(event.chunk, lo, hi, lo - first, hi - first)))
                scatter_rows(self.layers, pieces, spec.block_ids, self.block_size, self.device)
                plan = load.plan
                if load.loaded_low < plan.cached_chunks:
                    valid = (max(spec.start, load.loaded_low * chunk), min(spec.end, plan.cached_chunks * chunk))
                self._sync(region)  # the scatter has read the region before the region is let go
                load.release()
            return valid

        valid = (spec.end, spec.end)  # nothing loaded, until the load says otherwise
        try:
            valid = self._with_region(load_into, "load of request %s failed, vLLM recomputes it",
                                      spec.request_id) or valid
        finally:
            failed = self._blocks_of(spec, spec.start, valid[0]) | self._blocks_of(spec, valid[1], spec.end)
            with self._lock:
                self._errors |= failed
                if spec.is_async:
                    self._recved.add(spec.request_id)

    def _store(self, spec: StoreSpec) -> None:
        chunk = self.ns.chunk_tokens

        def store_from(region):
            ranges = spec.ranges or [(0, len(spec.tokens) // chunk)]
            batches = [(first, min(end, first + self.region_chunks)) for lo, end in ranges
                       for first in range(lo, end, self.region_chunks)]
            for first, end in batches:
                for i in range(end - first):
                    lo = (first + i) * chunk
                    blocks, offsets = self._slots(spec.block_ids, lo, lo + chunk)
                    view = self._chunk_view(i, region)
                    for layer_index, layer in enumerate(self.layers):
                        k, v = layer.read(blocks, offsets)
                        view[layer_index, 0].copy_(k)
                        view[layer_index, 1].copy_(v)
                self._sync(region)  # the gather has written the region before the daemon reads it
                self.client.store(self._namespace_of(spec.model_id), tokens=spec.tokens, first_chunk=first,
                                  chunk_count=end - first, region=region)

        try:
            self._with_region(store_from, "store of request %s failed (the cache stays without it)", spec.request_id)
        finally:
            with self._lock:
                self._sent.add(spec.request_id)
    def _with_region(self, work: Callable, what: str, request_id: str):
        """work(region) under the region claim (one load or store uses the region at a time). A region the daemon
        no longer holds (NOT_FOUND: it restarted, or the lease ran out while it was unreachable) is registered again
        and the work tried once more, so the first transfer after a restart works. Any failure is logged (once per
        kind of failure) and gives None."""
        try:
            with self._region_claim.claimed(self.region_wait_s) as claimed:
                if not claimed:
                    raise TimeoutError(f"the region stayed in use by another transfer for {self.region_wait_s} s")
                for attempt in (0, 1):
                    region = self.region_slot.get()
                    if region is None:
                        raise RuntimeError("no region: caked could not be reached to register one")
                    try:
                        result = work(region)
                    except Exception as error:
                        if attempt == 0 and region_unknown(error):
                            self.region_slot.lost()  # under the claim: nobody else uses the region
                            continue
                        raise
                    self._transfer_worked()
                    return result
        except Exception as error:  # anything: the request must still be reported (and its blocks given back)
            reason = "region" if region_unknown(error) else getattr(getattr(error, "code", None), "name", None) \
                or type(error).__name__
            once(logging.WARNING, f"transfer:{reason}", "caked " + what + ": %s (said once for this kind of "
                 "failure, until a transfer works again)", request_id, error)
            log.debug("caked " + what + ": %s", request_id, error)
        return None

    @staticmethod
    def _transfer_worked() -> None:
        if forget_all("transfer:"):
            log.info("caked's connector: loads and stores work again")

    def start_load_kv(self, metadata) -> None:
        if metadata is None:
            return
        if self.split is not None:
            # Splices first: vLLM runs this step's forward on those blocks right after (has_sync_kv_loads).
            self.split.apply(getattr(metadata, "split", None), self._namespace_of)
        for spec in metadata.stores:
            self._pool.submit(self._store, spec)
        for spec in metadata.loads:
            if spec.is_async:
                self._pool.submit(self._load, spec)
            else:
                self._load(spec)  # vLLM computes this step on top of it: it must be in the blocks first

    def get_finished(self, finished_req_ids) -> tuple:
        with self._lock:
            sent, recved = self._sent, self._recved
            self._sent, self._recved = set(), set()
        return (sent or None), (recved or None)

    def get_block_ids_with_load_errors(self) -> set:
        with self._lock:
            errors, self._errors = self._errors, set()
        if self.split is not None:
            errors |= self.split.load_errors()
        return errors

    def build_connector_worker_meta(self) -> Optional[WorkerMeta]:
        return None if self.split is None else self.split.meta()

    def shutdown(self) -> None:
        if self.split is not None:
            self.split.shutdown()
        self._pool.shutdown(wait=True)


# --- the split's worker half ----------------------------------------------------------------------------------

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
    are cake.vllm.layout's PagedLayer of each registered KV cache; `slot` the worker's split region
    (cake.vllm.log.RegionSlot: registered again when the daemon has lost it)."""

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

    def _copy_rows(self, load: _Load, splice, rows: list) -> None:
        chunk_bytes = self.ns.chunk_bytes
        pieces = [(self._chunk_view(load.session.region_offset(r.chunk) // chunk_bytes, load.region), r) for r in rows]
        scatter_rows(self.layers, pieces, splice.block_ids, self.block_size, self.device,
                     first_block=splice.first_block)

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

