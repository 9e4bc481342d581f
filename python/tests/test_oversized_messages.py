"""A client that sends oversized messages costs the daemon at most server.transport_memory_bytes (gRPC reads a
message whole before it compares it with server.max_message_bytes: only the transport's resource quota bounds
it), gets RESOURCE_EXHAUSTED, and everyone else is served on. Inline stores larger than one message go in batches
sized by the daemon's limit (GetLimits)."""
import os

import grpc
import pytest

import cake.client
from cake.errors import CakeError
from helpers import small_namespace

MIB = 1 << 20


def _varint(value):
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _ping_carrying(nbytes):
    """A PingRequest with an unknown field of nbytes: valid protobuf, which the daemon's parser keeps whole."""
    return _varint((1000 << 3) | 2) + _varint(nbytes) + b"x" * nbytes


def _peak_rss_bytes(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def small_transport_daemon(fresh_daemon, tmp_path):
    config = tmp_path / "caked.toml"
    config.write_text("[server]\nmax_message_bytes = 8388608\ntransport_memory_bytes = 67108864\n")
    return fresh_daemon("--config", str(config), "--dram-capacity-mib", "64")


def test_an_oversized_message_is_refused_at_a_bounded_cost(small_transport_daemon):
    d = small_transport_daemon
    channel = grpc.insecure_channel("unix:" + d.socket_path,
                                    options=[("grpc.max_send_message_length", 1 << 30)])
    raw_ping = channel.unary_unary("/cake.v1.AdminService/Ping", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
    before = _peak_rss_bytes(d.process.pid)
    # Over max_message_bytes but within the quota: read, then refused by size.
    with pytest.raises(grpc.RpcError) as over_limit:
        raw_ping(_ping_carrying(16 * MIB), timeout=30)
    assert over_limit.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max" in over_limit.value.details()
    # 200 MiB, twice: the transport stops reading it at the 64 MiB quota and resets the stream.
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as over_quota:
            raw_ping(_ping_carrying(200 * MIB), timeout=60)
        assert over_quota.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    grown = _peak_rss_bytes(d.process.pid) - before
    assert grown < 120 * MIB, f"the daemon's peak RSS grew by {grown / MIB:.0f} MiB for a 200 MiB message"
    channel.close()

    with d.client() as client:
        client.ping()
        # A 6 MiB inline store still fits one message.
        ns = small_namespace("oversized", chunk_tokens=4096)  # 1 MiB chunks
        tokens = list(range(6 * 4096))
        chunks = [bytes([i]) * ns.chunk_bytes for i in range(6)]
        stored = client.store(ns, tokens=tokens, chunks=chunks)
        assert stored.stored_chunks == len(chunks)
    assert d.alive()


def test_inline_stores_over_one_message_go_in_batches(small_transport_daemon, monkeypatch):
    with small_transport_daemon.client() as client:
        ns = small_namespace("batched", chunk_tokens=4096)  # 1 MiB chunks
        tokens = list(range(40 * 4096))
        chunks = [os.urandom(ns.chunk_bytes) for _ in range(40)]  # 40 MiB of chunks (the DRAM tier holds 64)
        if client.limits().from_daemon:
            assert client._inline_store_batch_bytes() == 2 * MIB  # a quarter of the daemon's 8 MiB messages
        else:  # a daemon older than GetLimits: the client assumes 256 MiB messages unless its cap is lower
            monkeypatch.setattr(cake.client, "INLINE_STORE_BATCH_BYTES", 4 * MIB)
        stored = client.store(ns, tokens=tokens, chunks=chunks)
        assert stored.stored_chunks == 40
        assert client.lookup(ns, tokens=tokens).cached_chunks == 40
        with pytest.raises(CakeError) as too_big:  # one message past the daemon's limit is refused, clearly
            client.store(ns, tokens=list(range(10**6, 10**6 + 20 * 4096)), chunk_count=20, chunks=chunks[:20])
        assert too_big.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
