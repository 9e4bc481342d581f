"""TorchPrefillEngine: one prompt's prefill in each of the ways Cake compares, against a real caked.

The engine keeps its KV cache as one tensor [layers, 2, tokens, kv_heads, head_dim] (on the CPU or a CUDA
device) and uses a registered region as the staging area the daemon loads into and stores from: a loaded chunk
is spliced into the cache from the region with one copy (`cake.ChunkLayout` gives the view), as an engine with
paged KV would scatter it into its blocks. On CUDA the region is device memory opened over IPC and the splices
run on a side stream; Release waits for that stream, so the daemon never reuses memory a copy still reads."""
import time
from dataclasses import dataclass, field
from typing import List, Optional

import torch

import cake


def same_bits(a, b):
    """Whether two tensors hold the same bits (torch.equal would call -0.0 and 0.0 equal, and NaN unequal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@dataclass
class PrefillResult:
    mode: str
    ttft_s: float
    logits: torch.Tensor
    strategy: str = "none"
    meeting_chunk: int = 0           # chunks [0, meeting) computed, [meeting, cached) loaded
    computed_chunks: int = 0
    loaded_chunks: int = 0
    failed_chunks: int = 0
    predicted_meeting_chunk: Optional[int] = None
    chunk_compute_s: List[float] = field(default_factory=list)

    @property
    def first_token(self):
        return int(torch.argmax(self.logits))


def fit_chunk_times(seconds):
    """Least-squares first + growth * index over per-chunk times, both clamped at zero (a noisy fit can go
    negative, which the daemon refuses as a hint)."""
    n = len(seconds)
    if n == 0:
        return 0.0, 0.0
    if n == 1:
        return max(seconds[0], 0.0), 0.0
    sx = sum(range(n))
    sxx = sum(i * i for i in range(n))
    sy = sum(seconds)
    sxy = sum(i * s for i, s in enumerate(seconds))
    growth = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    first = (sy - growth * sx) / n
    return max(first, 0.0), max(growth, 0.0)


class TorchPrefillEngine:
    def __init__(self, model, prompt, chunk_tokens, client=None, region_kind="host", tenant=""):
        self.model = model
        self.prompt = list(prompt)
        self.chunk_tokens = chunk_tokens
        self.client = client
        c = model.config
        self.ns = cake.Namespace(model.model_id(), num_layers=c.layers, num_kv_heads=c.kv_heads, head_dim=c.head_dim,
                                 dtype=c.dtype, chunk_tokens=chunk_tokens, tenant=tenant)
        self.layout = cake.ChunkLayout.of(self.ns)
        self.full_chunks = len(self.prompt) // chunk_tokens
        self.total_chunks = -(-len(self.prompt) // chunk_tokens)  # the partial tail chunk counts here
        self.cache = model.new_cache(len(self.prompt))
        self.on_cuda = model.device.type == "cuda"
        self.side_stream = torch.cuda.Stream(model.device) if self.on_cuda else None
        self.hint = (0.0, 0.0)
        self.draining = None  # the last load, released, whose stream may still be ending (reads draining)
        self.region = None
        if client is not None and self.full_chunks > 0:
            self.region = client.register_region(self.full_chunks * self.ns.chunk_bytes, kind=region_kind,
                                                 device=model.device.index or 0)
            self.region_bytes = self.region.torch()

    def _wait_window_free(self):
        if self.draining is not None:
            session, self.draining = self.draining, None
            session.wait_ended()

    def close(self):
        self._wait_window_free()
        if self.region is not None:
            self.region_bytes = None
            self.client.release_region(self.region)
            self.region = None

    # --- compute ----------------------------------------------------------------------------------------------
    def _sync(self):
        if self.on_cuda:
            torch.cuda.current_stream(self.model.device).synchronize()

    def compute_chunk(self, c, result):
        start = c * self.chunk_tokens
        began = time.perf_counter()
        self.model.forward(self.prompt[start:start + self.chunk_tokens], start, self.cache)
        self._sync()  # progress must mean "computed", and the per-chunk time must be the chunk's
        result.chunk_compute_s[c] = time.perf_counter() - began
        result.computed_chunks += 1

    def _finish(self, result, started):
        result.logits = self.model.first_token_logits(self.prompt, self.cache)
        self._sync()
        result.ttft_s = time.perf_counter() - started
        return result

    def _new_result(self, mode):
        self.cache.zero_()  # outside the timing: what the run leaves is only what it computed or loaded
        self._sync()
        return PrefillResult(mode=mode, ttft_s=0.0, logits=torch.empty(0),
                             chunk_compute_s=[0.0] * self.total_chunks)

    def compute_only(self):
        result = self._new_result("compute-only")
        started = time.perf_counter()
        for c in range(self.total_chunks):
            self.compute_chunk(c, result)
        result.meeting_chunk = self.full_chunks
        return self._finish(result, started)

    def set_hint_from(self, result):
        """The daemon's compute hint from a run's measured per-chunk times (full chunks only)."""
        self.hint = fit_chunk_times(result.chunk_compute_s[:self.full_chunks])
        return self.hint

    # --- with the daemon ------------------------------------------------------------------------------------
    def store(self):
        """Copies the full chunks from the cache into the region and stores them: what the first request does
        after computing. The region may be reused when store() returns (the daemon has copied the bytes)."""
        self._wait_window_free()  # a read still draining into the region would overwrite what is stored
        for c in range(self.full_chunks):
            self._chunk_view(c).copy_(self.cache[:, :, c * self.chunk_tokens:(c + 1) * self.chunk_tokens])
        self._sync()
        return self.client.store(self.ns, tokens=self.prompt, first_chunk=0, chunk_count=self.full_chunks,
                                 region=self.region)

    def _chunk_view(self, c, offset=None):
        return self.layout.chunk(self.region_bytes, c * self.ns.chunk_bytes if offset is None else offset)

    def _splice(self, event):
        """Chunk event.chunk, landed in the region, into its rows of the cache."""
        rows = self.cache[:, :, event.chunk * self.chunk_tokens:(event.chunk + 1) * self.chunk_tokens]
        source = self._chunk_view(event.chunk, event.region_offset)
        if self.on_cuda:
            with torch.cuda.stream(self.side_stream):
                rows.copy_(source, non_blocking=True)
        else:
            rows.copy_(source)

    def io_only(self):
        return self._with_daemon("I/O-only", mode="io_only")

    def cake(self):
        return self._with_daemon("Cake", mode="cake")

    def fixed_split(self, split):
        """The engine computes [0, split) while the daemon loads [split, H) with all its bandwidth."""
        return self._with_daemon(f"split {split}", mode="io_only", split=min(split, self.full_chunks))

    def _with_daemon(self, name, mode, split=0):
        if self.client is None:
            raise RuntimeError("loads need a client")
        self._wait_window_free()  # the previous load's window (the same region) must be free first
        result = self._new_result(name)
        hints = {}
        if mode == "cake":
            hints = {"compute_first_chunk_s": self.hint[0], "compute_growth_s": self.hint[1]}
        started = time.perf_counter()
        spliced = set()
        with self.client.load(self.ns, tokens=self.prompt, region=self.region, mode=mode, computed_through=split,
                              **hints) as session:
            plan = session.wait_plan()
            result.strategy = plan.strategy
            result.predicted_meeting_chunk = plan.predicted_meeting_chunk
            cached = plan.cached_chunks
            computed = 0
            landed = 0  # how many of the session's ChunkLoaded this engine has looked at

            def splice_landed(above):
                nonlocal landed
                events = session.loaded_since(landed)
                landed += len(events)
                for event in events:
                    if event.chunk > above and event.chunk not in spliced:
                        self._splice(event)
                        spliced.add(event.chunk)

            if mode == "cake":
                # Compute forward while the daemon loads backward, until the session says stop. This engine's
                # cost of each chunk (its hint) makes it wait on the loads' pace so far rather than at the
                # predicted meeting: it waits whenever they land on its next chunk sooner than computing it takes.
                while True:
                    step = session.next_step(computed, compute_s=self.hint[0] + self.hint[1] * computed)
                    if step.action == "stop":
                        break
                    splice_landed(computed)
                    if step.action == "wait":
                        session.wait_resident(computed, timeout=max(0.0, step.until - time.monotonic()))
                        continue
                    self.compute_chunk(computed, result)
                    computed += 1
                    session.progress(computed)
            else:
                for computed in range(max(split, min(plan.lowest_loadable, cached))):
                    self.compute_chunk(computed, result)
                computed = max(split, min(plan.lowest_loadable, cached))
                # The engine is idle now: splice each chunk as it lands, overlapping the copies with the loads.
                for event in session:
                    if event.chunk >= computed and event.chunk not in spliced:
                        self._splice(event)
                        spliced.add(event.chunk)
            done = session.wait_done()
            result.meeting_chunk = done.meeting_chunk
            result.loaded_chunks = done.loaded_chunks
            result.failed_chunks = done.failed_chunks
            # Failed reads move the meeting up: the engine computes up to it.
            for c in range(computed, done.meeting_chunk):
                self.compute_chunk(c, result)
            computed = max(computed, done.meeting_chunk)
            splice_landed(computed - 1)
            for c in range(computed, cached):
                if c not in spliced:  # reported before this engine looked: splice it now
                    self._splice(session.chunk(c))
                    spliced.add(c)
            if self.on_cuda:
                self.side_stream.synchronize()  # Release frees the window: no copy may still read it
            # Everything needed is copied out: release without waiting for reads this prefill no longer needs
            # (one in flight when the engine passed it) to drain; the next load waits for that.
            session.release(wait=False)
            self.draining = session
        if self.on_cuda:
            torch.cuda.current_stream(self.model.device).wait_stream(self.side_stream)
        # The uncached suffix (and the partial tail chunk) needs every earlier row, loaded ones included.
        for c in range(max(computed, cached), self.total_chunks):
            self.compute_chunk(c, result)
        return self._finish(result, started)
