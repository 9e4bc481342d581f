"""python3 -m cake_torch_engine demo|bench|queue: the PyTorch engine against caked.

demo   compute-only, I/O-only and Cake time to first token for one prompt (a file's bytes), its KV cache stored
       and loaded back from the disk tier with reads capped so that loading takes as long as computing; exits 1
       unless every mode's KV cache and first-token logits equal full compute's bit for bit.
bench  per prompt length and read cap: compute-only, I/O-only, Cake and every forced split (the engine computes
       [0, m), the daemon loads [m, H)); Cake against the best forced split (goal: at most 1.10) and its gain
       over the better baseline, every run bit-exact.
queue  requests arriving faster than the engine serves them (one at a time: a Cake load, then its decode), each
       prompt cached on the disk tier only; TTFT from arrival with and without prefetch (each arrival's Lookup asks
       the daemon to copy its prompt into DRAM while it waits), alternating, every run bit-exact.
"""
import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import torch

import cake
from cake.testing import SpawnedDaemon
from cake_torch_engine.engine import TorchPrefillEngine, same_bits
from cake_torch_engine.model import ModelConfig, TorchLlama


def add_model_options(p):
    d = ModelConfig()
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--intermediate", type=int, default=d.intermediate)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", default=d.dtype, choices=["fp32", "bf16", "fp16"])
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--device", default="cpu", help="cpu, or cuda:N (device regions over CUDA IPC)")
    p.add_argument("--attention", choices=["auto", "sdpa", "explicit"], default="auto",
                   help="torch's scaled_dot_product_attention (auto: where torch has it) or written out")
    p.add_argument("--threads", type=int, default=1,
                   help="the engine's CPU threads (the rest of the cores are the daemon's)")
    p.add_argument("--socket", help="a running caked with a disk tier (default: start a private one)")
    p.add_argument("--json", help="also write the results here")


def model_from(args):
    torch.set_num_threads(args.threads)
    config = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                         intermediate=args.intermediate, vocab=args.vocab, seed=args.seed, dtype=args.dtype)
    return TorchLlama(config, device=args.device, attention=args.attention)


class Daemon:
    """The caked to run against: the one on --socket, or a private one with a disk tier and a read cap."""

    def __init__(self, socket, dram_mib, scratch):
        self.spawned = None
        if socket is None:
            self.spawned = SpawnedDaemon(["--dram-capacity-mib", str(dram_mib), "--disk-root",
                                          os.path.join(scratch, "disk"), "--disk-read-gbps", "4"])
            socket = self.spawned.socket_path
        self.client = cake.Client(socket)
        self.from_disk = "tier_disk_chunks" in self.client.stats()
        self.capped_tier = "disk" if self.from_disk else "dram"

    def settle(self, chunks, timeout_s=120):
        """Waits until the write-back has put `chunks` chunks on disk (a no-op without a disk tier)."""
        if not self.from_disk:
            return
        deadline = time.monotonic() + timeout_s
        while self.client.stats()["tier_disk_chunks"] < chunks:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the disk tier did not reach {chunks} chunks within {timeout_s} s")
            time.sleep(0.05)

    def cold(self, run):
        """Runs a load with DRAM emptied first, so it comes from the disk tier."""
        if self.from_disk:
            self.client.evict("dram")
        return run()

    def close(self):
        self.client.close()
        if self.spawned is not None:
            self.spawned.stop()


def byte_prompt(path, tokens, vocab):
    data = open(path, "rb").read() if path else bytes(range(256))
    out = [b % vocab for b in data]
    while len(out) < tokens:
        out += out
    return out[:tokens]


def exact(engine, result, truth_kv, truth_logits):
    return same_bits(engine.cache, truth_kv) and same_bits(result.logits, truth_logits)


def loaded_rows_exact(engine, result, truth_kv):
    """The rows the run loaded (chunks [meeting, cached)) bit-identical to full compute's: the bytes the daemon
    delivered, whatever the device's arithmetic does with the rest."""
    start, end = result.meeting_chunk * engine.chunk_tokens, engine.full_chunks * engine.chunk_tokens
    return same_bits(engine.cache[:, :, start:end], truth_kv[:, :, start:end])


def demo_verdict(exact_modes, loaded_exact_modes, same_first_token_modes):
    """(passed, what was judged) for the demo's three modes, each argument a dict mode -> bool.

    Bit-identical KV and logits in every mode passes. When compute-only itself is not bit-identical to an earlier
    compute-only run of the same prompt, the device's arithmetic is not reproducible (seen on a GPU: its kernels
    may sum in another order from one run to the next), so the bits of what was computed cannot be the verdict;
    then every mode passes when its loaded rows are bit-identical and its first token is full compute's."""
    if all(exact_modes.values()):
        return True, "KV cache and first-token logits identical to full compute's in every mode"
    if exact_modes["compute-only"]:
        return False, "KV cache or first-token logits differ from full compute's while compute-only matches it"
    ok = all(loaded_exact_modes.values()) and all(same_first_token_modes.values())
    return ok, ("compute-only is not bit-identical to itself on this device, so judged by the loaded rows "
                f"(bit-identical in every mode: {'yes' if all(loaded_exact_modes.values()) else 'NO'}) and the "
                "first token (full compute's in every mode: "
                f"{'yes' if all(same_first_token_modes.values()) else 'NO'})")


def token_text(token):
    return f"{token} ({chr(token)!r})" if 32 <= token < 127 else str(token)


def demo(args):
    model = model_from(args)
    prompt = byte_prompt(args.prompt_file, args.tokens, args.vocab)
    scratch = tempfile.mkdtemp(prefix="cake-torch-demo-")
    kv_bytes = model.new_cache(1).numel() * model.new_cache(1).element_size() * len(prompt)
    daemon = Daemon(args.socket, kv_bytes * 2 // (1 << 20) + 256, scratch)
    engine = TorchPrefillEngine(model, prompt, args.chunk_tokens, daemon.client,
                                region_kind="cuda" if model.device.type == "cuda" else "host")
    try:
        print(f"cake_torch_engine demo: a PyTorch transformer on {model.device} ({model.config.describe()}, "
              f"{model.attention} attention, torch {torch.__version__}), "
              f"{len(prompt)}-token prompt{' from ' + args.prompt_file if args.prompt_file else ''}, "
              f"chunks of {args.chunk_tokens}")
        engine.compute_only()  # warm-up: the allocator's and the BLAS's first touches
        truth = engine.compute_only()
        truth_kv, truth_logits = engine.cache.clone(), truth.logits.clone()
        first, growth = engine.set_hint_from(truth)
        engine.store()
        daemon.settle(engine.full_chunks)
        stored_bits = engine.full_chunks * engine.ns.chunk_bytes * 8
        gbps = args.read_gbps or stored_bits / truth.ttft_s / 1e9
        daemon.client.set_read_cap(daemon.capped_tier, gbps)
        print(f"  KV cache {engine.full_chunks * engine.ns.chunk_bytes / 2**20:.1f} MiB in {engine.full_chunks} "
              f"chunks, loaded from {'the disk tier (DRAM emptied before each load)' if daemon.from_disk else 'DRAM'}"
              f" with reads capped at {gbps:.3g} Gbit/s"
              f"{'' if args.read_gbps else ' (loading the prompt takes as long as computing it)'}")
        print(f"  compute per chunk: {first * 1e3:.1f} ms + {growth * 1e3:.2f} ms x chunk index, sent as the hint")
        daemon.cold(engine.io_only)  # untimed: the planner measures the capped tier
        exact_modes, loaded_exact_modes = {}, {}

        def judge(mode, result):  # right after the run, while the cache holds what it left
            exact_modes[mode] = exact(engine, result, truth_kv, truth_logits)
            loaded_exact_modes[mode] = loaded_rows_exact(engine, result, truth_kv)
            return result

        computed = judge("compute-only", engine.compute_only())
        io = judge("I/O-only", daemon.cold(engine.io_only))
        cake_run = judge("Cake", daemon.cold(engine.cake))
        runs = {"compute-only": computed, "I/O-only": io, "Cake": cake_run}
        same_first_token_modes = {mode: result.first_token == truth.first_token for mode, result in runs.items()}
        print(f"  {'mode':13} {'TTFT s':>9}  {'first token':15}")
        print(f"  {'compute-only':13} {computed.ttft_s:9.3f}  {token_text(computed.first_token):15} "
              f"computed {computed.computed_chunks} chunks")
        print(f"  {'I/O-only':13} {io.ttft_s:9.3f}  {token_text(io.first_token):15} loaded {io.loaded_chunks} chunks")
        predicted = "-" if cake_run.predicted_meeting_chunk is None else str(cake_run.predicted_meeting_chunk)
        print(f"  {'Cake':13} {cake_run.ttft_s:9.3f}  {token_text(cake_run.first_token):15} met at chunk "
              f"{cake_run.meeting_chunk} (token {cake_run.meeting_chunk * args.chunk_tokens}), predicted {predicted};"
              f" computed {cake_run.computed_chunks}, loaded {cake_run.loaded_chunks}")
        print(f"  Cake speedup: {computed.ttft_s / cake_run.ttft_s:.2f}x over compute-only, "
              f"{io.ttft_s / cake_run.ttft_s:.2f}x over I/O-only")
        all_exact = all(exact_modes.values())
        passed, judged = demo_verdict(exact_modes, loaded_exact_modes, same_first_token_modes)
        print(f"  {judged}: {'yes' if passed else 'NO'}")
        if not all_exact:  # which: a compute-only run that differs says the GPU's arithmetic did, not the loads
            print("    bit-identical: " + ", ".join(f"{mode} {ok}" for mode, ok in exact_modes.items()))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"engine": "torch", "device": str(model.device), "model": model.config.describe(),
                           "tokens": len(prompt), "read_gbps": gbps,
                           "loaded_from": "disk" if daemon.from_disk else "dram",
                           "compute_only_s": computed.ttft_s, "io_only_s": io.ttft_s, "cake_s": cake_run.ttft_s,
                           "meeting_chunk": cake_run.meeting_chunk,
                           "predicted_meeting_chunk": cake_run.predicted_meeting_chunk,
                           "first_token": cake_run.first_token, "bitexact": all_exact, "passed": passed,
                           "verdict": judged, "exact_modes": exact_modes, "loaded_rows_exact": loaded_exact_modes,
                           "same_first_token": same_first_token_modes}, f, indent=1)
        return 0 if passed else 1
    finally:
        engine.close()
        daemon.close()


def bench(args):
    model = model_from(args)
    scratch = tempfile.mkdtemp(prefix="cake-torch-bench-")
    longest = max(args.tokens)
    per_token = model.new_cache(1).numel() * model.new_cache(1).element_size()
    daemon = Daemon(args.socket, per_token * longest * len(args.tokens) * 2 // (1 << 20) + 256, scratch)
    rows = []
    all_exact = True
    try:
        print(f"cake_torch_engine bench: a PyTorch transformer on {model.device} ({model.config.describe()}, "
              f"{model.attention} attention, torch {torch.__version__}), "
              f"chunks of {args.chunk_tokens}, {args.threads} thread(s); loads from "
              f"{'the disk tier, DRAM emptied before each' if daemon.from_disk else 'DRAM'}; median of "
              f"{args.repeats}")
        print(f"  {'tokens':>6} {'Gbit/s':>8} {'compute':>8} {'I/O':>8} {'Cake':>8} {'best m':>7} {'best s':>8} "
              f"{'meet':>9} {'Cake/best':>9} {'gain':>6}  strategy")
        for index, tokens in enumerate(args.tokens):
            prompt = [(i * 7 + index * 131 + (i * i) % 11) % args.vocab for i in range(tokens)]
            engine = TorchPrefillEngine(model, prompt, args.chunk_tokens, daemon.client,
                                        region_kind="cuda" if model.device.type == "cuda" else "host")
            try:
                engine.compute_only()
                truth = engine.compute_only()
                truth_kv, truth_logits = engine.cache.clone(), truth.logits.clone()
                engine.set_hint_from(truth)
                engine.store()
                daemon.settle(sum(-(-t // args.chunk_tokens) for t in args.tokens[:index + 1]))
                stored_bits = engine.full_chunks * engine.ns.chunk_bytes * 8
                for ratio in args.load_ratios:
                    gbps = stored_bits / (truth.ttft_s * ratio) / 1e9
                    daemon.client.set_read_cap(daemon.capped_tier, gbps)
                    daemon.cold(engine.io_only)  # the planner measures the new cap

                    def median_of(run):
                        nonlocal all_exact
                        results = []
                        for _ in range(args.repeats):
                            results.append(run())
                            all_exact &= exact(engine, results[-1], truth_kv, truth_logits)
                        return sorted(results, key=lambda r: r.ttft_s)[len(results) // 2]

                    computed = median_of(engine.compute_only)
                    io = median_of(lambda: daemon.cold(engine.io_only))
                    cake_run = median_of(lambda: daemon.cold(engine.cake))
                    forced = {}
                    for m in range(0, engine.full_chunks + 1, args.sweep_step):
                        forced[m] = median_of(lambda: daemon.cold(lambda: engine.fixed_split(m))).ttft_s
                    best_m = min(forced, key=forced.get)
                    better_baseline = min(computed.ttft_s, io.ttft_s)
                    row = {"tokens": tokens, "throttle_gbps": gbps, "load_ratio": ratio,
                           "ttft_compute_s": computed.ttft_s, "ttft_io_s": io.ttft_s, "ttft_cake_s": cake_run.ttft_s,
                           "ttft_best_forced_s": forced[best_m], "best_forced_chunk": best_m,
                           "meet_predicted": cake_run.predicted_meeting_chunk,
                           "meet_measured": cake_run.meeting_chunk, "strategy": cake_run.strategy,
                           "cake_computed_chunks": cake_run.computed_chunks,
                           "cake_loaded_chunks": cake_run.loaded_chunks,
                           "cake_over_best_forced": cake_run.ttft_s / forced[best_m],
                           "gain_over_better_baseline": better_baseline / cake_run.ttft_s}
                    rows.append(row)
                    meet = f"{cake_run.meeting_chunk}/{'-' if cake_run.predicted_meeting_chunk is None else cake_run.predicted_meeting_chunk}"
                    print(f"  {tokens:6d} {gbps:8.3f} {computed.ttft_s:8.3f} {io.ttft_s:8.3f} {cake_run.ttft_s:8.3f} "
                          f"{best_m:7d} {forced[best_m]:8.3f} {meet:>9} {row['cake_over_best_forced']:9.3f} "
                          f"{row['gain_over_better_baseline']:5.2f}x  {cake_run.strategy}", flush=True)
            finally:
                engine.close()
        worst = max(r["cake_over_best_forced"] for r in rows)
        print(f"\n  worst Cake / best forced split = {worst:.3f} (goal: at most 1.10) -> "
              f"{'met' if worst <= 1.10 else 'MISSED'}; gain over the better baseline "
              f"{min(r['gain_over_better_baseline'] for r in rows):.2f}x to "
              f"{max(r['gain_over_better_baseline'] for r in rows):.2f}x; every run bit-exact: "
              f"{'yes' if all_exact else 'NO'}")
        print("  meet: measured / predicted meeting chunk")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": model.config.describe(), "device": str(model.device), "threads": args.threads,
                           "worst_cake_over_best_forced": worst, "all_bitexact": all_exact, "rows": rows}, f,
                          indent=1)
        return 0 if all_exact else 1
    finally:
        daemon.close()


def serve_queue(daemon, engines, truths, arrivals_s, decode_s, prefetch):
    """One engine serving the requests in arrival order; returns (TTFT from arrival per request, all bit-exact,
    chunks the loads planned from DRAM)."""
    waiting = collections.deque()
    arrived = threading.Condition()
    errors = []
    start = time.monotonic()

    def arrive():
        for i, at in enumerate(arrivals_s):
            time.sleep(max(0.0, start + at - time.monotonic()))
            with arrived:
                waiting.append((i, time.monotonic()))
                arrived.notify()
            if prefetch:
                try:
                    daemon.client.lookup(engines[i].ns, tokens=engines[i].prompt, prefetch=True)
                except Exception as error:  # reported after the run; the engine goes on without it
                    errors.append(error)

    arrivals = threading.Thread(target=arrive, name="arrivals")
    arrivals.start()
    ttft, all_exact, from_dram = [], True, 0
    try:
        for _ in arrivals_s:
            with arrived:
                arrived.wait_for(lambda: waiting)
                i, at = waiting.popleft()
            dram_before = daemon.client.stats().get("tier_dram_reads_hit", 0)
            result = engines[i].cake()
            ttft.append(time.monotonic() - at)
            from_dram += daemon.client.stats().get("tier_dram_reads_hit", 0) - dram_before
            all_exact &= exact(engines[i], result, *truths[i])
            time.sleep(decode_s)  # the request's decode: the engine busy, the disk idle
    finally:
        arrivals.join()
    if errors:
        raise RuntimeError(f"a prefetch Lookup failed: {errors[0]}")
    return ttft, all_exact, from_dram


def queue(args):
    model = model_from(args)
    scratch = tempfile.mkdtemp(prefix="cake-torch-queue-")
    per_token = model.new_cache(1).numel() * model.new_cache(1).element_size()
    daemon = Daemon(args.socket, per_token * args.tokens * args.requests * 2 // (1 << 20) + 256, scratch)
    engines, truths = [], []
    region_kind = "cuda" if model.device.type == "cuda" else "host"
    try:
        if not daemon.from_disk:
            raise RuntimeError("the queue needs a daemon with a disk tier (the prompts are cached there only)")
        compute_s = []
        for i in range(args.requests):
            prompt = [(t * 7 + i * 131 + (t * t) % 11) % args.vocab for t in range(args.tokens)]
            engine = TorchPrefillEngine(model, prompt, args.chunk_tokens, daemon.client, region_kind=region_kind)
            engines.append(engine)
            if i == 0:
                engine.compute_only()  # warm-up
            truth = engine.compute_only()
            truths.append((engine.cache.clone(), truth.logits.clone()))
            compute_s.append(truth.ttft_s)
            engine.set_hint_from(truth)
            engine.store()
        daemon.settle(sum(e.full_chunks for e in engines))
        # Arrivals faster than the engine serves: `load` arrivals per service time (a cold Cake prefill from disk,
        # measured here, and the decode), Poisson, the same in every round and mode.
        cold_cake_s = daemon.cold(engines[0].cake).ttft_s
        service_s = cold_cake_s + args.decode_ms / 1e3
        gap_s = args.arrival_ms / 1e3 if args.arrival_ms else service_s / args.load
        rng = random.Random(args.seed)
        arrivals, at = [], 0.0
        for _ in range(args.requests):
            arrivals.append(at)
            at += rng.expovariate(1.0 / gap_s)
        print(f"cake_torch_engine queue: a PyTorch transformer on {model.device} ({model.config.describe()}, "
              f"{model.attention} attention), {args.requests} prompts of {args.tokens} tokens "
              f"({engines[0].full_chunks * engines[0].ns.chunk_bytes / 2**20:.1f} MiB of KV each) on the disk tier "
              f"only; prefill {statistics.median(compute_s):.3f} s compute-only, {cold_cake_s:.3f} s Cake from disk; "
              f"decode {args.decode_ms} ms; "
              f"arrivals every {gap_s * 1e3:.0f} ms on average", flush=True)
        ttfts = {False: [], True: []}
        exact_all, planned = True, {False: 0, True: 0}
        for round_index in range(args.rounds):
            for prefetch in (False, True):
                daemon.client.evict("dram")
                ttft, ok, from_dram = serve_queue(daemon, engines, truths, arrivals, args.decode_ms / 1e3, prefetch)
                ttfts[prefetch] += ttft
                exact_all &= ok
                planned[prefetch] += from_dram
                print(f"  round {round_index + 1} {'with' if prefetch else 'without'} prefetch: TTFT mean "
                      f"{statistics.mean(ttft):.3f} s, worst {max(ttft):.3f} s; {from_dram} chunks read from DRAM; "
                      f"bit-exact: {'yes' if ok else 'NO'}", flush=True)
        mean = {k: statistics.mean(v) for k, v in ttfts.items()}
        print(f"  mean TTFT: {mean[False]:.3f} s without prefetch, {mean[True]:.3f} s with "
              f"({mean[True] / mean[False]:.2f}x); every run bit-exact: {'yes' if exact_all else 'NO'}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"model": model.config.describe(), "requests": args.requests, "tokens": args.tokens,
                           "rounds": args.rounds, "gap_s": gap_s, "decode_ms": args.decode_ms,
                           "ttft_mean_s_without": mean[False], "ttft_mean_s_with": mean[True],
                           "ttft_max_s_without": max(ttfts[False]), "ttft_max_s_with": max(ttfts[True]),
                           "dram_reads_without": planned[False], "dram_reads_with": planned[True],
                           "bitexact": exact_all}, f, indent=1)
        return 0 if exact_all else 1
    finally:
        for engine in engines:
            engine.close()
        daemon.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m cake_torch_engine", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="compute-only, I/O-only and Cake TTFT for one prompt")
    add_model_options(d)
    d.add_argument("--prompt-file", help="the prompt is this file's bytes (default: bytes 0..255 repeated)")
    d.add_argument("--tokens", type=int, default=3072, help="prompt length in tokens")
    d.add_argument("--read-gbps", type=float, help="read cap in Gbit/s (default: loading takes as long as computing)")
    b = commands.add_parser("bench", help="Cake against every forced split over prompt lengths and read caps")
    add_model_options(b)
    b.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 2048])
    b.add_argument("--load-ratios", type=lambda s: [float(x) for x in s.split(",")], default=[0.5, 1.0, 2.0],
                   help="read caps at which loading the prompt takes this many times computing it")
    b.add_argument("--sweep-step", type=int, default=1, help="forced meeting points every N chunks")
    b.add_argument("--repeats", type=int, default=1, help="runs of each mode per cell; the median is reported")
    q = commands.add_parser("queue", help="queued requests, prompts on disk: TTFT with and without prefetch")
    add_model_options(q)
    q.add_argument("--requests", type=int, default=8, help="requests per round and mode (distinct prompts)")
    q.add_argument("--tokens", type=int, default=1024, help="each prompt's length in tokens")
    q.add_argument("--decode-ms", type=int, default=200, help="the engine's time per request after its prefill")
    q.add_argument("--load", type=float, default=1.5,
                   help="arrivals per service time (above 1: the queue grows); ignored with --arrival-ms")
    q.add_argument("--arrival-ms", type=float, help="mean gap between arrivals instead")
    q.add_argument("--rounds", type=int, default=2, help="rounds of each mode, alternating")
    args = parser.parse_args(argv)
    return {"demo": demo, "bench": bench, "queue": queue}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
