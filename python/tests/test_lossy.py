"""Lossy storage from Python (Namespace(stored_precision="int8"/"int4")) against a real caked with a disk tier: DRAM
gives back the engine's bytes, the disk its quantized form decoded to bf16, within half a quantization step of
each (layer, K/V, token, head) group; and the exact namespace's keys never find the lossy namespace's chunks."""
import dataclasses
import time

import numpy as np
import pytest

from cake.testing import SpawnedDaemon
from helpers import prompt, small_namespace


def bf16_chunk(rng, n_values, group=8):
    """KV-shaped bf16 values (a magnitude per head_dim group), as uint16 bits."""
    scale = 1 + (np.arange(n_values) // group) % 13
    values = ((rng.random(n_values) - 0.5) * scale).astype(np.float32)
    return (values.view(np.uint32) >> 16).astype(np.uint16)


def as_float(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("precision, levels", [("int8", 127), ("int4", 7)])
def test_lossy_namespace_loads_exact_from_dram_and_quantized_from_disk(tmp_path, precision, levels):
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(tmp_path / "disk"),
                        "--disk-capacity-mib", "64"]) as daemon, daemon.client() as client:
        ns = dataclasses.replace(small_namespace("lossy", chunk_tokens=64, dtype="bf16"), stored_precision=precision)
        tokens = prompt(4, chunk_tokens=64, seed=5)
        rng = np.random.default_rng(3)
        chunks = [bf16_chunk(rng, ns.chunk_bytes // 2) for _ in range(4)]
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[c.tobytes() for c in chunks])
        deadline = time.monotonic() + 10
        while client.stats().get("write_back_written", 0) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.lookup(dataclasses.replace(ns, stored_precision="exact"), tokens=tokens).cached_chunks == 0

        def load_all():
            with client.load(ns, tokens=tokens, mode="io_only") as load:
                got = {c.chunk: np.frombuffer(bytes(c.data), dtype=np.uint16) for c in load}
                load.release()
            return got

        exact = load_all()
        assert all(np.array_equal(exact[c], chunks[c]) for c in range(4))
        client.evict("dram")
        assert client.lookup(ns, tokens=tokens).tiers == ["disk"] * 4
        quantized = load_all()
        for c in range(4):
            x = as_float(chunks[c]).reshape(-1, ns.head_dim)
            y = as_float(quantized[c]).reshape(-1, ns.head_dim)
            step = np.abs(x).max(axis=1, keepdims=True) / levels
            assert np.all(np.abs(x - y) <= step / 2 * (1 + 1e-6) + np.abs(y) / 256)
            assert not np.array_equal(x, y)
