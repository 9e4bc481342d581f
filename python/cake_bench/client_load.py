"""The Python client's I/O-only loads into a host region against the C++ client's (`cake-bench client-load`) on
the same prompt, the same daemon, in the same run, alternating so background load on a shared machine hits both
alike. Reports each client's median load time and throughput, the ratio (goals: the
Python client at least 0.90 of the C++ client's throughput with chunks of 8 MiB and more, and with 1 MiB chunks;
at least 0.50 with 64 KiB chunks), and Python's cost per loaded chunk: the added time per chunk over the C++ client
and the CPU time the Python process spends per chunk.

    /usr/bin/python3 -m cake_bench.client_load [--socket S] [--rounds 5] [--runs 3] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import cake
from cake.testing import SpawnedDaemon

# (name, layers, kv_heads, head_dim, chunk_tokens, chunks): fp32, so chunk bytes = 8 * layers * kv * dim * tokens.
SHAPES = [
    ("32 MiB chunks (Llama-3.1-8B, 256 tokens)", 32, 8, 128, 128, 32),   # 1 GiB, as cake-bench region
    ("8 MiB chunks", 32, 8, 128, 32, 64),                               # 512 MiB
    ("1 MiB chunks", 8, 8, 64, 32, 512),                                # 512 MiB
    ("64 KiB chunks (per-chunk cost)", 2, 2, 64, 32, 1024),             # 64 MiB
]


def cake_bench_path():
    explicit = os.environ.get("CAKE_BENCH")
    if explicit:
        return explicit
    built = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "cake-bench"))
    return built if os.access(built, os.X_OK) else (shutil.which("cake-bench") or built)


def python_load(client, ns, tokens, region, chunks):
    """One timed I/O-only load; returns (wall seconds, this process's CPU seconds)."""
    cpu = time.process_time()
    start = time.perf_counter()
    with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
        done = load.wait_done()
        elapsed = time.perf_counter() - start
        load.release()
    cpu = time.process_time() - cpu
    if done.loaded_chunks != chunks:
        raise RuntimeError(f"the Python client loaded {done.loaded_chunks} of {chunks} chunks")
    return elapsed, cpu


def cpp_loads(socket, ns, tokens_file, runs, scratch):
    out = os.path.join(scratch, "cpp.json")
    subprocess.run([cake_bench_path(), "client-load", "--socket", socket, "--tokens-file", tokens_file,
                    "--model-id", ns.model_id, "--layers", str(ns.num_layers), "--kv-heads", str(ns.num_kv_heads),
                    "--head-dim", str(ns.head_dim), "--chunk-tokens", str(ns.chunk_tokens), "--runs", str(runs),
                    "--json", out], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["seconds"]


def measure(client, socket, shape, rounds, runs, scratch):
    name, layers, kv, dim, tokens_per_chunk, chunks = shape
    ns = cake.Namespace(f"cake-bench-python/{layers}-{kv}-{dim}-{tokens_per_chunk}", num_layers=layers,
                        num_kv_heads=kv, head_dim=dim, dtype="fp32", chunk_tokens=tokens_per_chunk)
    rng = np.random.default_rng(chunks)
    tokens = rng.integers(0, 1 << 31, size=chunks * tokens_per_chunk, dtype=np.uint32)
    tokens_file = os.path.join(scratch, "tokens.u32")
    tokens.astype("<u4").tofile(tokens_file)
    tokens = tokens.tolist()
    nbytes = chunks * ns.chunk_bytes
    region = client.register_region(nbytes)
    try:
        view = region.numpy()
        pattern = (np.arange(nbytes, dtype=np.uint64) * np.uint64(2654435761) >> np.uint64(9)).astype(np.uint8)
        view[:] = pattern
        stored = client.store(ns, tokens=tokens, first_chunk=0, chunk_count=chunks, region=region)
        if stored.stored_chunks + stored.already_cached != chunks:
            raise RuntimeError(f"stored {stored} of {chunks} chunks")
        view[:] = 0
        python_load(client, ns, tokens, region, chunks)  # warm-up, then a check that the bytes landed
        if not np.array_equal(view, pattern):
            raise RuntimeError("the Python client's load left other bytes in the region than were stored")
        py, py_cpu, cpp = [], [], []
        for _ in range(rounds):
            # Each round starts with an untimed load, as cake-bench client-load's does: on this VM memory left idle
            # for a few seconds (while the other client ran) is slower again at first (docs/benchmarks.md).
            python_load(client, ns, tokens, region, chunks)
            for _ in range(runs):
                wall, cpu = python_load(client, ns, tokens, region, chunks)
                py.append(wall)
                py_cpu.append(cpu)
            cpp += cpp_loads(socket, ns, tokens_file, runs, scratch)
    finally:
        client.release_region(region)
    py_s, cpp_s = statistics.median(py), statistics.median(cpp)
    return {
        "shape": name, "chunks": chunks, "chunk_bytes": ns.chunk_bytes, "bytes": nbytes, "loads_each": len(py),
        "python_median_s": py_s, "cpp_median_s": cpp_s,
        "python_gbps": nbytes / py_s / 1e9, "cpp_gbps": nbytes / cpp_s / 1e9,
        "ratio": cpp_s / py_s,
        "python_added_us_per_chunk": (py_s - cpp_s) / chunks * 1e6,
        "python_cpu_us_per_chunk": statistics.median(py_cpu) / chunks * 1e6,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m cake_bench.client_load",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", help="a running caked (default: start a private one)")
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the two clients")
    parser.add_argument("--runs", type=int, default=3, help="loads of each client per round")
    parser.add_argument("--shapes", default="all", help="'all' or comma-separated indexes into the shape list")
    parser.add_argument("--one-chunk-per-message", action="store_true", help="the Python client asks for one "
                        "ChunkLoaded per message (no loaded_batch), as clients before it: gRPC Python's per-message "
                        "cost, measured")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    shapes = SHAPES if args.shapes == "all" else [SHAPES[int(i)] for i in args.shapes.split(",")]
    scratch = tempfile.mkdtemp(prefix="cake-bench-py-")
    daemon = None
    try:
        socket = args.socket
        if socket is None:
            need_mib = max(s[5] * 8 * s[1] * s[2] * s[3] * s[4] for s in shapes) * 2 // (1 << 20) + 256
            daemon = SpawnedDaemon(["--dram-capacity-mib", str(need_mib)])
            socket = daemon.socket_path
        rows = []
        with cake.Client(socket, accept_loaded_batch=not args.one_chunk_per_message) as client:
            print(f"python3 -m cake_bench.client_load: I/O-only loads from the DRAM tier into a host region, "
                  f"{args.rounds} rounds x {args.runs} loads per client, alternating; socket {socket}")
            print(f"  {'shape':42} {'chunks':>6} {'C++ GB/s':>9} {'Py GB/s':>9} {'Py/C++':>7} "
                  f"{'added us/chunk':>15} {'Py CPU us/chunk':>16}")
            for shape in shapes:
                r = measure(client, socket, shape, args.rounds, args.runs, scratch)
                rows.append(r)
                print(f"  {r['shape']:42} {r['chunks']:6d} {r['cpp_gbps']:9.2f} {r['python_gbps']:9.2f} "
                      f"{r['ratio']:7.3f} {r['python_added_us_per_chunk']:15.1f} {r['python_cpu_us_per_chunk']:16.1f}",
                      flush=True)
        # The goal is for the load cake-bench region measures (Llama-3.1-8B's 32 MiB chunks); smaller chunks show
        # what each ChunkLoaded message costs Python.
        goal_rows = [r for r in rows if r["chunk_bytes"] >= 8 << 20]
        worst = min(r["ratio"] for r in goal_rows) if goal_rows else float("nan")
        smallest = min(rows, key=lambda r: r["chunk_bytes"])
        print(f"  Python / C++ throughput with chunks of 8 MiB and more: worst {worst:.3f} (goal: at least 0.90) -> "
              f"{'met' if worst >= 0.90 else 'MISSED' if goal_rows else 'not measured'}")
        # Issue 30's goals for small chunks, which several landed chunks per message (loaded_batch) make reachable.
        small_goals = {}
        for size, goal in ((1 << 20, 0.90), (64 << 10, 0.50)):
            row = next((r for r in rows if r["chunk_bytes"] == size), None)
            if row is not None:
                label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
                small_goals[label] = {"ratio": row["ratio"], "goal": goal, "met": row["ratio"] >= goal}
                print(f"  Python / C++ throughput with {label} chunks: {row['ratio']:.3f} (goal: at least "
                      f"{goal:.2f}) -> {'met' if row['ratio'] >= goal else 'MISSED'}")
        print(f"  Python's cost per loaded chunk ({smallest['chunk_bytes'] >> 10} KiB chunks): "
              f"{smallest['python_cpu_us_per_chunk']:.1f} us of CPU, {smallest['python_added_us_per_chunk']:.1f} us "
              f"added to the load")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": rows, "worst_ratio_8mib_and_up": worst, "goal_ratio": 0.90,
                           "small_chunk_goals": small_goals, "rounds": args.rounds,
                           "runs": args.runs, "units": "GB/s = 1e9 bytes per second"}, f, indent=1)
        return 0
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
