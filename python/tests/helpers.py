"""Shared by the Python tests: a small namespace, prompts and chunk patterns that tell chunks apart, and the
benches (cake_bench, which the package does not ship) from the checkout beside these tests."""
import importlib
import os
import sys

import numpy as np

import cake

# python/: cake_bench is there, and nowhere else (the venv suite runs these tests on the installed wheel).
CHECKOUT_PYTHON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_namespace(model_id="py-test", chunk_tokens=16, dtype="fp32", tenant=""):
    return cake.Namespace(model_id, num_layers=2, num_kv_heads=2, head_dim=8, dtype=dtype,
                          chunk_tokens=chunk_tokens, tenant=tenant)


def prompt(chunks, chunk_tokens=16, tail=0, seed=1):
    """A prompt of `chunks` full chunks plus `tail` tokens; the seed makes prompts unrelated."""
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(0, 1 << 31, size=chunks * chunk_tokens + tail)]


def pattern(chunk, nbytes, salt=0):
    """Chunk `chunk`'s bytes: a function of the chunk and the position, so a misplaced chunk fails the check."""
    position = np.arange(nbytes, dtype=np.uint64)
    return ((position * np.uint64(2654435761) + np.uint64(chunk * 40503 + salt * 7919)) >> np.uint64(7)
            ).astype(np.uint8)


def fill(region, chunks, chunk_bytes, salt=0, offset=0):
    view = region.numpy()
    for c in range(chunks):
        view[offset + c * chunk_bytes:offset + (c + 1) * chunk_bytes] = pattern(c, chunk_bytes, salt)


def bench_module(name):
    """cake_bench.<name> from the checkout, after whatever cake this run imports (the checkout's or the wheel's)."""
    if CHECKOUT_PYTHON not in sys.path:
        sys.path.append(CHECKOUT_PYTHON)
    return importlib.import_module(f"cake_bench.{name}")


def bench_env():
    """The environment for `python -m cake_bench.<name>` in a subprocess: the checkout's python/ last on the path."""
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] + [CHECKOUT_PYTHON]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))
