"""The Python client keeps one Load stream open ahead of its next load (a load then pays no stream set-up and no
thread start under the GIL: about 0.7x the Start-to-Plan time of a fresh stream, docs/benchmarks.md section 20).
A stream the daemon ended meanwhile (loader.start_timeout_ms, a restart) or one too old is never used; a stream
that never sends a Start is ended by the daemon; closing the client ends its stream."""
import os
import signal
import subprocess
import time

import grpc

import cake
from cake.testing import SpawnedDaemon, caked_path
from helpers import bench_module, prompt, small_namespace


def load_all(client, ns, tokens):
    with client.load(ns, tokens=tokens, mode="io_only") as load:
        plan = load.wait_plan(10)
        chunks = len(list(load))
        load.release()
    return plan, chunks


def test_loads_reuse_the_stream_opened_ahead_and_survive_its_expiry():
    # 3 s: the client trusts a stream opened ahead for a third of it (1 s), room enough on a loaded machine for the
    # second load to find it young; 300 ms left 100 ms.
    config = "[loader]\nstart_timeout_ms = 3000\n"
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=config) as daemon, daemon.client() as client:
        ns, tokens = small_namespace("ahead"), prompt(2, seed=41)
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[b"\x07" * ns.chunk_bytes] * 2)
        assert load_all(client, ns, tokens)[1] == 2
        ahead = client._ahead
        assert ahead is not None and ahead.usable(client._ahead_max_age_s())
        assert load_all(client, ns, tokens)[1] == 2
        assert ahead._plan is not None and client._ahead is not ahead  # the stream opened ahead carried that load
        deadline = time.monotonic() + 20  # the daemon ends the stream opened ahead: it sent no Start within 3 s
        while not client._ahead.ended and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client._ahead.ended and not client._ahead.usable(60.0)
        assert load_all(client, ns, tokens)[1] == 2  # a fresh stream, not the dead one
        assert "start_timeout_ms is 3000 ms" in daemon.log()


def test_a_stream_opened_ahead_too_long_ago_is_not_used(monkeypatch):
    with SpawnedDaemon(["--dram-capacity-mib", "64"]) as daemon, daemon.client() as client:
        ns, tokens = small_namespace("old-ahead"), prompt(1, seed=42)
        load_all(client, ns, tokens)
        old = client._ahead
        monkeypatch.setattr(client, "_ahead_max_age_s", lambda: 0.0)
        assert old.usable(60.0) and not old.usable(0.0)
        load_all(client, ns, tokens)
        assert old._ended  # cancelled, not left open


def test_a_client_loads_again_after_its_daemon_restarts(tmp_path):
    socket_path = str(tmp_path / "caked.sock")

    def start():
        daemon = subprocess.Popen([caked_path(), "--dram-capacity-mib", "64", "--socket", socket_path],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not os.path.exists(socket_path):
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        return daemon

    def stop(daemon):
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(20) == 0

    first = start()
    try:
        with cake.Client(socket_path) as client:
            ns, tokens = small_namespace("restart"), prompt(1, seed=43)
            load_all(client, ns, tokens)  # leaves a stream open ahead on the first daemon
            stop(first)
            second = start()
            try:
                deadline = time.monotonic() + 10
                while True:
                    try:
                        plan, _ = load_all(client, ns, tokens)
                        break
                    except cake.CakeError as error:  # the channel reconnects on its own
                        assert error.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, error
                        time.sleep(0.1)
                assert plan.cached_chunks == 0
            finally:
                stop(second)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_closing_the_client_ends_its_stream_opened_ahead(fresh_daemon):
    daemon = fresh_daemon()
    client = daemon.client()
    load_all(client, small_namespace("close"), prompt(1, seed=44))
    ahead = client._ahead
    client.close()
    assert ahead._ended


def test_the_plan_bench_runs(tmp_path):
    import json
    out = tmp_path / "plan.json"
    bench_module("start_to_plan").main(["--calls", "20", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["start_to_plan_ahead_p50_us"] > 0 and result["ping_p50_us"] > 0
