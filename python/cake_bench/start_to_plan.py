"""A load's fixed cost from Python: Start to Plan through Client.load (on the stream opened ahead) and on a
stream opened for the load, against a Ping, in alternating blocks on one daemon.

    /usr/bin/python3 -m cake_bench.start_to_plan [--calls 600] [--json FILE]

Starts a private caked from CAKE_CAKED or next to the build. The prompt is 64 engine chunk keys nothing holds, so
the Plan is compute-only and no read follows: what is timed is the stream, the lookup and the plan."""
import argparse
import json
import time

from cake.load import LoadSession
from cake.namespace import Namespace
from cake.testing import SpawnedDaemon
from cake.v1 import kv_pb2


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m cake_bench.start_to_plan",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600, help="timed calls of each kind (default 600)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    ns = Namespace("cake-plan-bench", num_layers=1, num_kv_heads=1, head_dim=8, dtype="bf16", chunk_tokens=256)
    keys = [b"%016d" % i for i in range(64)]
    with SpawnedDaemon(["--dram-capacity-mib", "64"]) as daemon, daemon.client() as client:
        def ahead():
            started = time.perf_counter()
            load = client.load(ns, chunk_keys=keys)
            load.wait_plan(10)
            elapsed = time.perf_counter() - started
            load.release()
            return elapsed

        def fresh():
            start = kv_pb2.LoadStart(client_id=client.client_id, namespace=ns.to_proto(),
                                     mode=kv_pb2.LoadStart.MODE_CAKE)
            start.prompt.chunk_keys.extend(keys)
            started = time.perf_counter()
            load = LoadSession(client._kv, start, chunk_bytes=ns.chunk_bytes)
            load.wait_plan(10)
            elapsed = time.perf_counter() - started
            load.release()
            return elapsed

        def ping():
            started = time.perf_counter()
            client.ping()
            return time.perf_counter() - started

        kinds = {"ahead": ahead, "fresh": fresh, "ping": ping}
        samples = {name: [] for name in kinds}
        blocks = 10
        for _ in range(blocks):
            for name, call in kinds.items():
                for i in range(5 + args.calls // blocks):
                    elapsed = call()
                    if i >= 5:
                        samples[name].append(elapsed)
    p50 = {name: sorted(values)[len(values) // 2] * 1e6 for name, values in samples.items()}
    result = {"start_to_plan_ahead_p50_us": p50["ahead"], "start_to_plan_fresh_p50_us": p50["fresh"],
              "ping_p50_us": p50["ping"], "ahead_over_fresh": p50["ahead"] / p50["fresh"],
              "ahead_over_ping": p50["ahead"] / p50["ping"]}
    print(f"cake_bench.start_to_plan: {len(samples['ping'])} calls of each kind in {blocks} blocks")
    print(f"  Start to Plan p50: {p50['ahead']:.0f} us on the stream opened ahead, {p50['fresh']:.0f} us on a fresh "
          f"stream ({result['ahead_over_fresh']:.2f}x); Ping p50 {p50['ping']:.0f} us "
          f"(ahead / Ping {result['ahead_over_ping']:.2f}x; goal: at most 3x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
