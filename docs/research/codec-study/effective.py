"""Raw-equivalent load throughput (GB/s of KV delivered) for a tier of bandwidth B and a codec of ratio r, decode D
(one core): serial = read then decode on one thread; pipelined = reads overlap decodes, min(B*r, k*D) with k decode
cores. Numbers: cbench, SmolLM2 real KV, chunk_tokens 256."""
cases = {"none": (1.0, float("inf")),
         "bf16 zstd-1": (1.270, 1.21), "bf16 planes+zstd-1": (1.454, 1.95),
         "fp16 planes+zstd-1": (1.159, 2.15), "fp32 planes+zstd-1": (1.185, 2.61)}
print("| codec (real KV) | ratio | decode GB/s (1 core) | " + " | ".join(
    f"B={b}: serial / pipelined 1 core / 2 cores" for b in (1.5, 2.0, 3.0)) + " |")
print("|---|---|---|" + "---|" * 3)
for name, (r, d) in cases.items():
    cells = []
    for b in (1.5, 2.0, 3.0):
        serial = 1 / (1 / (b * r) + 1 / d)
        cells.append(f"{serial:.2f} / {min(b * r, d):.2f} / {min(b * r, 2 * d):.2f}")
    print(f"| {name} | {r:.3f} | {d if d != float('inf') else '-'} | " + " | ".join(cells) + " |")
