"""decode(encode()) of real KV by caked's C++ codec (check_cpp_codec --roundtrip) against kv_codec.py, bit for bit.
Input: the KV dumps of the lossless-codec study (/tmp/codec-study/data/*.bin + .json, docs/research/codec-study),
[layers, 2, tokens, kv_heads, head_dim], cut into chunks of --chunk-tokens like the daemon stores them.
Run: ~/.cache/cake/venv-*/bin/python compare_cpp_on_real_kv.py /tmp/check_cpp_codec /tmp/codec-study/data/smollm2-bf16model-bf16
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_codec  # noqa: E402

TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def main():
    exe, stem = sys.argv[1], sys.argv[2]
    chunk_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    meta = json.load(open(stem + ".json"))
    L, _, T, H, D = meta["shape"]
    dt = meta["dtype"]
    raw = np.fromfile(stem + ".bin", dtype=np.uint8)
    kv = torch.from_numpy(raw).view(TORCH[dt]).reshape(L, 2, T, H, D)
    chunks = min(T // chunk_tokens, 4)
    with tempfile.TemporaryDirectory() as tmp:
        for c in range(chunks):
            x = kv[:, :, c * chunk_tokens:(c + 1) * chunk_tokens].contiguous()
            src = os.path.join(tmp, "in.bin")
            x.view(torch.uint8).numpy().tofile(src)
            for codec in ("int8", "int4"):
                out = os.path.join(tmp, "out.bin")
                subprocess.run([exe, "--roundtrip", src, dt, str(L), str(H), str(D), str(chunk_tokens), codec, out],
                               check=True)
                got = np.fromfile(out, dtype=np.uint8)
                want = kv_codec.roundtrip(x, codec).view(torch.uint8).numpy().reshape(-1)
                diff = int((got != want).sum())
                print(f"{os.path.basename(stem)} chunk {c} ({x.numel()} values) {codec}: "
                      f"{'identical' if diff == 0 else f'{diff} bytes differ'}", flush=True)
                assert diff == 0


if __name__ == "__main__":
    main()
