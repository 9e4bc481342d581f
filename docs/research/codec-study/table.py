"""Prints cresults.jsonl (cbench) as markdown tables: ratio / encode GB/s / decode GB/s per scheme and data set."""
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/codec-study/cresults.jsonl")]
for r in rows:
    print(f"\n**{r['data']}**, chunk_tokens {r['chunk_tokens']}: {r['chunks']} chunks x {r['chunk_bytes']/2**20:.2f} MiB "
          f"(zstd {r['zstd']}, lz4 {r['lz4']}, loadavg {r['loadavg']})\n")
    print("| scheme | ratio (aggregate) | ratio min..max chunk | encode GB/s | decode GB/s |\n|---|---|---|---|---|")
    for n, s in r["schemes"].items():
        print(f"| {n} | {s['ratio_aggregate']:.3f} | {s['ratio_min_chunk']:.3f}..{s['ratio_max_chunk']:.3f} | "
              f"{s['encode_GBps']:.2f} | {s['decode_GBps']:.2f} |")
