"""Cake's split inside vLLM, as plain logic: no vLLM, no torch, no gRPC; docs/engines.md section 11 says how vLLM drives it.

The engine computes the front of a prompt while caked loads the back into a region window; once every
tensor-parallel rank holds the chunks [F, H) (F the computed front, H the cached end), the scheduler moves the
request's num_computed_tokens from F to H (the "jump"), vLLM allocates the blocks for [F, H) as for any prefill
chunk, and the worker copies those rows from the region into the blocks before the step's forward (the "splice").

This module holds every decision of that dance, so the vLLM-facing pieces stay thin and the logic is tested alone:
- SplitConfig and check_eligibility: which requests take the split (others keep the I/O-only load).
- SplitBook: the scheduler's per-request book. The scheduler mixin asks it jump_target()/note_jump() before vLLM's
  schedule(); the connector's build_connector_meta asks it build_step() (starts, progress, splices, cancels);
  update_connector_output hands it the workers' WorkerMeta; request_finished asks computed_chunks_to_store().
- WorkerMeta: what workers report each step (resident chunks, loads ended, failures), aggregated across ranks.
- resident_low_of, splice_rows, splice_copies: what a worker needs to report and to copy.

Units: tokens for F, H, the local hit and fronts; chunks (of chunk_tokens) for what the daemon loads and for
Progress. A chunk is a whole number of vLLM blocks (cake.vllm.namespace_for checks it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

# Why a load is cancelled or a request takes no more jumps (Cancel.reason, SplitEntry.stopped, SplitStats.cancels).
PREEMPTED = "preempted"            # vLLM freed the blocks and restarts the request from 0
FINISHED = "finished"              # finished or aborted
FRONT_PASSED = "front passed H"    # the engine computed (or scheduled) all of [0, H): the load cannot save anything
LOAD_FAILED = "load failed"        # a worker could not use its load (stream error, compute-only plan, no window...)
LOAD_ENDED = "load ended"          # a worker's load ended before the splice (the daemon or the stream gave up)
SPLICE_FAILED = "splice failed"    # the copy into the blocks failed: vLLM recomputes from the first bad block
READMITTED = "admitted again"      # the request came back to admission (preempted on a vLLM without preempted ids)
# What a worker puts in WorkerMeta.failed when the daemon's plan says to compute everything: nothing will land.
COMPUTE_ONLY = "compute_only plan"

DEFAULT_MIN_CHUNKS = 2  # one chunk to load is rarely worth a split: the jump comes a step or two late (lag)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- configuration and eligibility ----------------------------------------------------------------------------

@dataclass(frozen=True)
class SplitConfig:
    """enabled: the connector's cake_split; min_chunks: cake_split_min_chunks (the fewest chunks beyond vLLM's own
    prefix hit worth a split); chunk_tokens: cake_chunk_tokens; block_size: vLLM's; world_size: tensor-parallel
    ranks, each loading its own shard (a jump waits for all of them)."""
    enabled: bool = False
    min_chunks: int = DEFAULT_MIN_CHUNKS
    chunk_tokens: int = 256
    block_size: int = 16
    world_size: int = 1

    def __post_init__(self):
        if self.block_size <= 0 or self.chunk_tokens <= 0 or self.chunk_tokens % self.block_size:
            raise ValueError(f"cake_chunk_tokens ({self.chunk_tokens}) must be a positive multiple of vLLM's block "
                             f"size ({self.block_size})")
        if self.min_chunks < 1:
            raise ValueError(f"cake_split_min_chunks ({self.min_chunks}) must be at least 1")
        if self.world_size < 1:
            raise ValueError(f"world_size ({self.world_size}) must be at least 1")

    @property
    def ranks(self) -> range:
        return range(self.world_size)


def split_end(cached_chunks: int, num_prompt_tokens: int, chunk_tokens: int) -> int:
    """H in tokens: the cached chunks, less whole chunks until at least one prompt token is left to compute (vLLM
    samples the first output token from the last prompt token's forward, so it is never jumped over). The I/O-only
    load's end follows the same rule (cake.vllm.scheduler)."""
    if num_prompt_tokens <= 0 or cached_chunks <= 0:
        return 0
    return min(cached_chunks, (num_prompt_tokens - 1) // chunk_tokens) * chunk_tokens


@dataclass(frozen=True)
class Eligibility:
    """Whether a request takes the split; reason says why not (for a log line; the request keeps the I/O-only
    path). local and end (H) are in tokens. Truthy when eligible."""
    eligible: bool
    reason: str = ""
    local: int = 0
    end: int = 0

    def __bool__(self) -> bool:
        return self.eligible


def check_eligibility(config: SplitConfig, *, local_tokens: int, cached_chunks: int, num_prompt_tokens: int,
                      is_multimodal: bool = False, wants_prompt_logprobs: bool = False, speculative: bool = False,
                      scheduler_bound: bool = True) -> Eligibility:
    """From plain facts: local_tokens is vLLM's block-aligned local prefix hit (what get_num_new_matched_tokens is
    called with), cached_chunks what caked's Lookup found, scheduler_bound whether CakeScheduler bound the book
    (without it no one would ever jump, and the load would be wasted)."""
    end = split_end(cached_chunks, num_prompt_tokens, config.chunk_tokens)

    def no(reason):
        return Eligibility(False, reason, local_tokens, end)

    if not config.enabled:
        return no("split mode is off (cake_split)")
    if not scheduler_bound:
        return no("vLLM runs without --scheduler-cls cake.vllm.scheduler.CakeScheduler/CakeAsyncScheduler")
    # Multimodal KV depends on more than the tokens (cake.vllm keeps such requests off the cache entirely).
    if is_multimodal:
        return no("multimodal request")
    # Prompt logprobs need the logits of every prompt position: a jump skips computing [F, H).
    if wants_prompt_logprobs:
        return no("prompt logprobs requested")
    # A drafter (EAGLE, MTP) keeps its own KV, which a splice from the cache does not fill.
    if speculative:
        return no("speculative decoding")
    if local_tokens < 0 or local_tokens % config.block_size:
        return no(f"local prefix hit {local_tokens} is not block-aligned")
    to_load = end - local_tokens
    if to_load < config.min_chunks * config.chunk_tokens:
        return no(f"{max(to_load, 0)} tokens to load beyond the local hit of {local_tokens}: fewer than "
                  f"cake_split_min_chunks={config.min_chunks} chunks of {config.chunk_tokens}")
    return Eligibility(True, "", local_tokens, end)


# --- what a worker computes -----------------------------------------------------------------------------------

def resident_low_of(landed: Iterable[int], end_chunk: int) -> int:
    """The lowest chunk c such that every chunk of [c, end_chunk) landed intact: end_chunk when the top one has
    not. Computed from the chunks actually landed, not from the lowest one seen (LoadSession.loaded_low): a chunk
    that failed above lower landed ones must never be jumped over, whatever a daemon reports."""
    landed = set(landed)
    low = end_chunk
    while low > 0 and low - 1 in landed:
        low -= 1
    return low


class ChunkRows(NamedTuple):
    """Token positions [token_start, token_end) of the splice that live in `chunk`, which are rows
    [row_start, row_end) of that chunk in the region."""
    chunk: int
    token_start: int
    token_end: int
    row_start: int
    row_end: int


def splice_rows(start: int, end: int, chunk_tokens: int) -> list[ChunkRows]:
    """Per chunk c of [start // chunk, ceil(end / chunk)): the rows [max(start, c*chunk), min(end, (c+1)*chunk)).
    start (the front F) need be neither chunk- nor block-aligned: the rows below F in its chunk were computed by
    the engine and must not be overwritten (under async scheduling a step writing them may still be in flight)."""
    rows = []
    for c in range(start // chunk_tokens, _ceil_div(end, chunk_tokens)):
        lo, hi = max(start, c * chunk_tokens), min(end, (c + 1) * chunk_tokens)
        if lo < hi:
            rows.append(ChunkRows(c, lo, hi, lo - c * chunk_tokens, hi - c * chunk_tokens))
    return rows


class SpliceCopy(NamedTuple):
    """One contiguous copy: `rows` token rows from chunk `chunk` (from row chunk_row) into block `block_id` (from
    row block_row); the first of them is the prompt's token `token`."""
    chunk: int
    chunk_row: int
    block_id: int
    block_row: int
    rows: int
    token: int


def splice_copies(start: int, end: int, chunk_tokens: int, block_ids: Sequence[int], first_block: int,
                  block_size: int) -> list[SpliceCopy]:
    """The copies that put tokens [start, end) from the region's chunks into the request's blocks; block_ids[i]
    holds the request's block first_block + i. Each copy stays inside one chunk and one block."""
    copies = []
    pos = start
    while pos < end:
        chunk, block = pos // chunk_tokens, pos // block_size
        stop = min(end, (chunk + 1) * chunk_tokens, (block + 1) * block_size)
        copies.append(SpliceCopy(chunk, pos - chunk * chunk_tokens, block_ids[block - first_block],
                                 pos - block * block_size, stop - pos, pos))
        pos = stop
    return copies


# --- scheduler -> worker ---------------------------------------------------------------------------------------

class LoadKey(NamedTuple):
    """One load of one request. seq tells apart the loads of a request preempted and admitted again, so a late
    report about the first one never moves the second one's jump."""
    req_id: str
    seq: int


@dataclass(frozen=True)
class SplitStart:
    """Open a cake-mode load of the prompt's chunks [0, end_chunk) with computed_through = the entry's floor //
    chunk (the chunks of vLLM's local hit are the engine's; a forced split's, below its point, too). The connector
    adds tokens, namespace and region window."""
    req_id: str
    seq: int
    local: int
    end: int
    computed_through: int
    end_chunk: int

    @property
    def key(self) -> LoadKey:
        return LoadKey(self.req_id, self.seq)


@dataclass(frozen=True)
class Splice:
    """Copy token rows [start, end) (F to H) from the region into the request's blocks, before this step's forward.
    block_ids are the request's blocks first_block .. ceil(end / block_size) - 1."""
    req_id: str
    seq: int
    start: int
    end: int
    first_block: int
    block_ids: tuple

    @property
    def key(self) -> LoadKey:
        return LoadKey(self.req_id, self.seq)

    def rows(self, chunk_tokens: int) -> list[ChunkRows]:
        return splice_rows(self.start, self.end, chunk_tokens)

    def copies(self, chunk_tokens: int, block_size: int) -> list[SpliceCopy]:
        return splice_copies(self.start, self.end, chunk_tokens, self.block_ids, self.first_block, block_size)


@dataclass(frozen=True)
class Cancel:
    """Cancel the load (a no-op for a worker whose load already ended). reason is one of the constants above."""
    req_id: str
    seq: int
    reason: str
    detail: str = ""

    @property
    def key(self) -> LoadKey:
        return LoadKey(self.req_id, self.seq)


@dataclass
class SplitStep:
    """The split's part of one step's connector metadata. Workers apply it in this order: cancels, starts,
    progress, splices (a cancelled key is never started or spliced in the same step, see build_step)."""
    starts: list = field(default_factory=list)        # SplitStart
    progress: dict = field(default_factory=dict)      # LoadKey -> computed_through (chunks), only when it grew
    splices: list = field(default_factory=list)       # Splice
    cancels: list = field(default_factory=list)       # Cancel

    def is_empty(self) -> bool:
        return not (self.starts or self.progress or self.splices or self.cancels)


# --- worker -> scheduler ---------------------------------------------------------------------------------------

@dataclass
class WorkerMeta:
    """What the workers report after a step (vLLM's build_connector_worker_meta), merged across ranks by
    aggregate() (vLLM's KVOutputAggregator) and read by SplitBook.on_worker_meta.

    Each entry names its rank, unlike a plain per-request max: a worker reports only what changed (vLLM's
    aggregator also drops a rank's None), so a rank missing from one step's meta is not a rank with nothing
    resident; the book keeps each rank's last word and takes the max over all ranks itself, a rank that never
    reported counting as nothing resident (resident_low_over_ranks gives the same max from one meta).

    There is deliberately no __len__ (nor __bool__): vLLM keeps a worker meta only while it is truthy
    (`elif meta := kv_output.kv_connector_worker_meta:` and `aggregated or None` in KVOutputAggregator), and a
    __len__ counting, say, resident entries would make a meta that carries only `ended` or `failed` falsy and lose
    it. A worker with nothing to say returns None instead (is_empty())."""
    resident_low: dict = field(default_factory=dict)  # LoadKey -> {rank: lowest chunk of the landed suffix}
    ended: dict = field(default_factory=dict)         # LoadKey -> {ranks on which the load is over}
    failed: dict = field(default_factory=dict)        # LoadKey -> why a rank could not use it (or its splice failed)

    @classmethod
    def for_rank(cls, rank: int, resident_low: Optional[Mapping[LoadKey, int]] = None,
                 ended: Iterable[LoadKey] = (), failed: Optional[Mapping[LoadKey, str]] = None) -> "WorkerMeta":
        return cls(resident_low={LoadKey(*k): {rank: int(c)} for k, c in (resident_low or {}).items()},
                   ended={LoadKey(*k): {rank} for k in ended},
                   failed={LoadKey(*k): str(why) for k, why in (failed or {}).items()})

    def is_empty(self) -> bool:
        return not (self.resident_low or self.ended or self.failed)

    def aggregate(self, other: Optional["WorkerMeta"]) -> "WorkerMeta":
        """A new meta (neither input changes: vLLM uses the first rank's object as the accumulator and may still
        hold it): per load and rank the max of resident_low (one rank twice in one merge keeps the less resident
        word), the union of ended ranks, the union of failures."""
        merged = WorkerMeta({k: dict(v) for k, v in self.resident_low.items()},
                            {k: set(v) for k, v in self.ended.items()}, dict(self.failed))
        if other is None:
            return merged
        for key, ranks in other.resident_low.items():
            mine = merged.resident_low.setdefault(key, {})
            for rank, low in ranks.items():
                mine[rank] = max(mine.get(rank, low), low)
        for key, ranks in other.ended.items():
            merged.ended.setdefault(key, set()).update(ranks)
        for key, why in other.failed.items():
            mine = merged.failed.get(key)
            merged.failed[key] = why if mine is None or mine == why else f"{mine}; {why}"
        return merged

    def resident_low_over_ranks(self, key: LoadKey, end_chunk: int, world_size: int) -> int:
        """The max over ranks 0..world_size-1 of this meta's resident_low, a rank missing counting as end_chunk."""
        ranks = self.resident_low.get(key, {})
        return max(min(ranks.get(rank, end_chunk), end_chunk) for rank in range(world_size))


# --- the book -------------------------------------------------------------------------------------------------

class ChunkRange(NamedTuple):
    """Chunks [first, end) of a prompt (Client.store's first_chunk and chunk_count = count)."""
    first: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.first


@dataclass
class SplitStats:
    """Counts for logs, metrics and tests. tokens_spliced: prompt tokens the engine did not compute (H - F per
    splice emitted; a failed splice is counted in splice_failures, and vLLM recomputes it)."""
    added: int = 0
    started: int = 0
    jumps: int = 0
    reverts: int = 0
    splices: int = 0
    splice_failures: int = 0
    tokens_spliced: int = 0
    cancels: dict = field(default_factory=dict)  # reason -> count


@dataclass
class SplitEntry:
    """One load's page of the book (read it; only the book writes it). Tokens unless named chunks."""
    req_id: str
    seq: int
    local: int                    # vLLM's block-aligned local prefix hit
    end: int                      # H, chunk-aligned, below the prompt's end
    num_prompt_tokens: int
    chunk_tokens: int
    front: int                    # F: num_computed_tokens as the scheduler last saw or moved it
    progress: int                 # chunks [0, progress) reported computed to the daemon (never goes back)
    floor: int = 0                # the load reads no chunk below this (tokens): local, or a forced split's point
    resident_low: dict = field(default_factory=dict)  # rank -> lowest resident chunk, as last reported
    ended_ranks: set = field(default_factory=set)
    started: bool = False         # its SplitStart went out
    jumped_from: Optional[int] = None   # F at the jump; None: no jump (or a jump reverted)
    splice_emitted: bool = False
    splice_failed: bool = False
    failed: Optional[str] = None  # a worker's words
    stopped: Optional[str] = None       # why no more jumps (a reason constant)
    cancel_reason: Optional[str] = None  # a cancel to send (or sent)
    cancel_detail: str = ""
    cancel_sent: bool = False
    request_over: Optional[str] = None   # PREEMPTED, FINISHED or READMITTED: the page goes once settled

    @property
    def key(self) -> LoadKey:
        return LoadKey(self.req_id, self.seq)

    @property
    def end_chunk(self) -> int:
        return self.end // self.chunk_tokens

    @property
    def jumped(self) -> bool:
        return self.jumped_from is not None

    @property
    def cancelled(self) -> bool:
        return self.cancel_sent

    def resident_low_all(self, world_size: int) -> int:
        """Max over ranks of the lowest resident chunk; a rank that has not reported holds nothing (end_chunk)."""
        return max(self.resident_low.get(rank, self.end_chunk) for rank in range(world_size))


class SplitBook:
    """The scheduler's book of Cake split loads, keyed by request id (the current load) and by LoadKey (every load
    still to settle). Not thread-safe: vLLM's scheduler calls the mixin and the connector's scheduler half from one
    thread.

    A step, in vLLM's order:
    1. update_connector_output (previous steps' outputs; one step late, two under async scheduling): on_worker_meta.
    2. The mixin, before vLLM's schedule(): begin_step(); for each running request jump_target(); when it
       returns a value, note_jump() and set num_computed_tokens to it.
    3. vLLM schedules; its admission calls get_num_new_matched_tokens, where the connector calls
       check_eligibility() and add() (answering vLLM 0 external tokens: the engine computes from its local hit).
    4. build_connector_meta: build_step() -> SplitStep into the metadata; the mixin then sets
       has_sync_kv_loads when spliced_this_step() (the splice must run before the forward).
    5. request_finished: request_finished(req_id, num_tokens) -> the chunks to store.
    """

    def __init__(self, config: SplitConfig):
        self.config = config
        self.stats = SplitStats()
        self._entries: dict[LoadKey, SplitEntry] = {}
        self._current: dict[str, LoadKey] = {}
        self._seq = 0
        self._spliced = False

    # --- reading ------------------------------------------------------------------------------------------------
    def entry(self, req_id: str) -> Optional[SplitEntry]:
        key = self._current.get(req_id)
        return None if key is None else self._entries.get(key)

    def entries(self) -> list[SplitEntry]:
        """Every page not yet settled (the current loads and those with a cancel still to send)."""
        return list(self._entries.values())

    def __contains__(self, req_id: str) -> bool:
        return req_id in self._current

    # --- admission ----------------------------------------------------------------------------------------------
    def add(self, req_id: str, local: int, end: int, num_prompt_tokens: int, at: Optional[int] = None) -> LoadKey:
        """Records a split-eligible request at admission (check_eligibility first). The load starts in the first
        step that schedules the request: vLLM may ask again (None, a failed allocation) before it admits it, and
        each ask replaces a page not started yet. A started load still live (the request came back to admission:
        preempted on a vLLM whose SchedulerOutput has no preempted ids) is cancelled and a new one takes its place.
        at: a forced split (the benchmarks' oracle): the load reads only [at, H), so the jump comes at a front of
        at or later; chunk-aligned, local <= at < H."""
        chunk, bs = self.config.chunk_tokens, self.config.block_size
        if not (0 <= local < end < num_prompt_tokens) or end % chunk or local % bs:
            raise ValueError(f"request {req_id}: a split needs a block-aligned local hit below a chunk-aligned H "
                             f"below the prompt's end (local {local}, H {end}, prompt {num_prompt_tokens}, "
                             f"chunk {chunk}, block {bs})")
        floor = local if at is None else at
        if not (local <= floor < end) or floor % chunk and floor != local:
            raise ValueError(f"request {req_id}: a forced split at {at} must be chunk-aligned (chunk {chunk}), at or "
                             f"above the local hit {local} and below H {end}")
        old = self.entry(req_id)
        if old is not None:
            if old.started:
                self._over(old, READMITTED)
            else:
                del self._entries[old.key]
        self._seq += 1
        entry = SplitEntry(req_id, self._seq, local, end, num_prompt_tokens, chunk, front=local,
                           progress=floor // chunk, floor=floor)
        self._entries[entry.key] = entry
        self._current[req_id] = entry.key
        self.stats.added += 1
        self._settle_all()
        return entry.key

    # --- the mixin ----------------------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """The mixin calls this first in each schedule(): spliced_this_step() then speaks of this step alone."""
        self._spliced = False

    def jump_target(self, req_id: str, num_computed_tokens: int, num_prompt_tokens: int,
                    is_running: bool = True) -> Optional[int]:
        """The num_computed_tokens the mixin should set before vLLM schedules, or None to leave it.

        H (a jump) when the load is live, no jump yet, the request running and still prefilling, and every rank
        holds all of [F, H): resident_low * chunk <= F < H on each. F need not be chunk- or block-aligned.

        The jump point F (a revert) for a jump whose splice has not gone out and never can: its load failed or
        ended while vLLM did not schedule the request (budget). Nothing was allocated or computed for [F, H) then,
        so putting the counter back is exact; otherwise the request would run on blocks no one fills."""
        e = self.entry(req_id)
        if e is None or e.request_over:
            return None
        if e.jumped:
            if not e.splice_emitted and e.stopped is not None and num_computed_tokens == e.end:
                return e.jumped_from
            return None
        e.front = num_computed_tokens
        if not e.started or e.stopped is not None:
            return None
        if num_computed_tokens >= e.end:  # the front passed H without build_step seeing it (defensive)
            self._stop(e, FRONT_PASSED)
            return None
        if not is_running or num_computed_tokens >= num_prompt_tokens:
            return None
        if e.resident_low_all(self.config.world_size) * self.config.chunk_tokens <= num_computed_tokens:
            return e.end
        return None

    def note_jump(self, req_id: str, from_tokens: int, to_tokens: int) -> None:
        """The mixin moved num_computed_tokens from from_tokens to to_tokens (jump_target's answer). It leaves
        num_in_flight_tokens alone: a step computing [F - k, F) may be in flight and ends as usual; the splice
        writes only [F, H)."""
        e = self.entry(req_id)
        if e is None:
            raise ValueError(f"request {req_id} has no split load")
        if not e.jumped and to_tokens == e.end and from_tokens < to_tokens:
            e.jumped_from, e.front = from_tokens, to_tokens
            self.stats.jumps += 1
        elif e.jumped and not e.splice_emitted and from_tokens == e.end and to_tokens == e.jumped_from:
            e.jumped_from, e.front = None, to_tokens
            self.stats.reverts += 1
        else:
            raise ValueError(f"request {req_id}: {from_tokens} -> {to_tokens} is neither its jump (to H={e.end}) "
                             f"nor the revert of a pending one (jumped from {e.jumped_from})")

    def spliced_this_step(self) -> bool:
        """Whether this step's metadata carries a splice: the mixin then sets has_sync_kv_loads, so vLLM runs
        start_load_kv before the forward (vLLM PR #53333; older versions always do)."""
        return self._spliced

    # --- build_connector_meta -----------------------------------------------------------------------------------
    def build_step(self, num_scheduled_tokens: Mapping[str, int], block_ids_of: Callable[[str], Sequence],
                   computed_before: Optional[Mapping[str, int]] = None, preempted: Iterable[str] = (),
                   finished: Iterable[str] = ()) -> SplitStep:
        """Everything the workers must do this step. num_scheduled_tokens is SchedulerOutput's; computed_before
        the requests' num_computed_tokens before the step (SchedulerOutput's new and cached request data carry it;
        without it the book's own front is used); preempted and finished its preempted_req_ids and
        finished_req_ids; block_ids_of(req_id) the request's block ids (vLLM's get_block_ids, one group).

        Preempted and finished requests are marked first, so nothing is started, spliced or reported for them."""
        gone = set(preempted) | set(finished)
        for req_id in preempted:
            self._over_req(req_id, PREEMPTED)
        for req_id in finished:
            self._over_req(req_id, FINISHED)
        scheduled = [r for r, n in num_scheduled_tokens.items() if n > 0 and r not in gone]
        step = SplitStep(starts=self.starts_for_step(scheduled))
        for req_id in scheduled:
            before = None if computed_before is None else computed_before.get(req_id)
            progress = self.on_scheduled(req_id, num_scheduled_tokens[req_id], before)
            if progress is not None:
                step.progress[self._current[req_id]] = progress
        step.splices = self.splices_for_step(scheduled, block_ids_of)
        step.cancels = self.cancels_for_step()
        return step

    def starts_for_step(self, scheduled_req_ids: Iterable[str]) -> list[SplitStart]:
        """A SplitStart for each added request that vLLM scheduled this step (its first compute step)."""
        starts = []
        for req_id in scheduled_req_ids:
            e = self.entry(req_id)
            if e is None or e.started or e.request_over:
                continue
            e.started = True
            self.stats.started += 1
            starts.append(SplitStart(e.req_id, e.seq, e.local, e.end, e.floor // e.chunk_tokens, e.end_chunk))
        return starts

    def on_scheduled(self, req_id: str, num_scheduled_tokens: int,
                     num_computed_tokens: Optional[int] = None) -> Optional[int]:
        """Advances the front by this step's tokens; returns the Progress to send (chunks fully computed once this
        step runs: the front after it, rounded down), or None when it did not grow. The step may still be in
        flight when the daemon reads it; it only stops the daemon reading chunks this step computes anyway.
        None after a jump: the engine's computed prefix stays at the jump point, and the load is done with.
        A front reaching H without a jump makes the load useless: it is cancelled."""
        e = self.entry(req_id)
        if e is None or e.request_over:
            return None
        before = e.front if num_computed_tokens is None else num_computed_tokens
        e.front = before + num_scheduled_tokens
        if not e.started or e.jumped or e.stopped is not None:
            return None
        if e.front >= e.end:
            self._stop(e, FRONT_PASSED, f"front {e.front} >= H {e.end}")
            return None
        computed = e.front // e.chunk_tokens
        if computed <= e.progress:
            return None
        e.progress = computed
        return computed

    def splices_for_step(self, scheduled_req_ids: Iterable[str], block_ids_of: Callable[[str], Sequence]
                         ) -> list[Splice]:
        """A Splice for each jumped request vLLM scheduled this step (it allocated the blocks for [F, H) in this
        very schedule(), and hashed them: the splice must fill them before this step's forward). Once per jump; a
        jumped request not scheduled keeps its splice pending (no blocks exist yet, nothing reads them)."""
        bs = self.config.block_size
        splices = []
        for req_id in scheduled_req_ids:
            e = self.entry(req_id)
            if e is None or not e.jumped or e.splice_emitted or e.request_over:
                continue
            # A pending jump whose load failed since is reverted by jump_target before vLLM schedules; one
            # scheduled anyway (a mixin that did not ask) still goes out: the worker finds no load, reports the
            # blocks as load errors, and vLLM recomputes them.
            first, last = e.jumped_from // bs, _ceil_div(e.end, bs)
            block_ids = _one_group(block_ids_of(req_id))
            if len(block_ids) < last:
                # vLLM allocates [F, H + new) in the same schedule() that calls this; fewer blocks means its rules
                # changed, and running on would compute on blocks no one filled.
                raise ValueError(f"request {req_id}: {len(block_ids)} blocks after its jump to H={e.end} "
                                 f"(block size {bs}); vLLM should have allocated {last}")
            splices.append(Splice(e.req_id, e.seq, e.jumped_from, e.end, first, tuple(block_ids[first:last])))
            e.splice_emitted = True
            self.stats.splices += 1
            self.stats.tokens_spliced += e.end - e.jumped_from
        self._spliced = self._spliced or bool(splices)
        return splices

    def cancels_for_step(self, preempted: Iterable[str] = (), finished: Iterable[str] = ()) -> list[Cancel]:
        """The cancels to send this step, each load's once: preemption (vLLM freed its blocks), finish or abort,
        a front that passed H without a jump, a worker's failure (a compute-only plan among them) or a load that
        ended on a rank (the others must let go too), a splice that failed. Each also means no more jumps. A load
        whose splice went out is the worker's to release after its copy: finishing or preempting it sends none.
        Pages of requests that are over go once nothing is left to send."""
        for req_id in preempted:
            self._over_req(req_id, PREEMPTED)
        for req_id in finished:
            self._over_req(req_id, FINISHED)
        cancels = []
        for e in self._entries.values():
            if e.cancel_reason is not None and not e.cancel_sent:
                e.cancel_sent = True
                cancels.append(Cancel(e.req_id, e.seq, e.cancel_reason, e.cancel_detail))
                self.stats.cancels[e.cancel_reason] = self.stats.cancels.get(e.cancel_reason, 0) + 1
        self._settle_all()
        return cancels

    # --- update_connector_output --------------------------------------------------------------------------------
    def on_worker_meta(self, meta: Optional[WorkerMeta]) -> None:
        """Takes the workers' reports (aggregated across ranks), which arrive a step or two late. Robust to that:
        a report about a load the book no longer holds (ended, or an earlier load of a request admitted again) is
        ignored; per rank, resident_low only goes down (landed chunks stay in the window until the load ends, and
        an older report arriving twice or late must not undo a newer one); ranks outside the world are ignored."""
        if meta is None:
            return
        world = self.config.world_size
        for key, ranks in meta.resident_low.items():
            e = self._entries.get(LoadKey(*key))
            if e is None:
                continue
            for rank, low in ranks.items():
                if 0 <= rank < world:
                    low = max(0, min(int(low), e.end_chunk))
                    e.resident_low[rank] = min(e.resident_low.get(rank, low), low)
        for key, ranks in meta.ended.items():
            e = self._entries.get(LoadKey(*key))
            if e is None:
                continue
            e.ended_ranks.update(r for r in ranks if 0 <= r < world)
            # After a splice (released after the copy) or our own cancel, a load's end is the expected one.
            if not e.splice_emitted and not e.cancel_sent:
                self._stop(e, LOAD_ENDED, f"on rank(s) {sorted(ranks)}")
        for key, why in meta.failed.items():
            e = self._entries.get(LoadKey(*key))
            if e is None:
                continue
            e.failed = why if e.failed is None else e.failed
            if e.splice_emitted:
                # Conservative: a load failure reported late (lag) may predate a splice that worked; storing fewer
                # chunks costs a later miss, storing a bad one would hand wrong KV to other requests.
                if not e.splice_failed:
                    e.splice_failed = True
                    self.stats.splice_failures += 1
                self._stop(e, SPLICE_FAILED, why)
            elif not e.cancel_sent:
                self._stop(e, LOAD_FAILED, why)
        self._settle_all()

    # --- request_finished ---------------------------------------------------------------------------------------
    def computed_chunks_to_store(self, req_id: str, num_tokens: int) -> list[ChunkRange]:
        """The full chunks this engine computed of the first num_tokens prompt tokens (what the request's blocks
        hold as the scheduler sees it): [0, F_jump) and [H, num_tokens) after a splice, which brought [F_jump, H)
        from the cache; all of them without a jump. After a failed splice only [0, F_jump): what follows was
        computed on the bad rows unless vLLM recomputed them (it does only from 00f4240e on), and a cache must never
        hand wrong KV on. A jump whose splice never went out (the request finished first) computed only [0, F)."""
        chunk = self.config.chunk_tokens
        full = max(num_tokens, 0) // chunk
        e = self.entry(req_id)
        if e is None or not e.jumped:
            return [ChunkRange(0, full)] if full else []
        ranges = []
        below = min(e.jumped_from, num_tokens) // chunk
        if below:
            ranges.append(ChunkRange(0, below))
        if e.splice_emitted and not e.splice_failed and full > e.end_chunk:
            ranges.append(ChunkRange(e.end_chunk, full))
        return ranges

    def request_finished(self, req_id: str, num_tokens: Optional[int] = None) -> list[ChunkRange]:
        """The request finished or was aborted (vLLM's request_finished): its live load is cancelled in the next
        step (finished_req_ids would do it too; either is fine), and its page goes once settled. With num_tokens,
        returns computed_chunks_to_store(req_id, num_tokens) first: one call, so the store decision is never asked
        of a book that has already let the page go (it would then store a pending jump's unfilled blocks)."""
        ranges = [] if num_tokens is None else self.computed_chunks_to_store(req_id, num_tokens)
        self._over_req(req_id, FINISHED)
        return ranges

    # --- internals ----------------------------------------------------------------------------------------------
    def _stop(self, e: SplitEntry, reason: str, detail: str = "") -> None:
        """No more jumps; and a cancel unless none is needed: the load never started, it was cancelled already,
        every rank reported it over, or its splice went out and the worker releases it (a failed splice still
        gets one: a rank whose copy worked may hold on otherwise)."""
        if e.stopped is None:
            e.stopped = reason
        if not e.started or e.cancel_sent or e.cancel_reason is not None:
            return
        if len(e.ended_ranks) >= self.config.world_size:
            return
        if e.splice_emitted and reason != SPLICE_FAILED:
            return
        e.cancel_reason, e.cancel_detail = reason, detail

    def _over_req(self, req_id: str, why: str) -> None:
        e = self.entry(req_id)
        if e is not None:
            self._over(e, why)

    def _over(self, e: SplitEntry, why: str) -> None:
        if e.request_over is None:
            e.request_over = why
        self._stop(e, why)
        if self._current.get(e.req_id) == e.key:
            # The request id is free for a new load at once; the page itself stays, by key, until its cancel is
            # sent (entries(), late worker reports).
            del self._current[e.req_id]
        self._settle_all()

    def _settle_all(self) -> None:
        for key in [k for k, e in self._entries.items()
                    if e.request_over is not None and (e.cancel_reason is None or e.cancel_sent)]:
            del self._entries[key]


def _one_group(block_ids) -> list:
    """vLLM's get_block_ids gives a tuple of lists, one per KV cache group; the split (as cake.vllm) takes one."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        if len(block_ids) != 1:
            raise ValueError(f"{len(block_ids)} KV cache groups: the Cake split supports one")
        return list(block_ids[0])
    return list(block_ids)
