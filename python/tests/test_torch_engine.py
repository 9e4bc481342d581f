"""The PyTorch engine against a real caked: in every mode (compute-only, I/O-only, Cake, every fixed split) the
KV cache and the first token's logits are identical, bit for bit, to full compute; with a cached prefix shorter
than the prompt, a partial tail chunk, bf16, Cake racing a throttled tier, and corrupt chunks on disk."""
import glob
import os
import time

import pytest

torch = pytest.importorskip("torch")

from cake.testing import SpawnedDaemon  # noqa: E402
from cake_torch_engine import ModelConfig, TorchLlama, TorchPrefillEngine, same_bits  # noqa: E402

torch.set_num_threads(1)
CHUNK = 16
SMALL = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=160, vocab=256, seed=3)


def make_prompt(tokens, seed=0):
    return [(i * 131 + seed * 17 + (i * i) % 7) % 256 for i in range(tokens)]


class Truth:
    def __init__(self, engine):
        run = engine.compute_only()
        self.kv = engine.cache.clone()
        self.logits = run.logits.clone()
        self.run = run


def check_exact(engine, result, truth):
    assert same_bits(engine.cache, truth.kv), f"{result.mode}: the KV cache differs from full compute's"
    assert same_bits(result.logits, truth.logits), f"{result.mode}: the first token's logits differ"
    assert result.first_token == truth.run.first_token


def wait_counter(client, name, at_least, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while client.stats().get(name, 0) < at_least:
        assert time.monotonic() < deadline, f"{name} stayed below {at_least}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def small_model():
    return TorchLlama(SMALL)


@pytest.mark.parametrize("tail", [0, 5], ids=["whole chunks", "partial tail"])
def test_every_mode_and_split_is_bit_exact(daemon, small_model, tail):
    with daemon.client() as client:
        prompt = make_prompt(CHUNK * 6 + tail, seed=tail)
        engine = TorchPrefillEngine(small_model, prompt, CHUNK, client)
        try:
            truth = Truth(engine)
            engine.set_hint_from(truth.run)
            assert engine.store().stored_chunks == 6
            io = engine.io_only()
            check_exact(engine, io, truth)
            assert io.loaded_chunks == 6 and io.meeting_chunk == 0
            cake_run = engine.cake()
            check_exact(engine, cake_run, truth)
            assert cake_run.computed_chunks + cake_run.loaded_chunks >= engine.full_chunks
            for split in range(0, 7):
                run = engine.fixed_split(split)
                check_exact(engine, run, truth)
                assert run.meeting_chunk == split and run.loaded_chunks == 6 - split
            check_exact(engine, engine.compute_only(), truth)
        finally:
            engine.close()


def test_a_cached_prefix_shorter_than_the_prompt(daemon, small_model):
    with daemon.client() as client:
        prompt = make_prompt(CHUNK * 7 + 3, seed=11)
        engine = TorchPrefillEngine(small_model, prompt, CHUNK, client)
        try:
            truth = Truth(engine)
            # Only the first four chunks are stored: three full chunks and the tail are computed after the loads.
            engine_short = TorchPrefillEngine(small_model, prompt[:CHUNK * 4], CHUNK, client)
            engine_short.compute_only()
            engine_short.store()
            engine_short.close()
            for run in (engine.io_only(), engine.cake(), engine.fixed_split(2)):
                check_exact(engine, run, truth)
                assert run.loaded_chunks <= 4
        finally:
            engine.close()


def test_bf16(daemon):
    model = TorchLlama(ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256,
                                   seed=5, dtype="bf16"))
    with daemon.client() as client:
        engine = TorchPrefillEngine(model, make_prompt(CHUNK * 4 + 1, seed=5), CHUNK, client)
        try:
            assert engine.ns.dtype == "bf16" and engine.cache.dtype == torch.bfloat16
            truth = Truth(engine)
            engine.store()
            for run in (engine.io_only(), engine.cake(), engine.fixed_split(1)):
                check_exact(engine, run, truth)
        finally:
            engine.close()


def test_cake_racing_a_throttled_tier_is_bit_exact(fresh_daemon):
    """Reads capped so that loading the prompt takes about as long as computing it: the engine and the daemon
    really meet in the middle, with chunks landing while the engine computes."""
    model = TorchLlama(ModelConfig(layers=4, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=256, seed=9))
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "100")
    with daemon.client() as client:
        prompt = make_prompt(CHUNK * 12, seed=9)
        engine = TorchPrefillEngine(model, prompt, CHUNK, client)
        try:
            engine.compute_only()  # warm-up
            truth = Truth(engine)
            engine.set_hint_from(truth.run)
            engine.store()
            stored_bits = engine.full_chunks * engine.ns.chunk_bytes * 8
            client.set_read_cap("dram", max(stored_bits / truth.run.ttft_s / 1e9, 1e-4))
            engine.io_only()  # the daemon measures the capped tier's speed
            met_inside = 0
            for _ in range(3):
                run = engine.cake()
                check_exact(engine, run, truth)
                met_inside += 0 < run.meeting_chunk < engine.full_chunks
            assert met_inside >= 1, "no Cake run met inside the prompt: the race never happened"
        finally:
            engine.close()


def test_corrupt_and_missing_chunks_on_disk_are_computed(tmp_path, small_model):
    root = str(tmp_path / "disk")
    prompt = make_prompt(CHUNK * 8 + 7, seed=21)
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", root]) as daemon, daemon.client() as client:
        engine = TorchPrefillEngine(small_model, prompt, CHUNK, client)
        truth = Truth(engine)
        engine.store()
        wait_counter(client, "tier_disk_chunks", 8)
        engine.close()
    files = sorted(glob.glob(os.path.join(root, "**", "*.chunk"), recursive=True))
    assert len(files) == 8
    with open(files[2], "r+b") as f:  # which chunk a file holds is the daemon's business
        f.seek(4096 + 64)
        f.write(b"garbage!")
    for missing in (False, True):
        if missing:
            os.remove(files[5])
        with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", root]) as daemon, \
                daemon.client() as client:
            engine = TorchPrefillEngine(small_model, prompt, CHUNK, client)
            try:
                io = engine.io_only()
                check_exact(engine, io, truth)
                # The damage shows: a read failed (and was computed), or the cached prefix ends before a missing
                # chunk. The daemon removes the corrupt chunk, so later loads see a shorter prefix.
                assert io.loaded_chunks < 8
                if not missing:
                    assert io.failed_chunks == 1
                cake_run = engine.cake()
                check_exact(engine, cake_run, truth)
                assert cake_run.computed_chunks + cake_run.loaded_chunks >= engine.full_chunks
            finally:
                engine.close()


@pytest.mark.parametrize("attention", ["explicit", "sdpa"])
def test_each_attention_is_bit_exact_across_modes(daemon, attention):
    """The written-out attention (Debian's torch 1.13 has nothing else) and torch's scaled_dot_product_attention
    (torch 2.x, pip's): each bit-exact between computed and loaded chunks; and the two agree to float32 rounding."""
    if attention == "sdpa" and not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        pytest.skip(f"torch {torch.__version__} has no scaled_dot_product_attention")
    config = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256, seed=12)
    model = TorchLlama(config, attention=attention)
    assert model.attention == attention
    with daemon.client() as client:
        engine = TorchPrefillEngine(model, make_prompt(CHUNK * 5 + 3, seed=12), CHUNK, client)
        try:
            truth = Truth(engine)
            engine.store()
            for run in (engine.io_only(), engine.cake(), engine.fixed_split(2)):
                check_exact(engine, run, truth)
            if attention == "sdpa":
                other = TorchPrefillEngine(TorchLlama(config, attention="explicit"), engine.prompt, CHUNK, client)
                try:
                    explicit = other.compute_only()
                    assert torch.allclose(explicit.logits, truth.logits, atol=1e-4, rtol=1e-4)
                finally:
                    other.close()
        finally:
            engine.close()


def test_the_queue_runs_with_and_without_prefetch_bit_exact(tmp_path):
    """python3 -m cake_torch_engine queue: requests queued before the engine, prompts on disk only; every load, with
    and without prefetch, gives full compute's KV and logits, and with prefetch some chunks come from DRAM."""
    from cake_torch_engine.__main__ import main
    out = tmp_path / "queue.json"
    assert main(["queue", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "160",
                 "--vocab", "256", "--chunk-tokens", "16", "--tokens", "96", "--requests", "3", "--rounds", "1",
                 "--decode-ms", "100", "--arrival-ms", "20", "--json", str(out)]) == 0
    import json
    result = json.loads(out.read_text())
    assert result["bitexact"]
    assert result["dram_reads_without"] == 0
    assert result["dram_reads_with"] > 0


def test_the_demo_verdict_falls_back_to_loaded_rows_only_when_compute_only_is_not_reproducible():
    from cake_torch_engine.__main__ import demo_verdict
    modes = ("compute-only", "I/O-only", "Cake")
    every = lambda value: {mode: value for mode in modes}  # noqa: E731
    # Every mode bit-identical: passed, whatever else.
    assert demo_verdict(every(True), every(True), every(True))[0]
    # A loaded mode differs while compute-only reproduces itself: the loads are wrong, failed.
    passed, judged = demo_verdict({"compute-only": True, "I/O-only": False, "Cake": True}, every(True), every(True))
    assert not passed and "compute-only matches" in judged
    # Compute-only itself differs (a GPU's kernels): judged by the loaded rows and the first token.
    unreproducible = {"compute-only": False, "I/O-only": False, "Cake": False}
    passed, judged = demo_verdict(unreproducible, every(True), every(True))
    assert passed and "not bit-identical to itself" in judged
    assert not demo_verdict(unreproducible, {"compute-only": True, "I/O-only": False, "Cake": True}, every(True))[0]
    assert not demo_verdict(unreproducible, every(True), {"compute-only": True, "I/O-only": True, "Cake": False})[0]
