"""Chunk keys from Python equal the daemon's: the golden vectors shared with tests/keys/namespace_test.cc,
and the keys of a real caked (a prompt stored as tokens is found by the Python-computed keys' prefix logic)."""
import os
import tomllib

import pytest

import cake
from cake import keys

GOLDEN = os.path.join(os.environ.get("CAKE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "tests", "golden", "chunk_keys.toml")
DTYPE_NAMES = {1: "fp32", 2: "fp16", 3: "bf16", 4: "fp8", 5: "int8"}
PRECISION_NAMES = {0: "exact", 1: "int8", 2: "int4"}


def vectors():
    with open(GOLDEN, "rb") as f:
        return tomllib.load(f)["vector"]


@pytest.mark.parametrize("vector", vectors(), ids=lambda v: v["name"])
def test_golden_vectors(vector):
    ns = cake.Namespace(vector["model_id"], vector["num_layers"], vector["num_kv_heads"], vector["head_dim"],
                        DTYPE_NAMES[vector["dtype"]], tp_rank=vector["tp_rank"], tp_size=vector["tp_size"],
                        chunk_tokens=vector["chunk_tokens"], tenant=vector["tenant"],
                        stored_precision=PRECISION_NAMES[vector.get("stored_precision", 0)])
    secret = vector["secret"].encode()
    assert keys.namespace_id(ns).hex() == vector["namespace_id"]
    assert keys.root_key(ns, secret).hex() == vector["root"]
    assert [k.hex() for k in keys.chunk_keys(ns, vector["tokens"], secret)] == vector["keys"]
    engine = [bytes.fromhex(k) for k in vector["engine_keys"]]
    assert [k.hex() for k in keys.stored_engine_keys(ns, engine, secret)] == vector["stored_engine_keys"]


def test_the_file_has_every_kind_of_vector():
    all_vectors = vectors()
    assert len(all_vectors) >= 3
    assert any(v["secret"] for v in all_vectors) and any(v["engine_keys"] for v in all_vectors)
    assert any(len(v["tokens"]) % v["chunk_tokens"] for v in all_vectors)  # a partial tail chunk


def test_bad_key_inputs():
    ns = cake.Namespace("m", 1, 1, 1, "fp32", chunk_tokens=0)
    with pytest.raises(ValueError):
        keys.namespace_id(ns)
    with pytest.raises(ValueError):
        keys.stored_engine_keys(cake.Namespace("m", 1, 1, 1, "fp32"), [b"short"])
