"""Chunk keys computed in Python exactly as the daemon computes them (docs/protocol.md, "Prompt and chunk keys").

An engine never needs these to talk to caked (it sends tokens or its own block hashes); they are here so an
engine or a tool can name a chunk the way the daemon does, e.g. to match its own prefix cache against Lookup, and
they are pinned by the golden vectors in tests/golden/chunk_keys.toml, which the C++ tests check too. The daemon's
keys also depend on its `keys.secret`; pass the same secret to get the same keys.
"""
import hashlib
import struct

KEY_BYTES = 16
# Namespace.stored_precision's wire values.
STORED_PRECISIONS = {"exact": 0, "int8": 1, "int4": 2}


def _u32(value):
    return struct.pack("<I", value)


def _length_prefixed(data):
    if isinstance(data, str):
        data = data.encode()
    return _u32(len(data)) + data


def namespace_id(ns):
    """The namespace's 16-byte id: SHA-256 of a canonical, length-prefixed encoding of every field."""
    if ns.chunk_tokens == 0:
        raise ValueError("chunk_tokens 0 means the daemon's default; name the chunk size to compute keys")
    h = hashlib.sha256(b"cake.v1.namespace")
    h.update(_length_prefixed(ns.model_id))
    for value in (ns.num_layers, ns.num_kv_heads, ns.head_dim, ns.proto_dtype, ns.tp_rank, ns.tp_size or 1,
                  ns.chunk_tokens):
        h.update(_u32(value))
    h.update(_length_prefixed(ns.tenant))
    precision = getattr(ns, "stored_precision", "exact")
    if precision != "exact":  # only then: every exact namespace keeps its id
        h.update(_u32(STORED_PRECISIONS[precision]))
    return h.digest()[:KEY_BYTES]


def root_key(ns, secret=b""):
    """k_{-1}: the chain's start, from the namespace id and the daemon's key secret."""
    h = hashlib.sha256(b"cake.v1.root")
    h.update(namespace_id(ns))
    h.update(_length_prefixed(secret))
    return h.digest()[:KEY_BYTES]


def chunk_keys(ns, tokens, secret=b""):
    """One key per full chunk of `tokens`: k_i = SHA-256(k_{i-1} || chunk i's tokens as little-endian u32)[:16]."""
    tokens = list(tokens)
    previous = root_key(ns, secret)
    keys = []
    for start in range(0, len(tokens) - ns.chunk_tokens + 1, ns.chunk_tokens):
        chunk = tokens[start:start + ns.chunk_tokens]
        previous = hashlib.sha256(previous + struct.pack(f"<{len(chunk)}I", *chunk)).digest()[:KEY_BYTES]
        keys.append(previous)
    return keys


def stored_engine_keys(ns, engine_keys, secret=b""):
    """What the daemon stores an engine's own 16-byte chunk keys as: SHA-256(root || "engine-key" || key)[:16]."""
    root = root_key(ns, secret)
    out = []
    for index, key in enumerate(engine_keys):
        if len(key) != KEY_BYTES:
            raise ValueError(f"chunk key {index} is {len(key)} bytes long; chunk keys are exactly {KEY_BYTES} bytes")
        out.append(hashlib.sha256(root + b"engine-key" + bytes(key)).digest()[:KEY_BYTES])
    return out
