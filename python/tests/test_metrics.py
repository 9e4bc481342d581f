"""The Prometheus endpoint ([metrics] listen): a real scrape over HTTP shows per-tier, per-load and per-RPC series
that move as a load runs; every metric the Grafana dashboard draws is there; a hostile or silent scraper does not
stop the others; a port that cannot be bound fails the start with a message naming it."""
import os
import re
import socket
import subprocess
import time
import urllib.request

import pytest

import cake
from cake.testing import SpawnedDaemon, caked_path
from helpers import bench_module, prompt, small_namespace

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def scrape(address):
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        assert reply.status == 200
        return reply.read().decode()


def parse(text):
    """{(name, frozenset of label pairs): value}, and the family names in TYPE lines (each once)."""
    samples, families = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            families.append(line.split()[2])
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, f"not an exposition line: {line!r}"
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            samples[(m.group(1), labels)] = float(m.group(3))
    return samples, families


def value(samples, name, absent=None, **labels):
    """The sum of `name`'s samples that carry `labels`; `absent` when there is none (None: that fails)."""
    want = set(labels.items())
    found = [v for (n, l), v in samples.items() if n == name and want <= set(l)]
    if not found and absent is not None:
        return absent
    assert found, f"no sample {name}{labels}"
    return sum(found)


@pytest.fixture(scope="module")
def metrics_daemon(tmp_path_factory):
    disk = tmp_path_factory.mktemp("metrics-disk")
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(disk), "--disk-capacity-mib", "64",
                        "--metrics-listen", "127.0.0.1:0"]) as d:
        with d.client() as c:
            d.metrics_address = c.status()["metrics_address"]
        yield d
        assert d.alive(), d.log()


def test_counters_move_as_a_load_runs(metrics_daemon):
    before, families = parse(scrape(metrics_daemon.metrics_address))
    assert len(families) == len(set(families)), "a family is exposed twice"
    ns, tokens = small_namespace("metrics-model", tenant=""), prompt(6, seed=11)
    with metrics_daemon.client() as client:
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[b"\x03" * ns.chunk_bytes] * 6)
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            assert len(list(load)) == 6
            load.release()
        with pytest.raises(cake.CakeError):
            client.evict("remote")  # a tier this daemon was not started with
    deadline = time.monotonic() + 10
    while True:  # the write-back to disk is asynchronous
        after, _ = parse(scrape(metrics_daemon.metrics_address))
        if value(after, "cake_tier_written_bytes_total", tier="disk") >= 6 * ns.chunk_bytes or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # A labelled series appears with its first observation: absent before means 0.
    moved = lambda name, **labels: value(after, name, **labels) - value(before, name, absent=0, **labels)
    assert moved("cake_tier_reads_total", tier="dram", result="hit") == 6
    assert moved("cake_tier_read_bytes_total", tier="dram") == 6 * ns.chunk_bytes
    assert moved("cake_tier_read_seconds_count", tier="dram") == 6
    assert moved("cake_tier_written_bytes_total", tier="dram") == 6 * ns.chunk_bytes
    assert moved("cake_tier_written_bytes_total", tier="disk") == 6 * ns.chunk_bytes
    assert value(after, "cake_tier_chunks", tier="dram") >= 6
    assert value(after, "cake_tier_capacity_bytes", tier="disk") == 64 << 20
    assert moved("cake_loads_total", model="metrics-model", strategy="io_only") == 1
    assert moved("cake_load_chunks_total", model="metrics-model", source="loaded") == 6
    assert moved("cake_load_duration_seconds_count", model="metrics-model") == 1
    # io_only loads everything: the meeting point is chunk 0, a loaded share of 1.
    assert moved("cake_load_loaded_share_bucket", model="metrics-model", le="0.9") == 0
    assert moved("cake_load_loaded_share_bucket", model="metrics-model", le="1") == 1
    assert moved("cake_load_plan_seconds_count") == 1
    assert moved("cake_load_first_chunk_seconds_count") == 1
    assert moved("cake_rpc_responses_total", method="cake.v1.KvService/Load", code="OK") == 1
    assert moved("cake_rpc_responses_total", method="cake.v1.KvService/Store", code="OK") == 1
    assert value(after, "cake_rpc_responses_total", method="cake.v1.AdminService/Evict", code="NOT_FOUND") >= 1
    assert moved("cake_load_chunks_loaded_total") == 6  # cakectl stats' counters, under their own names
    assert value(after, "cake_loads_active") == 0
    with metrics_daemon.client() as client:
        assert value(after, "cake_build_info", version=client.status()["version"]) == 1


def test_every_metric_the_dashboard_draws_is_exported(metrics_daemon):
    source = os.environ.get("CAKE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    with open(os.path.join(source, "deploy", "grafana", "cake-dashboard.json")) as f:
        dashboard = f.read()
    used = set(re.findall(r"\bcake_[a-z_]+", dashboard))
    assert used, "the dashboard names no cake_ metric"
    samples, _ = parse(scrape(metrics_daemon.metrics_address))
    exported = {name for (name, _) in samples}
    # A histogram is drawn through its _bucket, _sum or _count series.
    missing = sorted(name for name in used if name not in exported)
    assert not missing, f"the dashboard draws metrics caked does not export: {missing}"


def test_tenants_and_models_get_capped_series():
    config = '[metrics]\nlisten = "127.0.0.1:0"\nmax_namespace_series = 2\n'
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=config) as daemon, daemon.client() as client:
        address = client.status()["metrics_address"]
        for i in range(5):
            ns, tokens = small_namespace(f"model-{i}"), prompt(1, seed=100 + i)
            with client.load(ns, tokens=tokens) as load:
                load.wait_plan(10)
                load.release()
        samples, _ = parse(scrape(address))
    models = {dict(l)["model"] for (n, l) in samples if n == "cake_loads_total"}
    assert models == {"model-0", "model-1", "other"}
    assert value(samples, "cake_loads_total", model="other") == 3


def test_a_silent_and_a_garbage_scraper_leave_scrapes_working(metrics_daemon):
    host, port = metrics_daemon.metrics_address.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    garbage = socket.create_connection((host, int(port)))
    try:
        garbage.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (256 << 10) + b"\r\n\r\n")
    except OSError:
        pass  # the endpoint may close on us mid-send: that is the point
    started = time.monotonic()
    assert "cake_build_info" in scrape(metrics_daemon.metrics_address)
    assert time.monotonic() - started < 9
    silent.close()
    garbage.close()
    with metrics_daemon.client() as client:
        client.ping()


def test_a_port_that_cannot_be_bound_fails_the_start_naming_it():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(RuntimeError) as failed:
            SpawnedDaemon(["--dram-capacity-mib", "64", "--metrics-listen", f"127.0.0.1:{port}"])
        assert f"metrics.listen \"127.0.0.1:{port}\"" in str(failed.value)
    finally:
        taken.close()
    bad = subprocess.run([caked_path(), "--check-config", "--metrics-listen", "localhost"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "metrics.listen" in bad.stderr


def test_the_scrape_bench_runs(tmp_path):
    out = tmp_path / "scrape.json"
    bench_module("metrics_scrape").main(["--series", "2", "--scrapes", "5", "--json", str(out)])
    import json
    result = json.loads(out.read_text())
    assert result["series"] == 2 and result["samples"] > 100 and result["scrape_p50_ms"] > 0
