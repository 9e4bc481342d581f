"""Bad input surfaces as CakeError with the daemon's status code and message, and the daemon keeps serving;
a session left early frees its window; a client killed mid-load leaves the daemon serving."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

import cake
from cake._stubs import admin_pb2
from helpers import fill, prompt, small_namespace


def expect(code, call, *args, **kwargs):
    with pytest.raises(cake.CakeError) as error:
        call(*args, **kwargs)
    assert error.value.code == code, error.value.message
    assert error.value.message  # the daemon says what to change
    return error.value.message


def test_bad_requests_get_their_codes(client, daemon):
    ns = small_namespace("errors")
    tokens = prompt(3, seed=20)
    message = expect(grpc.StatusCode.INVALID_ARGUMENT, client.lookup,
                     cake.Namespace("", 1, 1, 1, "fp32"), tokens=tokens)
    assert "model_id" in message
    assert "num_layers" in expect(grpc.StatusCode.INVALID_ARGUMENT, client.lookup,
                                  cake.Namespace("m", 0, 1, 1, "fp32"), tokens=tokens)
    assert "16 bytes" in expect(grpc.StatusCode.INVALID_ARGUMENT, client.lookup, ns, chunk_keys=[b"short"])
    expect(grpc.StatusCode.INVALID_ARGUMENT, client.register_region, 0)
    expect(grpc.StatusCode.INVALID_ARGUMENT, client.register_region, 1 << 50)
    # This daemon serves host regions only: device memory is a precondition an operator must meet.
    assert "device" in expect(grpc.StatusCode.FAILED_PRECONDITION, client.register_region, 4096, kind="cuda").lower()
    expect(grpc.StatusCode.INVALID_ARGUMENT, client.store, ns, tokens=tokens, first_chunk=0,
           chunks=[b"too short"])
    expect(grpc.StatusCode.OUT_OF_RANGE, client.store, ns, tokens=tokens, first_chunk=2,
           chunks=[bytes(ns.chunk_bytes)] * 2)
    # A request that names no tier (the client refuses to send one: ValueError, before the call).
    expect(grpc.StatusCode.INVALID_ARGUMENT, client._call, client._admin.Evict, admin_pb2.EvictRequest())
    expect(grpc.StatusCode.FAILED_PRECONDITION, client.set_read_cap, "dram", 10)
    expect(grpc.StatusCode.INVALID_ARGUMENT, client.set_read_cap, "dram", -1)
    expect(grpc.StatusCode.NOT_FOUND, client.evict, "disk")
    client.ping()


def test_region_errors(client, daemon):
    ns = small_namespace("region-errors")
    tokens = prompt(2, seed=21)
    region = client.register_region(2 * ns.chunk_bytes)
    with daemon.client(client_id="someone-else") as other:
        forged = cake.HostShmRegion(region.id, region.size, region.shm_name)
        expect(grpc.StatusCode.PERMISSION_DENIED, other.store, ns, tokens=tokens, first_chunk=0, chunk_count=1,
               region=forged)
        with other.load(ns, tokens=tokens, region=forged) as load:
            expect(grpc.StatusCode.PERMISSION_DENIED, load.wait_plan, 5)
        forged.close()
    with client.load(ns, tokens=tokens, region=region, region_offset=region.size + 4096) as load:
        expect(grpc.StatusCode.OUT_OF_RANGE, load.wait_plan, 5)
    expect(grpc.StatusCode.OUT_OF_RANGE, client.store, ns, tokens=tokens, first_chunk=0, chunk_count=2,
           region=region, region_offset=ns.chunk_bytes)
    client.release_region(region)
    # Released: the name is gone for everyone.
    expect(grpc.StatusCode.NOT_FOUND, client.release_region, region)
    with client.load(ns, tokens=tokens, region=region) as load:
        expect(grpc.StatusCode.NOT_FOUND, load.wait_plan, 5)


def test_load_stream_errors_end_the_session_not_the_daemon(client):
    ns = small_namespace("stream-errors")
    tokens = prompt(2, seed=22)
    with client.load(ns, tokens=tokens, window=1 << 20) as load:
        assert "window" in expect(grpc.StatusCode.INVALID_ARGUMENT, load.wait_plan, 5)
        expect(grpc.StatusCode.INVALID_ARGUMENT, load.wait_done, 5)
        assert load.ended
        load.progress(1)  # a no-op once ended: the engine's thread is never disturbed
        expect(grpc.StatusCode.INVALID_ARGUMENT, load.release)
    with client.load(ns, tokens=tokens, computed_through=10) as load:
        expect(grpc.StatusCode.INVALID_ARGUMENT, load.wait_plan, 5)
    with client.load(ns, tokens=tokens, compute_first_chunk_s=-1.0) as load:
        expect(grpc.StatusCode.INVALID_ARGUMENT, load.wait_plan, 5)
    with pytest.raises(ValueError):
        client.load(ns, tokens=tokens, mode="fast")
    with pytest.raises(ValueError):
        client.load(ns, tokens=tokens, chunk_keys=[b"x" * 16])
    client.ping()


def test_overlapping_windows_are_refused(fresh_daemon):
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "0.001")
    with daemon.client() as client:
        ns = small_namespace("overlap")
        tokens = prompt(4, seed=23)
        region = client.register_region(4 * ns.chunk_bytes)
        fill(region, 4, ns.chunk_bytes)
        client.store(ns, tokens=tokens, first_chunk=0, chunk_count=4, region=region)
        with client.load(ns, tokens=tokens, region=region, mode="io_only") as first:
            first.wait_plan(5)
            with client.load(ns, tokens=tokens, region=region, region_bytes=ns.chunk_bytes) as second:
                assert "overlap" in expect(grpc.StatusCode.FAILED_PRECONDITION, second.wait_plan, 5)


def test_leaving_the_block_early_frees_the_window(fresh_daemon):
    # 1 Mbit/s: a 4 KiB chunk takes ~33 ms, so the load is still running when the block is left.
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "0.001")
    with daemon.client() as client:
        ns = small_namespace("early-exit")
        tokens = prompt(16, seed=24)
        region = client.register_region(16 * ns.chunk_bytes)
        fill(region, 16, ns.chunk_bytes)
        client.store(ns, tokens=tokens, first_chunk=0, chunk_count=16, region=region)
        with pytest.raises(RuntimeError):
            with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
                load.wait_plan(5)
                raise RuntimeError("the engine gave up")
        assert load.ended
        # The same window at once: no overlap with a load that is still draining.
        with client.load(ns, tokens=tokens, region=region, mode="io_only", computed_through=15) as again:
            assert again.wait_done(10).meeting_chunk == 15
        assert client.status()["active_loads"] == 0
        # An explicit cancel frees it too, once the daemon has seen it.
        load = client.load(ns, tokens=tokens, region=region, mode="io_only")
        load.wait_plan(5)
        load.cancel()
        assert load.ended
        deadline = time.monotonic() + 10
        while client.status()["active_loads"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.status()["active_loads"] == 0
        assert client.stats()["loads_cancelled"] >= 1


KILLED_CLIENT = textwrap.dedent("""
    import os, signal, sys
    import cake
    sys.path.insert(0, sys.argv[2])
    from helpers import prompt, small_namespace
    client = cake.Client(sys.argv[1], client_id="doomed")
    ns = small_namespace("killed")
    tokens = prompt(16, seed=25)
    client.store(ns, tokens=tokens, first_chunk=0, chunks=[bytes(ns.chunk_bytes)] * 16)
    region = client.register_region(16 * ns.chunk_bytes)
    load = client.load(ns, tokens=tokens, region=region, mode="io_only")
    load.wait_plan(10)
    print("loading", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_client_killed_mid_load_leaves_the_daemon_serving(fresh_daemon):
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "0.001")
    child = subprocess.run([sys.executable, "-c", KILLED_CLIENT, daemon.socket_path, os.path.dirname(__file__)],
                           capture_output=True, text=True, timeout=60, env=os.environ)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "loading" in child.stdout
    with daemon.client() as client:
        deadline = time.monotonic() + 10
        while client.status()["active_loads"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.status()["active_loads"] == 0
        ns = small_namespace("killed")
        tokens = prompt(16, seed=25)
        assert client.lookup(ns, tokens=tokens).cached_chunks == 16
        with client.load(ns, tokens=tokens, mode="io_only", computed_through=14) as load:
            assert load.wait_done(10).loaded_chunks == 2
    assert daemon.alive()
