"""How much a context model could beat order-0 coding of the bf16 MSB (sign+exponent) plane: H(hi) vs
H(hi | layer, K/V, kv_head, channel), on the real SmolLM2 KV (first 256-token chunk, and the whole prompt)."""
import numpy as np
a = np.fromfile("data/smollm2-fp32model-bf16.bin", dtype=np.uint16).reshape(30, 2, 4096, 3, 64)

def H(x):
    c = np.bincount(x.ravel(), minlength=256).astype(float); p = c[c > 0] / c.sum(); return -(p * np.log2(p)).sum()

for T in (256, 4096):
    hi = (a[:, :, :T] >> 8).astype(np.uint8)
    lo = (a[:, :, :T] & 0xff).astype(np.uint8)
    h0 = H(hi)
    # conditional on (layer, kv, head, channel): average of per-context entropies, weighted (equal counts)
    ctx = hi.transpose(0, 1, 3, 4, 2).reshape(-1, T)
    hc = np.mean([H(r) for r in ctx])
    hlo = H(lo)
    print(f"T={T}: H(hi)={h0:.3f}  H(hi|layer,kv,head,channel)={hc:.3f} (ignores the cost of per-context tables)  "
          f"H(lo)={hlo:.3f}  order-0 bound ratio {16/(h0+hlo):.3f}, per-channel bound {16/(hc+hlo):.3f}")
