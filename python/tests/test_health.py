"""Standard probes: gRPC's health service (grpc.health.v1.Health, what grpcurl and Kubernetes gRPC probes call) and
server reflection answer on caked's socket; Drain turns health to NOT_SERVING and refuses new loads while every
other call goes on; Drain with exit_when_idle stops the daemon once no load runs. The health and reflection
messages are written and read by hand here (their Python stubs are not among Debian's packages)."""
import time

import grpc
import pytest

import cake
from helpers import prompt, small_namespace

SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # HealthCheckResponse{status: 1 or 2}


def health(daemon, service=""):
    """grpc.health.v1.Health/Check for `service` ("" is the whole server); the raw response bytes."""
    with grpc.insecure_channel("unix:" + daemon.socket_path) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        request = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
        return check(request, timeout=5)


def test_health_and_reflection_answer(daemon):
    assert health(daemon) == SERVING
    assert health(daemon, "cake.v1.KvService") == SERVING
    with grpc.insecure_channel("unix:" + daemon.socket_path) as channel:
        reflect = channel.stream_stream("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                        request_serializer=lambda b: b, response_deserializer=lambda b: b)
        # ServerReflectionRequest{list_services: ""} (field 7)
        replies = list(reflect(iter([b"\x3a\x00"]), timeout=5))
    assert b"cake.v1.KvService" in replies[0] and b"cake.v1.AdminService" in replies[0]
    assert b"grpc.health.v1.Health" in replies[0]


def test_drain_refuses_new_loads_and_says_not_serving(fresh_daemon):
    daemon = fresh_daemon()
    ns, tokens = small_namespace("drain"), prompt(2, seed=5)
    with daemon.client() as client:
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[b"\x01" * ns.chunk_bytes] * 2)
        assert client.drain() == (0, True)
        assert health(daemon) == NOT_SERVING
        assert client.status()["draining"]
        with pytest.raises(cake.CakeError) as refused:
            client.load(ns, tokens=tokens, mode="io_only").wait_plan(10)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE and "draining" in refused.value.message
        assert client.lookup(ns, tokens=tokens).cached_chunks == 2  # everything else goes on
        assert client.drain(resume=True) == (0, False)
        assert health(daemon) == SERVING
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            assert len(list(load)) == 2
            load.release()


def test_drain_with_exit_when_idle_waits_for_the_running_load(fresh_daemon):
    daemon = fresh_daemon()
    ns, tokens = small_namespace("drain-exit"), prompt(2, seed=6)
    with daemon.client() as client:
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[b"\x02" * ns.chunk_bytes] * 2)
        running = client.load(ns, tokens=tokens, mode="io_only")
        running.wait_plan(10)
        assert client.drain(exit_when_idle=True) == (1, True)
        time.sleep(1.5)
        assert daemon.alive()  # a load still runs
        list(running)
        running.release()
    deadline = time.monotonic() + 15
    while daemon.alive():
        assert time.monotonic() < deadline, daemon.log()
        time.sleep(0.1)
    assert daemon.process.returncode == 0
    assert "drained: no load is running" in daemon.log()


def test_under_systemd_log_lines_carry_journal_priorities(monkeypatch):
    from cake.testing import SpawnedDaemon
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")  # what systemd sets when stdout is the journal
    with SpawnedDaemon(["--dram-capacity-mib", "64"]) as daemon:
        with daemon.client() as client:
            with pytest.raises(cake.CakeError):
                client.evict("remote")  # a tier it was not started with
        lines = [line for line in daemon.log().splitlines() if line]
    assert lines and all(line[:3] in ("<7>", "<6>", "<4>", "<3>", "<2>") for line in lines), lines
    assert any(line.startswith("<6>caked ") and "listening on" in line for line in lines)
