"""Time to first token of Cake's peers on a real vLLM engine: plain vLLM and vLLM's own KV offloading.

    python -m cake_bench.vllm_peers --peer {plain,offload-cpu,offload-fs} --model DIR --prompt-tokens N \\
        --batched-tokens B --reps R --json OUT [--block-size 32]

Run by cake_bench.vllm_ttft, one peer per process (a fresh engine each), with its model, prompt, warm-up prompt and
engine settings, so the numbers compare with Cake's:
- plain: no KV connector, prefix caching off: every run computes the whole prompt.
- offload-cpu: vLLM's OffloadingConnector, spec CPUOffloadingSpec (its CPU tier). One generate stores the prompt's
  KV; each timed run first empties the engine's own prefix cache, so only the tier can serve the prompt.
- offload-fs: the same connector, spec TieringOffloadingSpec: a CPU primary tier with an "fs" secondary tier in a
  temporary folder. Each timed run also empties the CPU tier (reset_connector=True keeps secondary tiers), so the
  files must serve the prompt.
Each timed run is generate(max_tokens=1) of the prompt. A load is proved by the request's num_cached_tokens (the
engine's own prefix cache was emptied, so every cached token came through the connector) and by vLLM's
kv_offload metrics. A peer that this vLLM cannot run is not this module's failure: the root cause goes into
"error" and it exits 0, for the caller to report.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback

PEERS = ("plain", "offload-cpu", "offload-fs")


def connector_config(peer, block_size, fs_root):
    """kv_connector_extra_config of vLLM's OffloadingConnector for this peer (None: no connector)."""
    if peer == "plain":
        return None
    # The CPU tier's size; 1 GiB holds many prompts of the bench's small models. "block_size" is the tier's chunk
    # in tokens: the engine's block, so every full block of the prompt is offloaded and can be loaded.
    config = {"spec_name": "CPUOffloadingSpec", "cpu_bytes_to_use": 1 << 30, "block_size": block_size}
    if peer == "offload-fs":
        config.update(spec_name="TieringOffloadingSpec", secondary_tiers=[{"type": "fs", "root_dir": fs_root}])
    return config


def metric_sums(llm):
    """vLLM's kv_offload / external prefix cache counters, summed over labels (empty if stats are off)."""
    sums = {}
    for m in llm.get_metrics():
        if ("kv_offload" in m.name or "external_prefix_cache" in m.name) and hasattr(m, "value"):
            sums[m.name] = sums.get(m.name, 0) + m.value
    return sums


def root_cause(log_text, exc):
    """The first traceback's raising frame and exception (the root cause: vLLM's worker and engine core processes
    log theirs, then re-raise wrapped), followed by each distinct wrapping exception, ending with `exc`'s."""
    # Drop vLLM's "(Worker pid=1) ERROR 12-07 18:31:02 [file.py:1] " line prefixes.
    lines = [re.sub(r"^\(\S+ pid=\d+\) (\w+ [\d-]+ [\d:]+ \[\S+\] )?", "", x) for x in log_text.splitlines()]
    found = []  # (raising frame, exception line) per traceback
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            frame, j = [], i + 1
            while j < len(lines) and lines[j].startswith(" "):
                if lines[j].startswith("  File "):
                    frame = [lines[j], lines[j + 1] if j + 1 < len(lines) else ""]
                j += 1
            # The exception line; other processes' log lines may come first (their output interleaves).
            cause = next((x for x in lines[j:j + 5] if re.match(r"[A-Za-z_][\w.]*: ", x)), None)
            if cause:
                found.append((frame, cause))
    out = found[0][0] + [found[0][1]] if found else []
    for _, line in found[1:] + [([], f"{type(exc).__name__}: {exc}")]:
        if line not in out:
            out.append(line)
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peer", choices=PEERS, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt-tokens", type=int, required=True)
    parser.add_argument("--batched-tokens", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", required=True)
    parser.add_argument("--block-size", type=int, default=32)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    work = tempfile.mkdtemp(prefix="cake-vllm-peers-")
    result = {"peer": args.peer, "runs": [], "median": None, "first_tokens": [], "error": None, "notes": ""}
    notes = []
    # vLLM's engine core is a child process that inherits fds 1 and 2 (vLLM logs to stdout); when it fails to start,
    # the parent only raises "Engine core initialization failed. See root cause above". Send both to a file while
    # the engine starts (the children keep writing there), so the root cause can be quoted; show_log copies what is
    # new to stderr. A file, not a pipe: the children can never block on it.
    log_path = os.path.join(work, "engine.log")
    saved = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    shown = 0

    def show_log():
        nonlocal shown
        with open(log_path, "rb") as f:
            f.seek(shown)
            data = f.read()
        shown += len(data)
        os.write(saved[1], data)
        return data.decode(errors="replace")

    try:
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
        from vllm.inputs import TokensPrompt
        extra = connector_config(args.peer, args.block_size, os.path.join(work, "fs-tier"))
        if extra is not None:
            notes.append(f"OffloadingConnector kv_connector_extra_config={json.dumps(extra)}")
        kv = None if extra is None else KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                                         kv_connector_extra_config=extra)
        sys.stdout.flush(), sys.stderr.flush()
        os.dup2(log_fd, 1), os.dup2(log_fd, 2)
        try:
            started = time.monotonic()
            # As vllm_ttft builds its engine; the offloading connector keys its chunks by the prefix cache's block
            # hashes, so it needs prefix caching on; plain has it off so that nothing is ever reused. Stats on for
            # the kv_offload counters.
            llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="bfloat16",
                      max_model_len=args.prompt_tokens + 64, max_num_batched_tokens=args.batched_tokens,
                      enforce_eager=True, seed=0, block_size=args.block_size, enable_prefix_caching=kv is not None,
                      kv_transfer_config=kv, disable_log_stats=kv is None)
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            show_log()
        print(f"{args.peer}: vLLM engine up in {time.monotonic() - started:.1f} s", flush=True)
        prompt = [(i * 7919 + 13) % 1000 + 3 for i in range(args.prompt_tokens)]
        warm = [(i * 31 + 5) % 1000 + 3 for i in range(args.prompt_tokens)]
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

        def generate(tokens):
            return llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)[0]

        def empty_caches():
            # The engine's prefix cache must not serve the prompt (it refuses while blocks are held: retry). For
            # offload-fs also the CPU primary tier, so that the fs tier must; secondary tiers survive the reset.
            deadline = time.monotonic() + 60
            while not llm.reset_prefix_cache(reset_connector=args.peer == "offload-fs"):
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM's prefix cache could not be emptied within 60 s")
                time.sleep(0.05)

        generate(warm)
        if extra is not None:
            # Store. Stores run asynchronously, the last blocks' store job is only made on the engine's next step,
            # and finished transfers are only counted on steps: drive steps with a one-block request until the
            # kv_offload counters (store bytes; the fs tier's write bytes too) have grown and then stop changing.
            before = metric_sums(llm)
            t = time.monotonic()
            generate(prompt)
            filler = [(i * 17 + 1) % 1000 + 3 for i in range(args.block_size)]
            last, deadline = None, time.monotonic() + 60
            while time.monotonic() < deadline:
                generate(filler)
                time.sleep(0.2)
                now = metric_sums(llm)
                if now == last and any(now.get(k, 0) > before.get(k, 0) for k in now if "store" in k or "write" in k):
                    break
                last = now
            notes.append(f"store took {time.monotonic() - t:.2f} s; counters after it: {now}")
        loaded = []
        for _ in range(args.reps):
            empty_caches()
            t = time.monotonic()
            out = generate(prompt)
            result["runs"].append(time.monotonic() - t)
            result["first_tokens"].append(out.outputs[0].token_ids[0])
            loaded.append(out.num_cached_tokens)
        result["median"] = statistics.median(result["runs"])
        notes.append(f"tokens served from cache per timed run (num_cached_tokens): {loaded}")
        if extra is not None:
            notes.append(f"counters at the end: {metric_sums(llm)}")
            if min(loaded) == 0:
                notes.append("WARNING: a timed run loaded nothing from the tier: it computed the whole prompt")
        empty_caches()  # let in-flight transfers finish before the engine shuts down
    except Exception as exc:  # a peer this vLLM cannot run: report it, the caller decides
        traceback.print_exc()
        show_log()
        # A failed engine start is explained in the engine core's log; anything else by this process's traceback.
        with open(log_path, errors="replace") as f:
            log_text = f.read() if "root cause" in str(exc) else traceback.format_exc()
        result["error"] = root_cause(log_text, exc)
    show_log()
    shutil.rmtree(work, ignore_errors=True)  # the log and the fs tier's files (the engine is idle by now)
    result["notes"] = "; ".join(notes)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    if result["error"]:
        cause = next(x for x in result["error"].splitlines() if not x.startswith(" "))
        print(f"{args.peer}: cannot run: {cause}", flush=True)
    else:
        print(f"{args.peer}: TTFT median of {args.reps} {result['median']:.3f} s, runs "
              f"{' '.join(f'{x:.3f}' for x in result['runs'])} s, first tokens {result['first_tokens']}; "
              f"cached tokens per run {loaded}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
