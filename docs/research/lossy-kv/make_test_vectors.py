"""Reference test vectors for the C++ codec: small chunks, their int8 and int4 decode(encode(x)) bytes.

Every vector is one chunk of shape [layers=2][K,V=2][tokens=4][kv_heads=2][head_dim=8] = 256 values, C order,
little-endian, in the namespace dtype; the decoded files have exactly the same layout and dtype as the input.

  random-<dtype>   torch.randn(shape, generator=torch.Generator().manual_seed(20260101)) * 3, cast to the dtype
                   with round-to-nearest-even (bf16, fp16, fp32).
  edge-bf16        the random-bf16 chunk with its first 10 groups (head_dim runs) replaced by hand-made cases:
                   all zeros (incl. -0.0), int8 ties, int4 ties, a negative absmax, bf16 subnormals, values near the
                   bf16 maximum, a single non-zero value, all-equal values, a group of +-1 ulp neighbours, and
                   values whose x / scale land just beside .5.

Files, in testvectors/: <name>.input.bin, <name>.int8.bin, <name>.int4.bin, and testvectors.json holding the same
bytes as hex plus, for debugging, each group's q values and fp32 scale (as the hex of its bits). The q/scale
lists are NOT a storage format: how the daemon packs them (nibble order, where the scales go) is its own choice;
only the decoded bytes are normative.

Every output is computed twice, with kv_codec.py (torch) and with an independent NumPy version of the same math,
and the two must agree bit for bit.

Run: ~/.cache/cake/venv-*/bin/python make_test_vectors.py   (needs torch and numpy)
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kv_codec  # noqa: E402

SHAPE = (2, 2, 4, 2, 8)
SEED = 20260101
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def to_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


# ---- independent NumPy reference -------------------------------------------------------------------------------
def np_from_bytes(raw, dtype):
    if dtype == "bf16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32)
    if dtype == "fp16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32)
    return np.frombuffer(raw, dtype="<f4").copy()


def np_to_bytes(f32, dtype):
    f32 = np.ascontiguousarray(f32, dtype=np.float32)
    if dtype == "bf16":
        b = f32.view(np.uint32).astype(np.uint64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16          # round to nearest even (inputs are finite)
        return b.astype("<u2").tobytes()
    if dtype == "fp16":
        return f32.astype("<f2").tobytes()                # NumPy's float32 -> float16 is round-to-nearest-even
    return f32.astype("<f4").tobytes()


def np_roundtrip(raw, dtype, qmax):
    x = np_from_bytes(raw, dtype).reshape(-1, SHAPE[-1])
    amax = np.abs(x).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (amax / np.float32(qmax)).astype(np.float32)
        q = np.rint(x / scale)                             # rint: round half to even
    q = np.clip(q, -qmax, qmax)
    q[np.broadcast_to(scale == 0, q.shape)] = 0
    q = q.astype(np.int8)
    y = q.astype(np.float32) * scale
    return np_to_bytes(y, dtype)


# ---- the vectors ---------------------------------------------------------------------------------------------
def random_chunk(dtype):
    g = torch.Generator().manual_seed(SEED)
    return (torch.randn(SHAPE, generator=g, dtype=torch.float32) * 3).to(TORCH[dtype])


def edge_chunk():
    x = random_chunk("bf16").reshape(-1, 8).float()
    big = 3.0e38
    x[0] = torch.tensor([0.0, -0.0, 0.0, 0.0, -0.0, 0.0, 0.0, 0.0])
    x[1] = torch.tensor([127.0, 2.5, -2.5, 1.5, 0.5, -0.5, 3.5, -127.0])    # int8: scale 1, ties to even
    x[2] = torch.tensor([14.0, 1.0, 3.0, 5.0, -5.0, 7.0, -14.0, 0.0])       # int4: scale 2, ties to even
    x[3] = torch.tensor([-6.0, 1.0, 2.0, -3.0, 0.25, 5.0, -0.125, 4.0])     # absmax from a negative value
    x[4] = torch.tensor([1e-39, -2e-39, 5e-40, 0.0, 3e-39, -1e-40, 9.2e-41, 1.5e-39])  # bf16 subnormals
    x[5] = torch.tensor([big, -big, big / 3, 1.0, -1e30, big / 127, 0.0, -big / 2])   # near bf16's max
    x[6] = torch.tensor([0.0, 0.0, 0.0, -0.75, 0.0, 0.0, 0.0, 0.0])         # a single non-zero value
    x[7] = torch.tensor([1.25] * 8)                                         # all equal
    x[8] = torch.tensor([1.0, 1.0078125, 0.99609375, -1.0, -1.0078125, 0.5, 0.50390625, 0.49804688])
    x[9] = torch.tensor([100.0, 0.39453125, 1.1796875, 1.97265625, -1.97265625, 50.0, 49.75, -0.78125])
    return x.to(torch.bfloat16).reshape(SHAPE)


# ---- wrong implementations the vectors must catch (negative controls) ----------------------------------------
def wrong_roundtrip(x, codec, kind):
    """kind "reciprocal": x * (1 / scale) instead of x / scale; "ftz": denormals flushed to zero (FTZ/DAZ)."""
    qmax = kv_codec.QMAX[codec]
    tiny = torch.finfo(torch.float32).tiny

    def flush(t):
        return torch.where(t.abs() < tiny, torch.zeros_like(t), t) if kind == "ftz" else t
    xf = flush(x.float())
    scale = flush(xf.abs().amax(-1, keepdim=True) / qmax)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(xf * (1 / safe)) if kind == "reciprocal" else torch.round(flush(xf / safe))
    q = torch.where(scale == 0, torch.zeros_like(q), torch.clamp(q, -qmax, qmax))
    return flush(q * scale).to(x.dtype)


def main():
    out_dir = os.path.join(HERE, "testvectors")
    os.makedirs(out_dir, exist_ok=True)
    vectors = [(f"random-{d}", d, random_chunk(d)) for d in ("bf16", "fp16", "fp32")]
    vectors.append(("edge-bf16", "bf16", edge_chunk()))
    doc = {"layout": "[layer=2][K,V=2][token=4][kv_head=2][head_dim=8], C order, little-endian, the namespace dtype "
                     "(bf16: 2 bytes, the top half of an IEEE fp32; fp16: IEEE binary16; fp32: IEEE binary32). "
                     "Decoded output: identical layout and dtype.",
           "shape": list(SHAPE), "seed": SEED, "generator": "torch.Generator().manual_seed(seed); "
           "torch.randn(shape, generator=g, dtype=torch.float32) * 3, then .to(dtype)",
           "torch": torch.__version__, "numpy": np.__version__, "vectors": {}}
    for name, dtype, x in vectors:
        raw = to_bytes(x)
        entry = {"dtype": dtype, "input_hex": raw.hex(), "input_sha256": hashlib.sha256(raw).hexdigest()}
        open(os.path.join(out_dir, f"{name}.input.bin"), "wb").write(raw)
        for codec in ("int8", "int4"):
            q, scale = kv_codec.encode(x, codec)
            dec = to_bytes(kv_codec.decode(q, scale, x.dtype))
            ref = np_roundtrip(raw, dtype, kv_codec.QMAX[codec])
            assert dec == ref, f"{name} {codec}: torch and NumPy references differ"
            assert len(dec) == len(raw)
            open(os.path.join(out_dir, f"{name}.{codec}.bin"), "wb").write(dec)
            entry[f"{codec}_hex"] = dec.hex()
            entry[f"{codec}_sha256"] = hashlib.sha256(dec).hexdigest()
            entry[f"{codec}_q"] = q.reshape(-1, SHAPE[-1]).tolist()
            entry[f"{codec}_scale_f32_hex"] = [f"{v:08x}" for v in   # scales are >= 0: sign bit clear
                                               scale.reshape(-1).contiguous().view(torch.int32).tolist()]
            width = x.element_size()
            for kind in ("reciprocal", "ftz"):
                wrong = to_bytes(wrong_roundtrip(x, codec, kind))
                entry[f"{codec}_values_a_{kind}_implementation_gets_wrong"] = sum(
                    wrong[i:i + x.element_size()] != dec[i:i + x.element_size()]
                    for i in range(0, len(dec), x.element_size()))
            entry[f"{codec}_changed_values"] = sum(raw[i:i + width] != dec[i:i + width]
                                                   for i in range(0, len(raw), width))
        doc["vectors"][name] = entry
        print(name, {c: entry[f"{c}_sha256"][:16] for c in ("int8", "int4")},
              "changed values int8/int4:", entry["int8_changed_values"], entry["int4_changed_values"],
              "caught: reciprocal", [entry[f"{c}_values_a_reciprocal_implementation_gets_wrong"] for c in ("int8", "int4")],
              "ftz", [entry[f"{c}_values_a_ftz_implementation_gets_wrong"] for c in ("int8", "int4")])
    edge = doc["vectors"]["edge-bf16"]
    assert all(edge[f"{c}_values_a_{k}_implementation_gets_wrong"] > 0 for c in ("int8", "int4")
               for k in ("reciprocal", "ftz")), "edge-bf16 no longer catches a reciprocal or FTZ implementation"
    json.dump(doc, open(os.path.join(out_dir, "testvectors.json"), "w"), indent=1)
    print("wrote", out_dir, "(torch and NumPy references agree bit for bit)")


if __name__ == "__main__":
    main()
