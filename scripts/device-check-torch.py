#!/usr/bin/python3
# Run by scripts/device-check with the GPU machine's interpreter (the one whose torch has CUDA).
"""The Python side of scripts/device-check, on a machine with a GPU: the cake client and the PyTorch engine
through device regions over CUDA IPC, and, where `transformers` is importable, a Hugging Face LlamaForCausalLM
whose DynamicCache gets the loaded suffix spliced in. Each check prints one line and lands in --json; the exit
status is 1 if any failed.

1. engine-bitexact: the torch engine on cuda:N, compute-only, I/O-only, Cake and fixed splits, loaded chunks
   spliced into its cache on a side stream: KV cache and first-token logits bit-identical to full compute.
2. engine-demo: the engine's own demo (/usr/bin/python3 -m cake_torch_engine demo) on a larger model, compute-only,
   I/O-only and Cake time to first token, reads of the DRAM tier capped so loading takes as long as computing.
3. hf-dynamic-cache: LlamaForCausalLM from a small config with seeded random weights; its chunked prefill's KV
   is stored, then chunks [m, H) are loaded into a device region and spliced into a DynamicCache after
   computing [0, m): the first token equals full compute's (and whether the logits are bit-identical is shown).
4. vllm-splice: cake.vllm's split worker on Llama-3.1-8B geometry: a cake-mode load into a CUDA IPC region, the
   splice into a CUDA paged cache on the compute stream read at once by the next kernel (bit-exact), the load
   released only after the splice's event, and the splice's time at 8 to 64 chunks.
"""
import argparse
import json
import os
import sys
import tempfile
import time
import traceback

import torch

import cake
from cake_torch_engine import ModelConfig, TorchLlama, TorchPrefillEngine, same_bits


def check_engine_bitexact(client, device):
    model = TorchLlama(ModelConfig(layers=4, hidden=512, heads=8, kv_heads=2, intermediate=1024, vocab=512,
                                   seed=7, dtype="bf16"), device=device)
    prompt = [(i * 31 + 7) % 512 for i in range(128 * 12 + 17)]
    engine = TorchPrefillEngine(model, prompt, 128, client, region_kind="cuda")
    try:
        assert engine.region.kind == "cuda", f"the daemon gave a {engine.region.kind} region"
        truth = engine.compute_only()
        kv, logits = engine.cache.clone(), truth.logits.clone()
        engine.set_hint_from(truth)
        engine.store()
        modes = {}
        for run in (engine.io_only, engine.cake, lambda: engine.fixed_split(5), engine.compute_only):
            r = run()
            modes[r.mode] = {"exact": same_bits(engine.cache, kv) and same_bits(r.logits, logits),
                             "ttft_s": r.ttft_s, "meeting_chunk": r.meeting_chunk, "loaded": r.loaded_chunks}
        ok = all(m["exact"] for m in modes.values())
        return ok, {"modes": modes}
    finally:
        engine.close()


def check_engine_demo(socket, device, tokens, scratch):
    """The engine's own demo (/usr/bin/python3 -m cake_torch_engine demo) on a larger model, against this daemon's DRAM
    tier (started with a read cap, so the demo can set the balanced one)."""
    from cake_torch_engine.__main__ import main as engine_main
    out = os.path.join(scratch, "demo.json")
    status = engine_main(["demo", "--device", device, "--socket", socket, "--tokens", str(tokens), "--layers", "16",
                          "--hidden", "2048", "--heads", "16", "--kv-heads", "4", "--intermediate", "5632",
                          "--vocab", "1024", "--dtype", "bf16", "--chunk-tokens", "256", "--json", out])
    with open(out) as f:
        result = json.load(f)
    result["cake_over_better_baseline"] = result["cake_s"] / min(result["compute_only_s"], result["io_only_s"])
    return status == 0 and result["passed"], result


def check_hf_dynamic_cache(client, device):
    try:
        import transformers
        from cake_torch_engine.hf import check_splits
    except ImportError as error:
        return None, {"skipped": f"transformers is not importable here: {error}"}
    results = {f"split {m}": r for m, r in check_splits(client, device, splits=(0, 3, None)).items()}
    ok = all(r["first_token_equal"] for r in results.values())
    return ok, {"transformers": transformers.__version__, "splits": results}


def check_vllm_splice(client, device, chunk_counts=(8, 16, 32, 64)):
    """cake.vllm's split on the GPU (issue 29): a cake-mode load into a CUDA IPC region, then the splice of rows
    [F, H) into a CUDA paged KV cache (vLLM's FlashAttention layout [2, blocks, block, heads, dim], bf16) on the
    compute stream, followed at once by a kernel that reads those blocks, as the forward would: what it reads must
    equal the region's rows bit for bit (the splice ran before it, in stream order); the load is released only
    after the splice's CUDA event (SplitWorker keeps it until then). Llama-3.1-8B geometry: 32 layers, 8 KV heads of 128, chunks of 256
    tokens (32 MiB), blocks of 16. Times the splice alone (CUDA events) at 8 to 64 chunks. Also runs on "cpu"
    (host region, no events) to test the check itself."""
    from cake.split import LoadKey, Splice, SplitStart, SplitStep
    from cake.vllm import _PagedLayer
    from cake.vllm_split import SplitMetadata, SplitWorker
    layers, heads, dim, chunk, block = 32, 8, 128, 256, 16
    most = max(chunk_counts)
    ns = cake.Namespace("device-check:vllm-splice:llama-3.1-8b", num_layers=layers, num_kv_heads=heads,
                        head_dim=dim, dtype="bf16", chunk_tokens=chunk)
    kind = "cuda" if str(device).startswith("cuda") else "host"
    torch_device = torch.device(device)
    region = client.register_region(most * ns.chunk_bytes, kind=kind,
                                    device=torch_device.index or 0 if kind == "cuda" else 0)
    blocks_needed = most * chunk // block
    caches = {f"layer.{i}": torch.zeros(2, blocks_needed + 8, block, heads, dim, dtype=torch.bfloat16,
                                        device=torch_device) for i in range(layers)}
    paged = [_PagedLayer(name, cache) for name, cache in caches.items()]
    results = {}
    try:
        generator = torch.Generator(device="cpu").manual_seed(11)
        tokens = [(i * 13 + 5) % 32000 for i in range(most * chunk + 1)]
        flat = region.torch()
        source = torch.randn(most * ns.chunk_bytes // 2, generator=generator).to(torch.bfloat16)
        flat.view(torch.bfloat16)[:source.numel()].copy_(source.to(flat.device))
        client.store(ns, tokens=tokens[:most * chunk], first_chunk=0, chunk_count=most, region=region)

        def chunk_view(index):
            piece = region.torch()[index * ns.chunk_bytes:(index + 1) * ns.chunk_bytes]
            return piece.view(torch.bfloat16).view(layers, 2, chunk, heads, dim)

        for n in chunk_counts:
            worker = SplitWorker(client, ns, region, 0, block, paged, torch_device, chunk_view)
            key = LoadKey(f"r{n}", 1)
            end = n * chunk
            start = SplitStart(key.req_id, key.seq, 0, end, 0, n)
            worker.apply(SplitMetadata(SplitStep(starts=[start]), {key: (tuple(tokens[:end]), ns.model_id)}),
                         lambda model_id: ns)
            worker._loads[key].session.wait_done(timeout=120)  # every chunk lands (nothing computed: Progress 0)
            front = 40  # mid-chunk, mid-block: rows below it are left alone
            block_ids = tuple(range(8, 8 + end // block))  # the request's blocks 0.. live at ids 8..
            splice = Splice(key.req_id, key.seq, front, end, front // block, block_ids[front // block:])
            for cache in caches.values():
                cache.zero_()
            began, ended = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) \
                if kind == "cuda" else (None, None)
            if began is not None:
                began.record()
            t = time.perf_counter()
            worker.apply(SplitMetadata(SplitStep(splices=[splice]), {}), lambda model_id: ns)
            if ended is not None:
                ended.record()
            # The "forward": a kernel reading the spliced rows right after, on the same stream, before any wait.
            got = [cache[:, 8:8 + end // block].reshape(2, end, heads, dim)[:, front:].clone()
                   for cache in caches.values()]
            released_early = kind == "cuda" and key not in [load.key for load, _ in worker._copying]
            if kind == "cuda":
                torch.cuda.synchronize(torch_device)
            splice_s = began.elapsed_time(ended) / 1e3 if began is not None else time.perf_counter() - t
            # The source rows [front, end) of each layer, read back from the region through the load's offsets.
            load = ([pending for pending, _ in worker._copying] + worker._draining)[-1]
            views = [chunk_view(load.session.region_offset(c) // ns.chunk_bytes) for c in range(n)]
            exact = all(torch.equal(got[layer], torch.cat([v[layer] for v in views], dim=1)[:, front:])
                        for layer in range(layers))
            worker.meta()  # reaps: the load is released once its event has completed
            results[n] = {"splice_ms": splice_s * 1e3, "bit_exact": exact, "released_before_event": released_early,
                          "gb_per_s": (end - front) * ns.bytes_per_token / splice_s / 1e9}
            worker.shutdown()
        ok = all(r["bit_exact"] and not r["released_before_event"] for r in results.values())
        return ok, {"geometry": "Llama-3.1-8B (32 layers, 8 KV heads x 128, bf16), chunks of 256", "chunks": results}
    finally:
        client.release_region(region)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--demo-tokens", type=int, default=8192)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    device = f"cuda:{args.device}"
    torch.cuda.init()
    report, failed = {"gpu": torch.cuda.get_device_name(args.device), "torch": torch.__version__}, []
    scratch = tempfile.mkdtemp(prefix="cake-device-check-")
    with cake.Client(args.socket, client_id="device-check-torch") as client:
        checks = (("engine-bitexact", lambda: check_engine_bitexact(client, device)),
                  ("engine-demo", lambda: check_engine_demo(args.socket, device, args.demo_tokens, scratch)),
                  ("hf-dynamic-cache", lambda: check_hf_dynamic_cache(client, device)),
                  ("vllm-splice", lambda: check_vllm_splice(client, device)))
        for name, check in checks:
            began = time.perf_counter()
            try:
                ok, details = check()
            except Exception:
                ok, details = False, {"error": traceback.format_exc()}
            details["seconds"] = time.perf_counter() - began
            report[name] = details
            verdict = "skipped" if ok is None else ("ok" if ok else "FAILED")
            if ok is False:
                failed.append(name)
            print(f"{name}: {verdict} {json.dumps(details, default=str)}", flush=True)
    report["failed"] = failed
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
