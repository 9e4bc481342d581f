"""Shared by the Python tests: a small namespace, prompts and chunk patterns that tell chunks apart."""
import numpy as np

import cake


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
