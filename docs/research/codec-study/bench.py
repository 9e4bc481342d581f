"""Lossless codecs on KV-cache chunks, single core.

Usage: /usr/bin/python3 bench.py [reps] [data names...]  (Debian's python3-zstandard / python3-lz4: libzstd 1.5.4 and
liblz4 1.9.4, the same libraries libzstd-dev / liblz4-dev would link a C++ daemon against).

A chunk is the KV of chunk_tokens consecutive tokens for all layers, in Cake's layout
[layer][K,V][token][kv_head][head_dim] (cake.ChunkLayout), i.e. kv[:, :, c*ct:(c+1)*ct] made contiguous.
Each scheme encodes every chunk independently; throughput is raw bytes / seconds for all chunks of a data set,
median over `reps` repetitions, on one thread. Results go to results.json.
"""
import json, os, statistics, sys, time
import numpy as np
import zstandard
import lz4.block
import lz4.frame

DATA = "/tmp/codec-study/data"
REPS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
ONLY = sys.argv[2:]
RAW_THRESHOLD = 0.97   # adaptive variant: a plane is stored raw unless it shrinks below 97% of its size

zc = {lvl: zstandard.ZstdCompressor(level=lvl) for lvl in (1, 3)}
zd = zstandard.ZstdDecompressor()


# --- byte planes --------------------------------------------------------------------------------------------------
def to_planes(buf, esize):
    """bytes of little-endian esize-byte elements -> one bytes object: plane of the most significant bytes first,
    ..., least significant last."""
    a = np.frombuffer(buf, dtype=np.uint8).reshape(-1, esize)
    return np.ascontiguousarray(a[:, ::-1].T).tobytes()


def from_planes(buf, esize):
    a = np.frombuffer(buf, dtype=np.uint8).reshape(esize, -1)
    return np.ascontiguousarray(a.T[:, ::-1]).tobytes()


# --- schemes: (encode(chunk) -> payload, decode(payload) -> chunk) -------------------------------------------------
def zstd_raw(lvl):
    c = zc[lvl]
    return (lambda b, e: c.compress(b)), (lambda p, e, n: zd.decompress(p))


def lz4_block():
    return (lambda b, e: lz4.block.compress(b, mode="default", store_size=True)), \
           (lambda p, e, n: lz4.block.decompress(p))


def lz4_frame():
    return (lambda b, e: lz4.frame.compress(b)), (lambda p, e, n: lz4.frame.decompress(p))


def planes_concat(enc, dec):
    """Shuffle into planes, compress the concatenation as one frame."""
    return (lambda b, e: enc(to_planes(b, e))), (lambda p, e, n: from_planes(dec(p), e))


def planes_separate(enc, dec, adaptive):
    """Shuffle, compress each plane as its own frame; adaptive: a plane that does not shrink is stored raw."""
    def encode(b, e):
        a = np.frombuffer(b, dtype=np.uint8).reshape(-1, e)
        out = []
        for k in range(e - 1, -1, -1):
            plane = np.ascontiguousarray(a[:, k]).tobytes()
            p = enc(plane)
            if adaptive and len(p) > RAW_THRESHOLD * len(plane):
                out.append((False, plane))
            else:
                out.append((True, p))
        return out

    def decode(parts, e, n):
        a = np.empty((n // e, e), dtype=np.uint8)
        for i, (compressed, p) in enumerate(parts):
            plane = dec(p) if compressed else p
            a[:, e - 1 - i] = np.frombuffer(plane, dtype=np.uint8)
        return a.tobytes()
    return encode, decode


z1 = lambda b: zc[1].compress(b)
lz = lambda b: lz4.block.compress(b, mode="default", store_size=True)
SCHEMES = {
    "zstd-1": zstd_raw(1),
    "zstd-3": zstd_raw(3),
    "lz4 (block, default)": lz4_block(),
    "lz4 (frame, default)": lz4_frame(),
    "planes(concat)+zstd-1": planes_concat(z1, zd.decompress),
    "planes(separate)+zstd-1": planes_separate(z1, zd.decompress, adaptive=False),
    "planes(separate, raw if <3%)+zstd-1": planes_separate(z1, zd.decompress, adaptive=True),
    "planes(concat)+lz4": planes_concat(lz, lz4.block.decompress),
    "planes(separate, raw if <3%)+lz4": planes_separate(lz, lz4.block.decompress, adaptive=True),
    "shuffle only (no codec)": ((lambda b, e: to_planes(b, e)), (lambda p, e, n: from_planes(p, e))),
}


def size(payload):
    if isinstance(payload, (bytes, bytearray)):
        return len(payload)
    return sum(len(p) + 1 for _, p in payload)   # +1: a flag per plane


def entropy_bits(arr):
    counts = np.bincount(arr, minlength=256).astype(np.float64)
    p = counts[counts > 0] / arr.size
    return float(-(p * np.log2(p)).sum())


def load(name):
    meta = json.load(open(f"{DATA}/{name}.json"))
    dt = meta["dtype"]
    np_dt = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}[dt]
    arr = np.fromfile(f"{DATA}/{name}.bin", dtype=np_dt).reshape(meta["shape"])
    return meta, arr


def chunks_of(arr, ct):
    n = arr.shape[2] // ct
    return [np.ascontiguousarray(arr[:, :, c * ct:(c + 1) * ct]).tobytes() for c in range(n)]


def bench(name, arr, esize, ct, meta):
    chunks = chunks_of(arr, ct)
    raw = sum(len(c) for c in chunks)
    flat = np.frombuffer(b"".join(chunks[:4]), dtype=np.uint8).reshape(-1, esize)
    ent = [round(entropy_bits(flat[:, k]), 3) for k in range(esize - 1, -1, -1)]  # MSB plane first
    row = {"data": name, "dtype": meta["dtype"], "chunk_tokens": ct, "chunks": len(chunks),
           "chunk_bytes": len(chunks[0]), "raw_bytes": raw, "model": meta["model"],
           "plane_entropy_bits_msb_first": ent, "order0_bound_ratio": round(8 * esize / sum(ent), 3), "schemes": {}}
    print(f"\n== {name} chunk_tokens={ct}: {len(chunks)} chunks of {len(chunks[0])} B; "
          f"plane entropy (MSB first) {ent} bits/byte", flush=True)
    for sname, (enc, dec) in SCHEMES.items():
        payloads = [enc(c, esize) for c in chunks]
        for c, p in zip(chunks, payloads):          # round trip, bit for bit
            assert dec(p, esize, len(c)) == c, (name, sname)
        ratios = [len(c) / size(p) for c, p in zip(chunks, payloads)]
        enc_t, dec_t = [], []
        for _ in range(REPS):
            t0 = time.perf_counter()
            for c in chunks:
                enc(c, esize)
            enc_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for c, p in zip(chunks, payloads):
                dec(p, esize, len(c))
            dec_t.append(time.perf_counter() - t0)
        r = {"ratio_aggregate": raw / sum(size(p) for p in payloads), "ratio_median_chunk": statistics.median(ratios),
             "ratio_min_chunk": min(ratios), "ratio_max_chunk": max(ratios),
             "encode_GBps": raw / statistics.median(enc_t) / 1e9, "decode_GBps": raw / statistics.median(dec_t) / 1e9}
        row["schemes"][sname] = r
        print(f"  {sname:40s} ratio {r['ratio_aggregate']:.3f} (median chunk {r['ratio_median_chunk']:.3f}, "
              f"min {r['ratio_min_chunk']:.3f})  enc {r['encode_GBps']:.2f} GB/s  dec {r['decode_GBps']:.2f} GB/s",
              flush=True)
    return row


def main():
    names = ONLY or ["smollm2-bf16model-bf16", "smollm2-fp32model-bf16", "smollm2-fp32model-fp16",
                     "smollm2-fp32model-fp32", "torchllama-bf16", "torchllama-fp32", "torchllama-fp32-as-fp16"]
    print("zstd", zstandard.ZSTD_VERSION, "lz4", lz4.library_version_string(), "numpy", np.__version__,
          "loadavg", os.getloadavg(), flush=True)
    out_path = "/tmp/codec-study/results.json"
    results = json.load(open(out_path)) if os.path.exists(out_path) else []
    for name in names:
        meta, arr = load(name)
        esize = arr.dtype.itemsize
        for ct in (256, 64):
            row = bench(name, arr, esize, ct, meta)
            row["loadavg"] = os.getloadavg()
            results = [x for x in results if not (x["data"] == name and x["chunk_tokens"] == ct)] + [row]
            json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main()
