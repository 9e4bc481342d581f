"""Accuracy cost of the lossy KV codec on the project's PyTorch engine (cake_torch_engine.model.TorchLlama, seeded
RANDOM weights, default ModelConfig: 8 layers, hidden 512, 8 heads, 8 KV heads, head_dim 64, vocab 512; token =
byte). Its KV cache already has Cake's layout [layers, 2, tokens, kv_heads, head_dim].

For each prompt (prompts.py, windows of 256-1024 UTF-8 bytes) and suffix s:
  full   the engine's own compute: the prefix [0, n - s) in chunks of --chunk-tokens (like compute_only), then
         the suffix [n - s, n) as one chunk, then first_token_logits (the last position as one query against the
         whole cache; model.py is loaded from $CAKE_REPO, default /work/main). Those logits are the reference.
  reuse  a new cache whose rows [0, n - s) are kv_codec.roundtrip(full cache rows [0, n - s)) (codec none, int8,
         int4: the "loaded" chunks), then the same suffix chunk and first_token_logits.
The chunk boundaries are the same in both, so by the engine's design the "none" row must be bit-exact; the codec
rows then measure the codec alone.

Run (any python with torch; the cake venv's has sdpa, Debian's torch 1.13 uses the explicit attention):
  ~/.cache/cake/venv-*/bin/python eval_torch_engine.py --prompts 240 \
      --dtypes bf16 fp32 --suffixes 1 16 --out results_torch_engine.json
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_codec  # noqa: E402
import metrics  # noqa: E402
import prompts  # noqa: E402

# model.py needs only torch; load it by path, since the package's __init__ imports the cake client (and its gRPC
# stubs, which a checkout has only after a build).
_spec = importlib.util.spec_from_file_location(
    "cake_torch_engine_model", os.path.join(os.environ.get("CAKE_REPO", "/work/main"), "python/cake_torch_engine/model.py"))
_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_model)
ModelConfig, TorchLlama = _model.ModelConfig, _model.TorchLlama

CODECS = ["none", "int8", "int4"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=240)
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    p.add_argument("--suffixes", nargs="+", type=int, default=[1, 16])
    p.add_argument("--chunk-tokens", type=int, default=128)   # __main__.py's default
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results_torch_engine.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    ws = prompts.windows(lambda t: list(t.encode("utf-8")), args.prompts, seed=args.seed)
    lens = sorted(len(w) for _, _, w in ws)
    print(f"{len(ws)} prompts, bytes min/median/max {lens[0]}/{lens[len(lens) // 2]}/{lens[-1]}", flush=True)
    result = {"model": "cake_torch_engine TorchLlama, default ModelConfig, RANDOM seeded weights (seed 1)",
              "torch": torch.__version__, "threads": args.threads, "chunk_tokens": args.chunk_tokens,
              "prompts": len(ws), "prompt_tokens": {"min": lens[0], "median": lens[len(lens) // 2], "max": lens[-1]},
              "runs": {}}
    for dname in args.dtypes:
        model = TorchLlama(ModelConfig(dtype=dname), device="cpu", max_tokens=2048)
        c = model.config
        rows = {(s, codec): [] for s in args.suffixes for codec in CODECS}
        t0 = time.time()
        with torch.no_grad():
            for i, (_, _, prompt) in enumerate(ws):
                n = len(prompt)
                for s in args.suffixes:
                    cut = n - s
                    cache = model.new_cache(n)
                    for start in range(0, cut, args.chunk_tokens):
                        model.forward(prompt[start:min(start + args.chunk_tokens, cut)], start, cache)
                    stored = cache[:, :, :cut].clone()           # what the store would have kept
                    model.forward(prompt[cut:], cut, cache)
                    full = model.first_token_logits(prompt, cache)
                    for codec in CODECS:
                        cache2 = model.new_cache(n)
                        cache2[:, :, :cut] = kv_codec.roundtrip(stored, codec)
                        model.forward(prompt[cut:], cut, cache2)
                        r = metrics.compare(full, model.first_token_logits(prompt, cache2))
                        if codec != "none":
                            r["k_rel_err"] = metrics.rel_err(stored[:, 0], cache2[:, 0, :cut])
                            r["v_rel_err"] = metrics.rel_err(stored[:, 1], cache2[:, 1, :cut])
                        rows[(s, codec)].append(r)
                if (i + 1) % 40 == 0:
                    a8, a4 = rows[(args.suffixes[0], "int8")], rows[(args.suffixes[0], "int4")]
                    print(f"{dname} {i + 1}/{len(ws)} {time.time() - t0:.0f}s agree int8 "
                          f"{sum(r['agree'] for r in a8)}/{len(a8)} int4 {sum(r['agree'] for r in a4)}/{len(a4)}",
                          flush=True)
        dbytes = torch.finfo(model.dtype).bits // 8
        run = {"dtype": dname, "model_id": model.model_id(), "attention": model.attention, "layers": c.layers,
               "kv_heads": c.kv_heads, "head_dim": c.head_dim, "seconds": round(time.time() - t0, 1), "results": {}}
        for (s, codec), rs in rows.items():
            summ = metrics.summarize(rs)
            summ["bytes_per_value"] = kv_codec.bytes_per_value(codec, c.head_dim, dbytes)
            summ["ratio_vs_dtype"] = kv_codec.ratio(codec, c.head_dim, dbytes)
            run["results"][f"suffix{s}/{codec}/full"] = summ
            print(dname, f"suffix{s}", codec, json.dumps(summ), flush=True)
        result["runs"][dname] = run
        json.dump(result, open(args.out, "w"), indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
