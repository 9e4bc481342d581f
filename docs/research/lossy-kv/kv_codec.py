"""Reference lossy KV codec: symmetric absmax int8 / int4 per (layer, K/V, token, kv_head) group of head_dim values.

This is the exact math the C++ daemon is to implement; the decoded bytes must match this file bit for bit.

  encode (per group g of head_dim values x, in the namespace dtype: fp32, bf16 or fp16):
      xf    = float32(x)                          exact for every input dtype
      amax  = max(|xf|)                           fp32
      scale = amax / QMAX                         one IEEE fp32 division, round-to-nearest-even (QMAX = 127 or 7)
      q     = 0 for every element                 if scale == 0 (amax == 0, or an fp32 amax so small that
                                                  amax / QMAX underflows to 0)
      q     = clamp(rne(xf / scale), -QMAX, QMAX) otherwise: an IEEE fp32 division (NOT xf * (1/scale)), then
                                                  round-half-to-even to an integer (nearbyint / lrintf in the
                                                  default rounding mode; torch.round), then the clamp
  decode:
      y     = float32(q) * scale                  one IEEE fp32 multiply (no FMA involved: nothing is added)
      out   = to_dtype(y)                         round-to-nearest-even (torch's .to(torch.bfloat16) / .to(float16))

The C++ side must keep denormals (no FTZ/DAZ) and must not be built with -ffast-math (which would allow
xf * (1/scale) and reassociation). Inputs are assumed finite (KV from a working model always is); NaN/Inf groups
are not specified.

Layout: a chunk's KV is [layer][K,V][token][kv_head][head_dim]; since the group is the innermost head_dim run,
this module works on any tensor whose LAST dimension is head_dim, so it applies unchanged to Hugging Face's
[batch, kv_head, token, head_dim] caches too (the groups are the same sets of values).
"""
import torch

QMAX = {"int8": 127, "int4": 7}


def encode(x, codec):
    """x: tensor [..., head_dim] in fp32/bf16/fp16. Returns (q int8 [..., head_dim], scale fp32 [..., 1])."""
    qmax = QMAX[codec]
    xf = x.to(torch.float32)
    amax = xf.abs().amax(dim=-1, keepdim=True)
    scale = amax / torch.tensor(qmax, dtype=torch.float32)
    zero = scale == 0
    safe = torch.where(zero, torch.ones_like(scale), scale)
    q = torch.round(xf / safe)                      # torch.round: round half to even
    q = torch.clamp(q, -qmax, qmax)
    q = torch.where(zero, torch.zeros_like(q), q)
    return q.to(torch.int8), scale


def decode(q, scale, dtype):
    """Back to the namespace dtype: float32(q) * scale in fp32, then round-to-nearest-even."""
    return (q.to(torch.float32) * scale).to(dtype)


def roundtrip(x, codec):
    """decode(encode(x)) in x's dtype; codec "none" returns x unchanged (a copy)."""
    if codec == "none":
        return x.clone()
    q, scale = encode(x, codec)
    return decode(q, scale, x.dtype)


def bytes_per_value(codec, head_dim, dtype_bytes=2):
    """Stored bytes per KV value: the int payload plus one fp32 scale per head_dim group."""
    if codec == "none":
        return float(dtype_bytes)
    bits = {"int8": 8, "int4": 4}[codec]
    return (head_dim * bits / 8 + 4) / head_dim


def ratio(codec, head_dim, dtype_bytes=2):
    """Stored size relative to the raw dtype (int8 on bf16: (head_dim + 4) / (2 * head_dim))."""
    return bytes_per_value(codec, head_dim, dtype_bytes) / dtype_bytes


if __name__ == "__main__":
    # Self-check of the edge cases the spec names.
    x = torch.tensor([[127.0, 2.5, -2.5, 1.5, 0.5, -0.0, 0.0, -127.0]]).to(torch.bfloat16)
    q, s = encode(x, "int8")
    assert s.item() == 1.0 and q.tolist() == [[127, 2, -2, 2, 0, 0, 0, -127]], (q, s)
    x = torch.tensor([[14.0, 1.0, 3.0, 5.0, -5.0, 7.0, -14.0, 0.0]]).to(torch.bfloat16)
    q, s = encode(x, "int4")
    assert s.item() == 2.0 and q.tolist() == [[7, 0, 2, 2, -2, 4, -7, 0]], (q, s)
    q, s = encode(torch.zeros(1, 8, dtype=torch.bfloat16), "int8")
    assert s.item() == 0.0 and q.abs().sum().item() == 0
    assert decode(q, s, torch.bfloat16).abs().sum().item() == 0
    print("kv_codec self-check ok; ratios at head_dim 64 vs bf16: int8 %.4f, int4 %.4f"
          % (ratio("int8", 64), ratio("int4", 64)))
