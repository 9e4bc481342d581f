"""KV from the project's own PyTorch engine (cake_torch_engine.model.TorchLlama, seeded random weights, default
ModelConfig: 8 layers, 8 KV heads, head_dim 64), computed chunk by chunk like TorchPrefillEngine.compute_only
(model.forward(prompt[start:end], start, cache) for each chunk into model.new_cache(n)).

Prompt: the UTF-8 bytes of caked's README.md + docs/*.md (token = byte, vocab 512), first N tokens.
Run with /usr/bin/python3, PYTHONPATH=/work/main/python:/work/main/build/python.
"""
import glob, json, sys, time
import torch
from cake_torch_engine.model import ModelConfig, TorchLlama

torch.set_num_threads(1)
OUT = "/tmp/codec-study/data"
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
CHUNK = 256
text = b"".join(open(p, "rb").read() for p in ["/work/main/README.md"] + sorted(glob.glob("/work/main/docs/*.md")))
prompt = list(text[:N])

for dt in ["bf16", "fp32"]:
    model = TorchLlama(ModelConfig(dtype=dt), device="cpu", max_tokens=N)
    cache = model.new_cache(N)
    t0 = time.time()
    with torch.no_grad():
        for start in range(0, N, CHUNK):
            model.forward(prompt[start:start + CHUNK], start, cache)
    print(dt, model.model_id(), "prefill", round(time.time() - t0, 1), "s", tuple(cache.shape), flush=True)
    name = f"torchllama-{dt}"
    raw = cache.contiguous().view(torch.uint8).numpy().tobytes() if dt == "bf16" else cache.numpy().tobytes()
    open(f"{OUT}/{name}.bin", "wb").write(raw)
    json.dump({"name": name, "model": model.model_id() + " (random seeded weights)", "model_dtype": dt, "dtype": dt,
               "shape": list(cache.shape), "prompt": "bytes of caked README.md + docs/*.md",
               "absmax": float(cache.float().abs().max())}, open(f"{OUT}/{name}.json", "w"))
    print("wrote", name, len(raw), flush=True)
