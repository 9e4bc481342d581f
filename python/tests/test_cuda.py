"""Device regions from Python: CudaIpcRegion opened over CUDA IPC as a torch CUDA tensor, and the torch engine
on the GPU, bit-exact in every mode. Skipped, with the reason, where no CUDA device answers (these machines);
scripts/device-check runs them on a machine with a GPU."""
import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():
    pytest.skip(f"no CUDA device answers (torch {torch.__version__}, built with CUDA "
                f"{torch.version.cuda or 'none'})", allow_module_level=True)

import numpy as np  # noqa: E402

from cake.testing import SpawnedDaemon  # noqa: E402
from cake_torch_engine import ModelConfig, TorchLlama, TorchPrefillEngine, same_bits  # noqa: E402
from helpers import prompt, small_namespace  # noqa: E402


@pytest.fixture(scope="module")
def gpu_daemon():
    with SpawnedDaemon(["--dram-capacity-mib", "1024", "--cuda-devices", "0"]) as d:
        with d.client() as c:
            if "cuda" not in c.status()["region_kinds"]:
                pytest.skip(f"the daemon serves no device regions: {c.status()['region_kinds']}")
        yield d


def test_cuda_region_store_and_load(gpu_daemon):
    with gpu_daemon.client() as client:
        ns = small_namespace("cuda-region")
        tokens = prompt(4, seed=30)
        region = client.register_region(4 * ns.chunk_bytes, kind="cuda", device=0)
        assert region.kind == "cuda"
        t = region.torch()
        assert t.is_cuda and t.numel() == region.size
        pattern = torch.arange(region.size, device="cuda:0", dtype=torch.int64).remainder(251).to(torch.uint8)
        t.copy_(pattern)
        torch.cuda.synchronize()
        assert client.store(ns, tokens=tokens, first_chunk=0, chunk_count=4, region=region).stored_chunks == 4
        t.zero_()
        torch.cuda.synchronize()
        with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
            assert load.wait_done(30).loaded_chunks == 4
            load.release()
        assert torch.equal(t, pattern)
        # The same bytes on the host, through an inline load.
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            host = b"".join(e.data for e in sorted(load, key=lambda e: e.chunk))
        assert np.array_equal(np.frombuffer(host, dtype=np.uint8), pattern.cpu().numpy())
        client.release_region(region)
        assert region.closed


def test_torch_engine_on_the_gpu_is_bit_exact(gpu_daemon):
    model = TorchLlama(ModelConfig(layers=4, hidden=256, heads=8, kv_heads=2, intermediate=512, vocab=256, seed=4),
                       device="cuda:0")
    with gpu_daemon.client() as client:
        engine = TorchPrefillEngine(model, [i % 256 for i in range(64 * 8 + 9)], 64, client, region_kind="cuda")
        try:
            assert engine.region.kind == "cuda"
            truth = engine.compute_only()
            kv = engine.cache.clone()
            engine.set_hint_from(truth)
            engine.store()
            for run in (engine.io_only(), engine.cake(), engine.fixed_split(3), engine.compute_only()):
                assert same_bits(engine.cache, kv), run.mode
                assert same_bits(run.logits, truth.logits), run.mode
        finally:
            engine.close()
