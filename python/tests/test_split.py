"""cake.split alone: the Cake split's logic in vLLM (eligibility, the scheduler's book, the jump, what workers
splice, cancel and report), with no vLLM, torch or daemon. The scenario tests drive the book in the order vLLM
calls it (update_connector_output, the mixin's pre-pass, schedule, build_connector_meta, the worker's step) with
chunks landing on a script per rank and worker reports arriving one step late (two under async scheduling); a
position's "KV" is usable only once computed or spliced, and computing a token needs every position before it, so
a missing or misplaced splice fails the run."""
import functools
import pickle
import sys

import pytest

from cake import split
from cake.split import (COMPUTE_ONLY, FINISHED, FRONT_PASSED, LOAD_ENDED, LOAD_FAILED, PREEMPTED, READMITTED,
                        SPLICE_FAILED, Cancel, ChunkRange, ChunkRows, LoadKey, SpliceCopy, SplitBook,
                        SplitConfig, SplitStep, WorkerMeta, check_eligibility, resident_low_of, splice_copies,
                        splice_rows, split_end)

CHUNK, BLOCK = 32, 16


def config(world=1, min_chunks=1, chunk=CHUNK, block=BLOCK):
    return SplitConfig(enabled=True, min_chunks=min_chunks, chunk_tokens=chunk, block_size=block, world_size=world)


def block_table(req_id, count=64):
    return list(range(1000, 1000 + count))  # block i of the request is block id 1000 + i


def started(world=1, local=0, end=256, n=400, req_id="r"):
    """A book holding one load whose SplitStart went out."""
    book = SplitBook(config(world))
    key = book.add(req_id, local, end, n)
    assert book.starts_for_step([req_id])
    return book, key


# --- the harness ----------------------------------------------------------------------------------------------

class Sim:
    """One request through the book in vLLM's call order. lands[rank][chunk] is the step at which the chunk lands
    on that rank (absent: never, a failed or corrupt read); the daemon never reads a chunk reported computed.
    lag: steps until a step's worker meta reaches the scheduler (1 sync, 2 async scheduling)."""

    def __init__(self, n=320, local=0, cached_chunks=9, budget=CHUNK, world=1, lands=None, lag=1, apply_splices=True):
        self.cfg = config(world)
        self.book = SplitBook(self.cfg)
        self.n, self.budget, self.lag, self.world = n, budget, lag, world
        self.apply_splices = apply_splices
        self.rid = "r"
        eligibility = check_eligibility(self.cfg, local_tokens=local, cached_chunks=cached_chunks,
                                        num_prompt_tokens=n)
        assert eligibility, eligibility.reason
        self.H, self.local = eligibility.end, local
        self.key = self.book.add(self.rid, local, self.H, n)
        self.F = local                       # the request's num_computed_tokens
        self.running = True
        self.computed = [0] * n
        self.spliced = [0] * n
        self.lands = lands or {}
        self.landed = {rank: set() for rank in range(world)}
        self.load_live = False
        self.load_cancelled = False
        self.daemon_progress = 0
        self.in_flight = []                  # (step whose update_connector_output delivers it, meta)
        self.step_no = 0
        self.steps = []
        self.jumps = []
        self.blocks = []

    def filled(self, p):
        return p < self.local or self.computed[p] or self.spliced[p]

    def step(self, budget=None, preempt=False):
        s = self.step_no
        # update_connector_output: the outputs that have come back by now.
        for meta in [m for at, m in self.in_flight if at <= s]:
            self.book.on_worker_meta(meta)
        self.in_flight = [(at, m) for at, m in self.in_flight if at > s]
        # CakeSchedulerMixin.schedule's pre-pass.
        self.book.begin_step()
        if self.running:
            target = self.book.jump_target(self.rid, self.F, self.n)
            if target is not None:
                self.book.note_jump(self.rid, self.F, target)
                self.jumps.append((s, self.F, target))
                self.F = target
        # vLLM's schedule(): a preemption frees the blocks and restarts the request from 0.
        preempted = []
        k = 0
        if preempt:
            self.running, self.F, self.blocks, preempted = False, 0, [], [self.rid]
        elif self.running:
            k = max(0, min(self.budget if budget is None else budget, self.n - self.F))
            while len(self.blocks) * BLOCK < self.F + k:
                self.blocks.append(1000 + len(self.blocks))
        step = self.book.build_step({self.rid: k} if k else {}, lambda r: (list(self.blocks),), {self.rid: self.F},
                                    preempted=preempted)
        self.steps.append(step)
        self.execute(step, k)
        self.F += k
        self.step_no += 1
        return step

    def execute(self, step, k):
        """The worker, every rank alike (the metadata is the same): cancels, starts, progress, splices, forward."""
        for cancel in step.cancels:
            assert cancel.key == self.key
            self.load_live, self.load_cancelled = False, True
        for start in step.starts:
            assert (start.key, start.local, start.end) == (self.key, self.local, self.H)
            self.load_live, self.daemon_progress = True, start.computed_through
        for key, progress in step.progress.items():
            assert key == self.key and progress > self.daemon_progress
            self.daemon_progress = progress
        for splice in step.splices:
            assert self.load_live and splice.key == self.key
            for rows in splice.rows(CHUNK):
                for rank in range(self.world):
                    assert rows.chunk in self.landed[rank], f"splice of chunk {rows.chunk} not landed on {rank}"
            for copy in splice.copies(CHUNK, BLOCK):
                for i in range(copy.rows):
                    token = copy.token + i
                    assert copy.block_id == self.blocks[token // BLOCK] and copy.block_row + i == token % BLOCK
                    assert copy.chunk_row + i == token - copy.chunk * CHUNK
                    if self.apply_splices:
                        self.spliced[token] += 1
            self.load_live = False  # released once the copy is done
        for p in range(self.F, self.F + k):
            assert all(self.filled(q) for q in range(p)), f"token {p} computed on KV no one filled"
            self.computed[p] += 1
        # The loads land during the step; the worker meta after it.
        metas = []
        for rank in range(self.world):
            if self.load_live:
                for chunk, at in self.lands.get(rank, {}).items():
                    if at <= self.step_no and chunk >= self.daemon_progress:
                        self.landed[rank].add(chunk)
            low = resident_low_of(self.landed[rank], self.H // CHUNK)
            metas.append(WorkerMeta.for_rank(rank, resident_low={self.key: low}))
        meta = functools.reduce(lambda a, b: a.aggregate(b), metas)
        self.in_flight.append((self.step_no + self.lag, meta))

    def run(self, max_steps=50):
        while self.running and self.F < self.n and self.step_no < max_steps:
            self.step()
        return self

    def finish(self):
        """request_finished, then the next step's finished_req_ids."""
        stores = self.book.request_finished(self.rid, min(self.n, self.F))
        step = self.book.build_step({}, lambda r: (), finished=[self.rid])
        return stores, step

    def cancels(self):
        return [c for step in self.steps for c in step.cancels]


def all_lands(chunks, at=0):
    return {c: at for c in chunks}


def falling(top, first_step=0, every=1):
    """Chunk top - i lands at first_step + i * every: the daemon loads from the tail down."""
    return {top - i: first_step + i * every for i in range(top + 1)}


# --- configuration and eligibility ----------------------------------------------------------------------------

def test_config_validates():
    """(Reading it from vLLM's kv_connector_extra_config is cake.vllm.scheduler.split_config's: test_engine_config.)"""
    with pytest.raises(ValueError):
        SplitConfig(chunk_tokens=24, block_size=16)
    with pytest.raises(ValueError):
        SplitConfig(min_chunks=0)
    with pytest.raises(ValueError):
        SplitConfig(world_size=0)
    assert list(SplitConfig(world_size=2).ranks) == [0, 1]


def test_split_end_leaves_a_token_to_compute():
    assert split_end(10, 320, 32) == 288           # the whole prompt cached: one chunk less
    assert split_end(10, 321, 32) == 320
    assert split_end(4, 320, 32) == 128
    assert split_end(0, 320, 32) == split_end(3, 0, 32) == split_end(3, 20, 32) == 0


def test_eligibility_reasons():
    cfg = config(min_chunks=2)
    facts = dict(local_tokens=0, cached_chunks=9, num_prompt_tokens=320)
    ok = check_eligibility(cfg, **facts)
    assert ok and (ok.reason, ok.local, ok.end) == ("", 0, 288)
    cases = [
        (dict(cfg=SplitConfig(enabled=False, chunk_tokens=CHUNK, block_size=BLOCK)), "split mode is off"),
        (dict(scheduler_bound=False), "--scheduler-cls"),
        (dict(is_multimodal=True), "multimodal"),
        (dict(wants_prompt_logprobs=True), "prompt logprobs"),
        (dict(speculative=True), "speculative decoding"),
        (dict(local_tokens=8), "not block-aligned"),
        (dict(local_tokens=240), "48 tokens to load"),    # 288 - 240 < 2 chunks
        (dict(cached_chunks=0), "0 tokens to load"),
        (dict(num_prompt_tokens=64), "fewer than cake_split_min_chunks=2"),
    ]
    for change, words in cases:
        args = {**facts, **{k: v for k, v in change.items() if k != "cfg"}}
        result = check_eligibility(change.get("cfg", cfg), **args)
        assert not result and words in result.reason, (change, result)
    # Exactly min_chunks to load beyond the local hit is enough.
    assert check_eligibility(cfg, local_tokens=224, cached_chunks=9, num_prompt_tokens=320)


# --- what workers compute -------------------------------------------------------------------------------------

def test_resident_low_never_skips_a_hole():
    assert resident_low_of([], 8) == 8
    assert resident_low_of([7, 6, 5], 8) == 5
    assert resident_low_of([7, 6, 4, 3, 2], 8) == 6     # 5 failed: the landed 4..2 below it do not count
    assert resident_low_of([6, 5], 8) == 8              # the top chunk has not landed
    assert resident_low_of(range(0, 12), 8) == 0        # chunks past H are ignored


def test_splice_rows_mid_chunk_and_aligned():
    assert splice_rows(100, 256, 32) == [ChunkRows(3, 100, 128, 4, 32), ChunkRows(4, 128, 160, 0, 32),
                                         ChunkRows(5, 160, 192, 0, 32), ChunkRows(6, 192, 224, 0, 32),
                                         ChunkRows(7, 224, 256, 0, 32)]
    assert splice_rows(64, 128, 32) == [ChunkRows(2, 64, 96, 0, 32), ChunkRows(3, 96, 128, 0, 32)]
    assert splice_rows(127, 128, 32) == [ChunkRows(3, 127, 128, 31, 32)]
    assert splice_rows(128, 128, 32) == []


def test_splice_copies_map_every_token_once():
    blocks = list(range(500, 520))
    copies = splice_copies(100, 256, 32, blocks[6:16], 6, 16)
    # Block 6 holds tokens 96..111: rows 4..15 of it, rows 4..15 of chunk 3.
    assert copies[0] == SpliceCopy(chunk=3, chunk_row=4, block_id=506, block_row=4, rows=12, token=100)
    assert copies[1] == SpliceCopy(chunk=3, chunk_row=16, block_id=507, block_row=0, rows=16, token=112)
    tokens = [c.token + i for c in copies for i in range(c.rows)]
    assert tokens == list(range(100, 256))
    for c in copies:
        assert c.chunk_row + c.rows <= 32 and c.block_row + c.rows <= 16
        assert c.block_id == blocks[c.token // 16] and c.chunk == c.token // 32
    # Chunk and block of one size: each copy is one chunk and one block.
    same = splice_copies(40, 64, 16, [7, 8], 2, 16)
    assert [(c.chunk, c.block_id, c.rows) for c in same] == [(2, 7, 8), (3, 8, 16)]


# --- WorkerMeta -----------------------------------------------------------------------------------------------

def test_worker_meta_aggregates_per_rank_and_stays_truthy():
    k1, k2 = LoadKey("a", 1), LoadKey("b", 2)
    r0 = WorkerMeta.for_rank(0, resident_low={k1: 3, k2: 5})
    r1 = WorkerMeta.for_rank(1, resident_low={k1: 6}, ended=[k2], failed={k2: COMPUTE_ONLY})
    merged = r0.aggregate(r1)
    assert merged.resident_low == {k1: {0: 3, 1: 6}, k2: {0: 5}}
    assert merged.ended == {k2: {1}} and merged.failed == {k2: COMPUTE_ONLY}
    assert merged.resident_low_over_ranks(k1, 8, 2) == 6
    assert merged.resident_low_over_ranks(k2, 8, 2) == 8        # rank 1 said nothing of b's residency: nothing
    assert merged.resident_low_over_ranks(k2, 8, 1) == 5
    assert r0.resident_low == {k1: {0: 3}, k2: {0: 5}}          # the inputs are left alone
    # One rank twice in one merge keeps the less resident word; failures from two ranks keep both reasons.
    again = merged.aggregate(WorkerMeta.for_rank(0, resident_low={k1: 4}, failed={k2: "stream error"}))
    assert again.resident_low[k1] == {0: 4, 1: 6} and again.failed[k2] == f"{COMPUTE_ONLY}; stream error"
    assert merged.aggregate(None) == merged
    # Truthy whenever it exists, even carrying only an end or a failure (vLLM drops a falsy meta).
    assert not hasattr(WorkerMeta, "__len__")
    assert bool(WorkerMeta.for_rank(0, ended=[k1])) and bool(WorkerMeta.for_rank(0, failed={k1: "x"}))
    assert WorkerMeta().is_empty() and not r1.is_empty()
    # It crosses from the workers' processes to the scheduler's.
    copy = pickle.loads(pickle.dumps(merged))
    assert copy == merged and isinstance(next(iter(copy.resident_low)), LoadKey)


# --- the book, method by method -------------------------------------------------------------------------------

def test_add_checks_its_facts_and_replaces_a_page_not_started():
    book = SplitBook(config())
    with pytest.raises(ValueError):
        book.add("r", 0, 100, 400)           # H not chunk-aligned
    with pytest.raises(ValueError):
        book.add("r", 8, 256, 400)           # local hit not block-aligned
    with pytest.raises(ValueError):
        book.add("r", 0, 320, 320)           # nothing left to compute after H
    first = book.add("r", 0, 256, 400)
    second = book.add("r", 16, 256, 400)     # vLLM asked again before admitting it
    assert first != second and "r" in book and len(book.entries()) == 1
    e = book.entry("r")
    assert (e.local, e.end, e.front, e.progress, e.started, e.jumped) == (16, 256, 16, 0, False, False)
    assert book.cancels_for_step() == []     # nothing was started: nothing to cancel
    assert book.stats.added == 2


def test_starts_go_out_once_when_scheduled():
    book = SplitBook(config())
    book.add("r", 48, 256, 400)
    assert book.starts_for_step([]) == []    # admitted but not scheduled: vLLM will ask again
    (start,) = book.starts_for_step(["r"])
    assert (start.local, start.end, start.computed_through, start.end_chunk) == (48, 256, 1, 8)
    assert start.key == book.entry("r").key
    assert book.starts_for_step(["r"]) == []


def test_a_forced_split_loads_only_from_its_point():
    book = SplitBook(config())
    for at in (16, 40, 256, 300):            # below the local hit, not chunk-aligned, at H, past H
        with pytest.raises(ValueError):
            book.add("r", 32, 256, 400, at=at)
    key = book.add("r", 32, 256, 400, at=128)
    (start,) = book.starts_for_step(["r"])
    assert (start.computed_through, start.end_chunk) == (4, 8)
    assert book.on_scheduled("r", 64, 32) is None            # front 96: below the point, no Progress to send
    assert book.on_scheduled("r", 64, 96) == 5               # front 160
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 4}))
    assert book.jump_target("r", 100, 400) is None           # [100, 128) is not loaded, and never will be
    assert book.jump_target("r", 160, 400) == 256


def test_jump_target_conditions():
    book, key = started(world=1, end=256)
    assert book.jump_target("r", 64, 400) is None              # nothing reported resident yet
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 3}))
    assert book.jump_target("r", 64, 400) is None              # chunk 2 (tokens 64..95) not resident
    assert book.jump_target("r", 96, 400, is_running=False) is None
    assert book.jump_target("r", 96, 90) is None               # past its prompt: not prefilling
    assert book.jump_target("other", 96, 400) is None
    assert book.jump_target("r", 96, 400) == 256
    assert book.jump_target("r", 100, 400) == 256             # mid-chunk, mid-block
    unstarted = SplitBook(config())
    k = unstarted.add("r", 0, 256, 400)
    unstarted.on_worker_meta(WorkerMeta.for_rank(0, resident_low={k: 0}))
    assert unstarted.jump_target("r", 96, 400) is None         # no load runs until its start goes out


def test_jump_target_front_at_or_past_h_stops_and_cancels():
    book, key = started(end=256)
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 0}))
    assert book.jump_target("r", 256, 400) is None
    assert book.entry("r").stopped == FRONT_PASSED
    assert [c.reason for c in book.cancels_for_step()] == [FRONT_PASSED]
    assert book.jump_target("r", 100, 400) is None             # no jump after a stop, whatever is resident


def test_note_jump_and_its_misuse():
    book, key = started(end=256)
    with pytest.raises(ValueError):
        book.note_jump("r", 64, 200)                          # not H
    with pytest.raises(ValueError):
        book.note_jump("nobody", 64, 256)
    book.note_jump("r", 64, 256)
    e = book.entry("r")
    assert (e.jumped, e.jumped_from, e.front) == (True, 64, 256)
    with pytest.raises(ValueError):
        book.note_jump("r", 64, 256)                          # one jump only
    assert book.jump_target("r", 256, 400) is None             # no second jump while the splice is pending


def test_on_scheduled_progress_is_monotone_and_stops_after_the_jump():
    book, key = started(local=0, end=256)
    assert book.on_scheduled("r", 20) is None                  # front 20: no whole chunk yet
    assert book.on_scheduled("r", 20) == 1                     # front 40
    assert book.on_scheduled("r", 24) == 2                     # front 64
    assert book.on_scheduled("r", 10, num_computed_tokens=30) is None   # a lower front never moves progress back
    assert book.entry("r").progress == 2
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 2}))
    assert book.jump_target("r", 64, 400) == 256
    book.note_jump("r", 64, 256)
    assert book.on_scheduled("r", 32) is None
    assert book.entry("r").front == 288 and book.cancels_for_step() == []   # past H after a jump is no cancel


def test_on_scheduled_front_passing_h_cancels_once():
    book, key = started(end=128, n=400)
    assert book.on_scheduled("r", 100) == 3
    assert book.on_scheduled("r", 28) is None                  # front 128 = H
    e = book.entry("r")
    assert e.stopped == FRONT_PASSED and e.cancel_reason == FRONT_PASSED
    assert book.cancels_for_step() == [Cancel("r", key.seq, FRONT_PASSED, "front 128 >= H 128")]
    assert book.cancels_for_step() == []
    assert book.entry("r").cancelled and book.stats.cancels == {FRONT_PASSED: 1}


def test_splices_pending_until_scheduled_and_emitted_once():
    book, key = started(end=256)
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 3}))
    book.begin_step()
    assert book.jump_target("r", 100, 400) == 256
    book.note_jump("r", 100, 256)
    assert book.splices_for_step([], block_table) == [] and not book.spliced_this_step()
    book.begin_step()
    (splice,) = book.splices_for_step(["r"], lambda r: (block_table(r),))    # vLLM's tuple of one group
    assert book.spliced_this_step()
    assert (splice.start, splice.end, splice.first_block) == (100, 256, 6)
    assert splice.block_ids == tuple(range(1006, 1016)) and splice.key == key
    assert book.splices_for_step(["r"], block_table) == []
    book.begin_step()
    assert not book.spliced_this_step()
    assert book.stats.splices == 1 and book.stats.tokens_spliced == 156


def test_splice_without_the_blocks_is_an_error():
    book, key = started(end=256)
    book.note_jump("r", 100, 256)
    with pytest.raises(ValueError, match="should have allocated 16"):
        book.splices_for_step(["r"], lambda r: list(range(10)))
    with pytest.raises(ValueError, match="KV cache groups"):
        book.splices_for_step(["r"], lambda r: ([1] * 16, [2] * 16))


def test_worker_failures_stop_the_jump_and_cancel_every_rank():
    for meta_of in (lambda key: WorkerMeta.for_rank(1, failed={key: COMPUTE_ONLY}),
                    lambda key: WorkerMeta.for_rank(1, failed={key: "stream error"})):
        book, key = started(world=2, end=256)
        book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 0}).aggregate(
            WorkerMeta.for_rank(1, resident_low={key: 0})))
        book.on_worker_meta(meta_of(key))
        assert book.jump_target("r", 100, 400) is None
        e = book.entry("r")
        assert e.stopped == LOAD_FAILED and e.failed in (COMPUTE_ONLY, "stream error")
        (cancel,) = book.cancels_for_step()
        assert cancel.reason == LOAD_FAILED and cancel.detail == e.failed


def test_a_load_ended_on_one_rank_cancels_the_others_but_not_when_all_ended():
    book, key = started(world=2, end=256)
    book.on_worker_meta(WorkerMeta.for_rank(0, ended=[key]))
    assert book.entry("r").stopped == LOAD_ENDED
    assert [c.reason for c in book.cancels_for_step()] == [LOAD_ENDED]
    book, key = started(world=2, end=256)
    book.on_worker_meta(WorkerMeta.for_rank(0, ended=[key]).aggregate(WorkerMeta.for_rank(1, ended=[key])))
    assert book.entry("r").stopped == LOAD_ENDED and book.cancels_for_step() == []


def test_a_pending_jump_whose_load_failed_is_reverted():
    book, key = started(end=256)
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={key: 3}))
    assert book.jump_target("r", 100, 400) == 256
    book.note_jump("r", 100, 256)
    assert book.splices_for_step([], block_table) == []       # not scheduled: budget
    book.on_worker_meta(WorkerMeta.for_rank(0, failed={key: "stream error"}))
    assert book.jump_target("r", 256, 400) == 100              # put the counter back: nothing was allocated
    book.note_jump("r", 256, 100)
    e = book.entry("r")
    assert (e.jumped, e.front, e.stopped) == (False, 100, LOAD_FAILED) and book.stats.reverts == 1
    assert [c.reason for c in book.cancels_for_step()] == [LOAD_FAILED]
    assert book.splices_for_step(["r"], block_table) == []
    assert book.jump_target("r", 100, 400) is None
    assert book.computed_chunks_to_store("r", 400) == [ChunkRange(0, 12)]
    with pytest.raises(ValueError):
        book.note_jump("r", 256, 100)


def test_a_splice_failure_cancels_stops_and_stores_only_the_front():
    book, key = started(end=256)
    book.note_jump("r", 100, 256)
    book.splices_for_step(["r"], block_table)
    book.on_worker_meta(WorkerMeta.for_rank(0, failed={key: "copy failed"}))
    e = book.entry("r")
    assert e.splice_failed and e.stopped == SPLICE_FAILED and book.stats.splice_failures == 1
    assert [c.reason for c in book.cancels_for_step()] == [SPLICE_FAILED]
    # vLLM truncates at the first bad block and recomputes: no second jump.
    assert book.jump_target("r", 96, 400) is None
    assert book.computed_chunks_to_store("r", 400) == [ChunkRange(0, 3)]


def test_cancels_for_preempted_and_finished_requests():
    book, key = started(end=256)
    assert [c.reason for c in book.cancels_for_step(preempted=["r"])] == [PREEMPTED]
    assert "r" not in book and book.entries() == []
    book, key = started(end=256)
    assert [c.reason for c in book.cancels_for_step(finished=["r", "unknown"])] == [FINISHED]
    assert book.entries() == []
    # A request over before its load started needs no cancel.
    book = SplitBook(config())
    book.add("r", 0, 256, 400)
    assert book.cancels_for_step(finished=["r"]) == [] and book.entries() == []


def test_request_finished_then_finished_ids_cancel_once():
    book, key = started(end=256)
    book.note_jump("r", 100, 256)
    # The store decision comes with the finish: a jump whose splice never went out stores only its front.
    assert book.request_finished("r", 256) == [ChunkRange(0, 3)]
    assert "r" not in book and book.request_finished("r", 256) == [ChunkRange(0, 8)]  # a page gone: all
    assert book.request_finished("r") == []
    step = book.build_step({}, block_table, finished=["r"])
    assert step.cancels == [Cancel("r", key.seq, FINISHED)] and book.entries() == []
    assert book.build_step({}, block_table, finished=["r"]).is_empty()


def test_readmission_cancels_the_old_load_and_ignores_its_late_reports():
    book, old = started(end=256)
    new = book.add("r", 0, 256, 400)           # preempted on a vLLM without preempted_req_ids: admitted again
    assert new.seq > old.seq
    step = book.build_step({"r": 32}, block_table, {"r": 0})
    assert [c.key for c in step.cancels] == [old] and step.cancels[0].reason == READMITTED
    assert [s.key for s in step.starts] == [new]
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={old: 0}, failed={old: "cancelled"}))
    e = book.entry("r")
    assert e.key == new and e.resident_low == {} and e.failed is None and e.stopped is None
    assert book.jump_target("r", 32, 400) is None


def test_build_step_marks_preempted_and_finished_first():
    book = SplitBook(config())
    book.add("a", 0, 256, 400)
    book.add("b", 0, 256, 400)
    step = book.build_step({"a": 32, "b": 32}, block_table, {"a": 0, "b": 0}, preempted=["b"])
    assert [s.req_id for s in step.starts] == ["a"] and list(step.progress) == [book.entry("a").key]
    assert step.cancels == [] and "b" not in book          # b never started: nothing to cancel
    assert SplitStep().is_empty() and not step.is_empty()


def test_computed_chunks_to_store():
    book, key = started(local=0, end=256, n=400)
    assert book.computed_chunks_to_store("r", 400) == [ChunkRange(0, 12)]     # no jump: all of it
    assert book.computed_chunks_to_store("r", 31) == []
    assert book.computed_chunks_to_store("nobody", 70) == [ChunkRange(0, 2)]
    book.note_jump("r", 100, 256)
    # A jump whose splice never went out (finished first): only the front was computed.
    assert book.computed_chunks_to_store("r", 256) == [ChunkRange(0, 3)]
    book.splices_for_step(["r"], block_table)
    assert book.computed_chunks_to_store("r", 400) == [ChunkRange(0, 3), ChunkRange(8, 12)]
    assert book.computed_chunks_to_store("r", 270) == [ChunkRange(0, 3)]      # no full chunk past H yet
    assert ChunkRange(8, 12).count == 4


def test_stale_duplicate_and_foreign_worker_meta():
    book, key = started(world=2, end=256)
    r0 = WorkerMeta.for_rank(0, resident_low={key: 2})
    r1 = WorkerMeta.for_rank(1, resident_low={key: 5})
    book.on_worker_meta(r0.aggregate(r1))
    book.on_worker_meta(r0.aggregate(r1))                         # the same report twice
    book.on_worker_meta(WorkerMeta.for_rank(1, resident_low={key: 7}))   # an older report, late
    book.on_worker_meta(WorkerMeta.for_rank(1, resident_low={key: 99}))  # past H: nothing resident
    book.on_worker_meta(WorkerMeta.for_rank(5, resident_low={key: 0}))   # not a rank of this world
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={LoadKey("r", key.seq + 7): 0}))
    book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={LoadKey("ghost", 1): 0}))
    book.on_worker_meta(None)
    e = book.entry("r")
    assert e.resident_low == {0: 2, 1: 5} and e.resident_low_all(2) == 5
    assert book.jump_target("r", 159, 400) is None and book.jump_target("r", 160, 400) == 256
    # A plain tuple key (as some transports rebuild it) reaches the same load.
    book.on_worker_meta(WorkerMeta(resident_low={("r", key.seq): {1: 4}}))
    assert e.resident_low[1] == 4
    # After the splice a worker's end (its release) is expected: no cancel; reports after that change nothing.
    book.note_jump("r", 160, 256)
    book.splices_for_step(["r"], block_table)
    book.on_worker_meta(WorkerMeta.for_rank(0, ended=[key], resident_low={key: 0}))
    assert book.cancels_for_step() == [] and e.stopped is None
    book.request_finished("r")
    book.on_worker_meta(WorkerMeta.for_rank(1, ended=[key], failed={key: "late"}))   # the page is gone
    assert book.entries() == [] and book.stats.splice_failures == 0


def test_the_module_imports_no_engine():
    import subprocess
    # cake/__init__ pulls in the client (grpc); split.py itself must not: load it as a plain file.
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('split', %r); "
            "m = importlib.util.module_from_spec(spec); sys.modules['split'] = m; spec.loader.exec_module(m); "
            "bad = [n for n in ('torch', 'vllm', 'grpc', 'numpy') if n in sys.modules]; assert not bad, bad"
            % split.__file__)
    subprocess.run([sys.executable, "-c", code], check=True)


# --- scenarios ------------------------------------------------------------------------------------------------

def assert_meeting(sim, jump_from):
    """Positions [F_jump, H) computed zero times and spliced once; every other prompt position computed once."""
    assert sim.jumps == [(sim.jumps[0][0], jump_from, sim.H)]
    for p in range(sim.local, sim.n):
        if jump_from <= p < sim.H:
            assert (sim.computed[p], sim.spliced[p]) == (0, 1), p
        else:
            assert (sim.computed[p], sim.spliced[p]) == (1, 0), p


def test_front_meets_back():
    # 10 chunks, H = 9 chunks; one chunk computed per step while the daemon lands one per step from the top.
    sim = Sim(n=320, cached_chunks=10, lands={0: falling(8)}).run()
    # After step s the front is 32 (s + 1); the meta of step s (chunks 8..8-s landed) is read at step s + 1.
    assert sim.jumps == [(5, 160, 288)]
    assert_meeting(sim, 160)
    assert sim.cancels() == [] and sim.book.stats.tokens_spliced == 128
    # Progress went out every step before the jump, and only forward.
    reported = [p for step in sim.steps for p in step.progress.values()]
    assert reported == [1, 2, 3, 4, 5]
    stores, step = sim.finish()
    assert stores == [ChunkRange(0, 5), ChunkRange(9, 10)]
    assert step.cancels == [] and sim.book.entries() == []    # released by the worker after its copy


def test_loads_slower_than_compute_never_jump_and_cancel_when_the_front_passes_h():
    # The top chunk would land only at step 9; the front reaches H = 288 in step 8.
    sim = Sim(n=320, cached_chunks=10, lands={0: falling(8, first_step=9, every=3)}).run()
    assert sim.jumps == []
    assert all(c == 1 for c in sim.computed) and not any(sim.spliced)
    (cancel,) = sim.cancels()
    assert cancel.reason == FRONT_PASSED and sim.steps.index(
        next(s for s in sim.steps if s.cancels)) == 8              # the step whose chunk reaches H
    assert sim.load_cancelled
    stores, _ = sim.finish()
    assert stores == [ChunkRange(0, 10)]


def test_loads_faster_than_compute_jump_at_the_first_step():
    sim = Sim(n=320, cached_chunks=10, lands={0: all_lands(range(9))}).run()
    assert sim.jumps == [(1, 32, 288)]
    assert_meeting(sim, 32)


def test_jump_mid_chunk_and_mid_block():
    sim = Sim(n=400, cached_chunks=11, budget=100, lands={0: all_lands(range(11))}).run()
    assert sim.H == 352 and sim.jumps == [(1, 100, 352)]
    (splice,) = [s for step in sim.steps for s in step.splices]
    assert splice.first_block == 6 and splice.rows(CHUNK)[0] == ChunkRows(3, 100, 128, 4, 32)
    assert_meeting(sim, 100)
    stores, _ = sim.finish()
    assert stores == [ChunkRange(0, 3), ChunkRange(11, 12)]


def test_async_scheduling_jumps_with_a_step_in_flight():
    lands = {0: all_lands(range(9), at=2)}                        # chunks 3..8 land in step 2 (0..2 computed)
    sync = Sim(n=320, cached_chunks=10, lag=1, lands=lands).run()
    assert sync.jumps == [(3, 96, 288)]
    assert_meeting(sync, 96)
    # Under async scheduling step 2's word arrives at step 4, when step 3, computing [96, 128), is still in
    # flight: the jump from 128 leaves it alone, the splice writes only [128, 288), every position is filled once.
    sim = Sim(n=320, cached_chunks=10, lag=2, lands=lands).run()
    assert sim.jumps == [(4, 128, 288)]
    assert_meeting(sim, 128)


def test_two_ranks_with_different_lowest_resident_chunks():
    sim = Sim(n=320, cached_chunks=10, world=2, lands={0: all_lands(range(9)), 1: falling(8)}).run()
    # Rank 0 holds everything after step 0; the jump waits for rank 1, the slower one.
    assert sim.jumps == [(5, 160, 288)]
    assert_meeting(sim, 160)


def test_a_corrupt_chunk_on_one_rank_blocks_the_jump_below_it():
    corrupt = {c: 0 for c in range(9) if c != 6}                  # chunk 6 never lands intact on rank 1
    sim = Sim(n=320, cached_chunks=10, world=2, lands={0: all_lands(range(9)), 1: corrupt}).run()
    # Rank 1's landed 5..0 below the hole do not count: resident from 7, so the jump waits for F >= 224.
    assert sim.jumps == [(7, 224, 288)]
    assert_meeting(sim, 224)


def test_preemption_before_the_jump():
    sim = Sim(n=320, cached_chunks=10, lands={0: falling(8, every=2)})
    for _ in range(3):
        sim.step()
    step = sim.step(preempt=True)
    assert [c.reason for c in step.cancels] == [PREEMPTED] and sim.load_cancelled
    assert "r" not in sim.book and sim.book.entries() == []
    # The old load's reports still on their way change nothing; the request comes back as a new load.
    sim.book.on_worker_meta(WorkerMeta.for_rank(0, resident_low={sim.key: 0}))
    new = sim.book.add("r", 0, 288, 320)
    assert new != sim.key and sim.book.jump_target("r", 64, 320) is None


def test_preemption_after_the_jump_before_the_splice():
    sim = Sim(n=320, cached_chunks=10, lands={0: all_lands(range(9))})
    sim.step()
    sim.step(budget=0)                                            # jump noted, not scheduled: splice pending
    assert sim.jumps == [(1, 32, 288)] and sim.steps[-1].splices == []
    step = sim.step(preempt=True)
    assert step.splices == [] and [c.reason for c in step.cancels] == [PREEMPTED]
    assert sim.book.stats.splices == 0 and sim.book.entries() == []


def test_preemption_after_the_splice():
    sim = Sim(n=320, cached_chunks=10, lands={0: all_lands(range(9))})
    sim.step()
    sim.step()
    assert sim.book.stats.splices == 1
    step = sim.step(preempt=True)
    assert step.cancels == [] and sim.book.entries() == []        # the worker released it after the copy
    # Restarted from 0, it stores whatever it computes (the spliced rows it may prefix-hit are the cache's own).
    assert sim.book.computed_chunks_to_store("r", 320) == [ChunkRange(0, 10)]


def test_abort_mid_load():
    sim = Sim(n=320, cached_chunks=10, lands={0: falling(8, every=3)})
    for _ in range(3):
        sim.step()
    stores, step = sim.finish()
    assert stores == [ChunkRange(0, 3)]
    assert [c.reason for c in step.cancels] == [FINISHED] and sim.book.entries() == []


def test_negative_control_a_missing_splice_is_caught():
    sim = Sim(n=320, cached_chunks=10, lands={0: all_lands(range(9))}, apply_splices=False)
    with pytest.raises(AssertionError, match="computed on KV no one filled"):
        sim.run()


def test_ineligible_requests_never_enter_the_book():
    cfg = config(min_chunks=2)
    book = SplitBook(cfg)
    for facts in (dict(is_multimodal=True), dict(wants_prompt_logprobs=True), dict(speculative=True),
                  dict(cached_chunks=1)):
        e = check_eligibility(cfg, **{**dict(local_tokens=0, cached_chunks=9, num_prompt_tokens=320), **facts})
        if e:
            book.add("r", e.local, e.end, 320)
    assert book.entries() == [] and book.stats.added == 0
