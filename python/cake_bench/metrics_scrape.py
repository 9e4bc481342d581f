"""What a Prometheus scrape costs: wall time and the daemon's CPU per scrape of /metrics with N (tenant, model)
series, against a Ping (the trivial RPC) on the same daemon.

    /usr/bin/python3 -m cake_bench.metrics_scrape [--series 64] [--scrapes 200] [--json FILE]

Starts a private caked (DRAM and disk tiers, metrics on a loopback port) from CAKE_CAKED or next to the build."""
import argparse
import json
import os
import tempfile
import time
import urllib.request

from cake.namespace import Namespace
from cake.testing import SpawnedDaemon


def daemon_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m cake_bench.metrics_scrape",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=64, help="(tenant, model) pairs that have loaded (default 64)")
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="cake-metrics-bench-")
    flags = ["--dram-capacity-mib", "256", "--disk-root", os.path.join(scratch, "disk"), "--metrics-listen",
             "127.0.0.1:0"]
    config = f"[metrics]\nmax_namespace_series = {max(1, args.series)}\n"
    with SpawnedDaemon(flags, config=config) as daemon, daemon.client() as client:
        status = client.status()
        url = f"http://{status['metrics_address']}/metrics"
        for i in range(args.series):
            ns = Namespace(f"model-{i}", num_layers=2, num_kv_heads=2, head_dim=8, dtype="fp32", chunk_tokens=16,
                           tenant="")
            with client.load(ns, tokens=list(range(i * 16, i * 16 + 16))) as load:
                load.wait_plan(10)
                load.release()
        body = urllib.request.urlopen(url, timeout=10).read()
        samples = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        walls = []
        cpu_before = daemon_cpu_s(status["pid"])
        for _ in range(args.scrapes):
            started = time.perf_counter()
            urllib.request.urlopen(url, timeout=10).read()
            walls.append(time.perf_counter() - started)
        cpu_per_scrape = (daemon_cpu_s(status["pid"]) - cpu_before) / args.scrapes
        pings = []
        for _ in range(args.scrapes):
            started = time.perf_counter()
            client.ping()
            pings.append(time.perf_counter() - started)
    walls.sort()
    pings.sort()
    result = {"series": args.series, "bytes": len(body), "samples": samples,
              "scrape_p50_ms": percentile(walls, 0.5) * 1e3, "scrape_p99_ms": percentile(walls, 0.99) * 1e3,
              "daemon_cpu_per_scrape_ms": cpu_per_scrape * 1e3, "ping_p50_ms": percentile(pings, 0.5) * 1e3}
    print(f"cake_bench.metrics_scrape: {args.scrapes} scrapes of {result['bytes']} bytes ({samples} samples, "
          f"{args.series} (tenant, model) series)")
    print(f"  scrape p50 {result['scrape_p50_ms']:.2f} ms, p99 {result['scrape_p99_ms']:.2f} ms; daemon CPU "
          f"{result['daemon_cpu_per_scrape_ms']:.2f} ms per scrape; Ping p50 {result['ping_p50_ms']:.3f} ms "
          f"(scrape / Ping {result['scrape_p50_ms'] / result['ping_p50_ms']:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
