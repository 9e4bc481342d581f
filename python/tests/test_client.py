"""Every call of the Python client against a real caked: regions, lookups, stores, loads (region and inline,
I/O-only, Cake, fixed splits), admin calls, socket discovery."""
import dataclasses
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from concurrent import futures

import grpc
import numpy as np
import pytest

import cake
import cake.client
from cake._stubs import admin_pb2, admin_pb2_grpc, kv_pb2, kv_pb2_grpc
from cake.errors import CakeError
from helpers import fill, pattern, prompt, small_namespace


def test_ping_status_stats(client):
    client.ping()
    status = client.status()
    assert status["pid"] > 0
    # Host regions always; CUDA regions too where the daemon found a GPU (scripts/device-check runs this there).
    assert "host" in status["region_kinds"]
    assert set(status["region_kinds"]) <= {"host", "cuda"}
    assert [t["tier"] for t in status["tiers"]] == ["dram"]
    assert status["tiers"][0]["capacity_bytes"] == 256 << 20
    before = client.stats()
    assert all(isinstance(v, int) for v in before.values())
    client.lookup(small_namespace("stats"), tokens=prompt(2, seed=11))
    after = client.stats()
    assert after["lookups"] == before["lookups"] + 1
    assert after["lookup_chunks"] == before["lookup_chunks"] + 2


def test_lookup_store_and_load_into_a_region(client):
    ns = small_namespace("roundtrip")
    tokens = prompt(6, tail=5)
    miss = client.lookup(ns, tokens=tokens)
    assert (miss.total_chunks, miss.cached_chunks, miss.tiers) == (6, 0, [])
    assert miss.chunk_bytes == ns.chunk_bytes == 4096

    region = client.register_region(6 * ns.chunk_bytes)
    assert region.kind == "host" and region.size == 6 * ns.chunk_bytes
    fill(region, 6, ns.chunk_bytes)
    stored = client.store(ns, tokens=tokens, first_chunk=0, chunk_count=6, region=region)
    assert (stored.stored_chunks, stored.already_cached) == (6, 0)
    # A key names its content: the same chunks again are already cached.
    assert client.store(ns, tokens=tokens, first_chunk=2, chunk_count=2, region=region,
                        region_offset=2 * ns.chunk_bytes).already_cached == 2

    hit = client.lookup(ns, tokens=tokens)
    assert (hit.cached_chunks, hit.tiers) == (6, ["dram"] * 6)

    region.numpy()[:] = 0
    with client.load(ns, tokens=tokens, region=region, mode="io_only") as load:
        plan = load.plan
        assert (plan.total_chunks, plan.cached_chunks, plan.lowest_loadable) == (6, 6, 0)
        assert plan.strategy == "io_only" and plan.chunk_bytes == ns.chunk_bytes
        arrived = [event.chunk for event in load]
        assert arrived == [5, 4, 3, 2, 1, 0]  # tail first, each extending the loaded suffix
        done = load.done
        assert (done.meeting_chunk, done.loaded_chunks, done.failed_chunks) == (0, 6, 0)
        assert load.is_resident(0) and load.loaded_low == 0
        for c in range(6):
            at = load.region_offset(c)
            assert at == c * ns.chunk_bytes
            assert np.array_equal(region.numpy()[at:at + ns.chunk_bytes], pattern(c, ns.chunk_bytes))
        load.release()
    assert load.ended
    client.release_region(region)
    assert region.closed


def test_region_offsets_count_from_the_region_not_the_window(client):
    ns = small_namespace("window-offset")
    tokens = prompt(3, seed=2)
    region = client.register_region(8 * ns.chunk_bytes)
    fill(region, 3, ns.chunk_bytes, salt=2)
    client.store(ns, tokens=tokens, first_chunk=0, chunk_count=3, region=region)
    window_at = 4 * ns.chunk_bytes
    with client.load(ns, tokens=tokens, region=region, region_offset=window_at, region_bytes=3 * ns.chunk_bytes,
                     mode="io_only") as load:
        load.wait_done(10)
        for c in range(3):
            assert load.region_offset(c) == window_at + c * ns.chunk_bytes
            at = load.region_offset(c)
            assert np.array_equal(region.numpy()[at:at + ns.chunk_bytes], pattern(c, ns.chunk_bytes, salt=2))
        load.release()
    client.release_region(region)


def test_a_window_smaller_than_the_prefix_loads_the_tail(client):
    ns = small_namespace("small-window")
    tokens = prompt(5, seed=3)
    region = client.register_region(5 * ns.chunk_bytes)
    fill(region, 5, ns.chunk_bytes, salt=3)
    client.store(ns, tokens=tokens, first_chunk=0, chunk_count=5, region=region)
    with client.load(ns, tokens=tokens, region=region, region_bytes=2 * ns.chunk_bytes, mode="io_only") as load:
        assert load.plan.lowest_loadable == 3
        assert load.done.meeting_chunk == 3
        assert not load.is_resident(2) and load.is_resident(3)
        assert load.region_offset(3) == 0 and load.region_offset(4) == ns.chunk_bytes
    client.release_region(region)


def test_inline_store_and_load(client):
    ns = small_namespace("inline")
    tokens = prompt(4, seed=4)
    chunks = [pattern(c, ns.chunk_bytes, salt=4).tobytes() for c in range(4)]
    assert client.store(ns, tokens=tokens, first_chunk=0, chunks=chunks).stored_chunks == 4
    with client.load(ns, tokens=tokens, mode="io_only") as load:
        events = list(load)
        assert [e.chunk for e in events] == [3, 2, 1, 0]
        assert all(e.data == chunks[e.chunk] for e in events)
        assert load.chunk(1).data == chunks[1]
        load.release()


def test_chunk_keys_prompt(client):
    ns = small_namespace("engine-keys")
    engine_keys = [bytes([i]) * 16 for i in range(3)]
    chunks = [pattern(c, ns.chunk_bytes, salt=5).tobytes() for c in range(3)]
    client.store(ns, chunk_keys=engine_keys, first_chunk=0, chunks=chunks)
    assert client.lookup(ns, chunk_keys=engine_keys).cached_chunks == 3
    assert client.lookup(ns, chunk_keys=engine_keys[:1] + [b"x" * 16]).cached_chunks == 1
    with client.load(ns, chunk_keys=engine_keys, mode="io_only") as load:
        assert {e.chunk: e.data for e in load} == dict(enumerate(chunks))


def test_cake_load_meets_the_engine_progress(client):
    """The engine reports every chunk it computed before the daemon loads anything: the daemon loads nothing
    below it and Done names the engine's progress as the meeting point."""
    ns = small_namespace("cake-progress")
    tokens = prompt(8, seed=6)
    region = client.register_region(8 * ns.chunk_bytes)
    fill(region, 8, ns.chunk_bytes, salt=6)
    client.store(ns, tokens=tokens, first_chunk=0, chunk_count=8, region=region)
    with client.load(ns, tokens=tokens, region=region, computed_through=5) as load:
        assert load.plan.strategy in ("cake", "io_only")
        load.progress(6)
        done = load.wait_done(10)
        assert done.meeting_chunk >= 5 and done.loaded_chunks == 8 - done.meeting_chunk
        assert load.wait_resident(done.meeting_chunk, timeout=1)
        load.release()
    client.release_region(region)


def test_fixed_split_with_computed_through(client):
    ns = small_namespace("fixed-split")
    tokens = prompt(6, seed=7)
    chunks = [pattern(c, ns.chunk_bytes, salt=7).tobytes() for c in range(6)]
    client.store(ns, tokens=tokens, first_chunk=0, chunks=chunks)
    with client.load(ns, tokens=tokens, mode="io_only", computed_through=4) as load:
        assert [e.chunk for e in load] == [5, 4]
        assert load.done.meeting_chunk == 4


def test_nothing_cached_plans_and_ends_at_once(client):
    ns = small_namespace("nothing")
    with client.load(ns, tokens=prompt(3, seed=8)) as load:
        assert load.plan.cached_chunks == 0
        assert load.wait_done(5).meeting_chunk == 0
        assert list(load) == []
        assert not load.wait_resident(0, timeout=0.01)


def test_wait_resident_times_out_while_loads_are_slow(fresh_daemon):
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "0.001")
    with daemon.client() as client:
        ns = small_namespace("slow")
        tokens = prompt(32, seed=9)
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[bytes(ns.chunk_bytes)] * 32)
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            load.wait_plan(5)
            # 4 KiB at 1 Mbit/s is ~33 ms a chunk, read from the tail: chunk 0 lands about 1 s after the start
            assert not load.wait_resident(0, timeout=0.05)


def test_socket_discovery(monkeypatch, daemon):
    monkeypatch.setenv("CAKE_SOCKET", daemon.socket_path)
    assert cake.default_socket_path() == daemon.socket_path
    with cake.Client() as c:
        c.ping()
    monkeypatch.delenv("CAKE_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    expected = "/run/cake/caked.sock" if os.geteuid() == 0 else "/run/user/1234/cake/caked.sock"
    if os.geteuid() != 0 and not os.path.exists(expected) and os.path.exists("/run/cake/caked.sock"):
        expected = "/run/cake/caked.sock"
    assert cake.default_socket_path() == expected
    # A user other than root looks for its own daemon first, then the system's (the unit's /run/cake).
    from cake.client import _socket_candidates
    assert _socket_candidates(1234, {"XDG_RUNTIME_DIR": "/run/user/1234"}) == [
        "/run/user/1234/cake/caked.sock", "/run/cake/caked.sock"]
    assert _socket_candidates(1234, {}) == ["/tmp/cake-1234/caked.sock", "/run/cake/caked.sock"]
    assert _socket_candidates(0, {}) == ["/run/cake/caked.sock"]


# Socket discovery against a squatter: the tests act as a user with no daemon of its own (root can make folders
# for any uid); its fallback is /tmp/cake-<uid>, and the "system daemon" is this module's real caked.
OTHER_USER = 100000 + os.getpid() % 100000
ATTACKER_UID = 65534


class _Squatter(kv_pb2_grpc.KvServiceServicer, admin_pb2_grpc.AdminServiceServicer):
    """Another user's server posing as this user's daemon: records every call that reaches it."""

    def __init__(self):
        self.calls = []

    def Ping(self, request, context):
        self.calls.append("Ping")
        return admin_pb2.PingResponse()

    def Lookup(self, request, context):
        self.calls.append(list(request.prompt.tokens))  # the prompt is what the attacker is after
        return kv_pb2.LookupResponse()


@pytest.fixture
def another_user(monkeypatch, daemon):
    monkeypatch.delenv("CAKE_SOCKET", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: OTHER_USER)
    monkeypatch.setattr(cake.client, "SYSTEM_SOCKET", daemon.socket_path, raising=False)
    folder = f"/tmp/cake-{OTHER_USER}"
    elsewhere = tempfile.mkdtemp(prefix="cake-squat-")
    servers = []

    def squat(where):
        squatter = _Squatter()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        kv_pb2_grpc.add_KvServiceServicer_to_server(squatter, server)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(squatter, server)
        server.add_insecure_port("unix:" + os.path.join(where, "caked.sock"))
        server.start()
        servers.append(server)
        return squatter

    yield folder, elsewhere, squat
    for server in servers:
        server.stop(0)
    if os.path.islink(folder):
        os.unlink(folder)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(elsewhere, ignore_errors=True)


def _squat(kind, folder, elsewhere, squat):
    """Makes the fallback folder `kind`'s way, with a server of the attacker's in it where one can listen."""
    if kind == "symbolic link":  # to a folder of the attacker's
        os.chown(elsewhere, ATTACKER_UID, ATTACKER_UID)
        os.symlink(elsewhere, folder)
        return squat(elsewhere), "is a symbolic link"
    os.mkdir(folder, 0o700)
    if kind == "not a socket":  # this user's own closed folder, with a file where the socket should be
        os.chown(folder, OTHER_USER, OTHER_USER)
        open(os.path.join(folder, "caked.sock"), "w").close()
        return None, "is a regular file, not a unix socket"
    squatter = squat(folder)
    if kind == "another user's folder":
        os.chown(folder, ATTACKER_UID, ATTACKER_UID)
        return squatter, f"belongs to another user (uid {ATTACKER_UID})"
    os.chown(folder, OTHER_USER, OTHER_USER)  # "open to others": this user's, but anyone may write in it
    os.chmod(folder, 0o777)
    return squatter, "is open to other users (mode 0777)"


SQUATS = ["another user's folder", "open to others", "symbolic link", "not a socket"]


@pytest.mark.parametrize("kind", SQUATS)
def test_a_squatted_fallback_socket_is_passed_over_for_the_system_daemon(another_user, daemon, kind, caplog):
    folder, elsewhere, squat = another_user
    squatter, why = _squat(kind, folder, elsewhere, squat)
    assert cake.default_socket_path() == daemon.socket_path
    with caplog.at_level(logging.WARNING, logger="cake.client"):
        with cake.Client(connect_timeout_s=2) as client:
            assert client.socket_path == daemon.socket_path
            client.lookup(small_namespace("squat"), tokens=prompt(1, seed=3))
            assert client.status()["pid"] == daemon.process.pid
    assert squatter is None or squatter.calls == []  # no prompt ever reached the attacker
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(folder in w and why in w for w in warnings), warnings


@pytest.mark.parametrize("kind", SQUATS)
def test_a_squatted_fallback_without_a_system_daemon_is_a_clear_error(another_user, monkeypatch, kind):
    folder, elsewhere, squat = another_user
    monkeypatch.setattr(cake.client, "SYSTEM_SOCKET", os.path.join(elsewhere, "no-system-daemon.sock"),
                        raising=False)
    squatter, why = _squat(kind, folder, elsewhere, squat)
    with pytest.raises(CakeError) as refused:
        cake.Client(connect_timeout_s=2)
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert folder in refused.value.message and why in refused.value.message, refused.value.message
    assert "CAKE_SOCKET" in refused.value.message  # what to do about it
    assert squatter is None or squatter.calls == []
    # Never handed out for display either: the system daemon's path instead.
    assert cake.default_socket_path() != os.path.join(folder, "caked.sock")


def _as_attacker(action):
    """Runs `action` (no arguments) in a child process as ATTACKER_UID; returns what it returned, or the error."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setgid(ATTACKER_UID)
            os.setuid(ATTACKER_UID)
            result = repr(action())
        except Exception as error:  # noqa: BLE001: the child reports whatever stopped it
            result = f"{type(error).__name__}: {error}"
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="the attacker is another local user, which needs root to become")
def test_a_client_waiting_for_its_daemon_holds_its_fallback_folder_so_no_other_user_can_answer_in_its_place(
        another_user, monkeypatch):
    # Issue 46, item 5: at 4054af8 a client made while no daemon socket existed connected to whatever socket another
    # user created at /tmp/cake-<uid>/caked.sock during its connect wait, and sent it the prompt's tokens.
    folder, elsewhere, squat = another_user
    monkeypatch.setattr(cake.client, "SYSTEM_SOCKET", os.path.join(elsewhere, "no-system-daemon.sock"),
                        raising=False)
    assert not os.path.exists(folder)
    client = cake.Client(connect_timeout_s=None)  # waits for a daemon that is not there yet
    try:
        assert client.socket_path == os.path.join(folder, "caked.sock")
        st = os.lstat(folder)
        assert stat.S_ISDIR(st.st_mode) and st.st_mode & 0o7777 == 0o700  # made by the client, closed to others
        # The attacker can neither make the folder nor put a socket of its own in it.
        made = _as_attacker(lambda: os.mkdir(folder, 0o777))
        assert made.startswith("FileExistsError"), made

        def listen():
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(os.path.join(folder, "caked.sock"))
            return "listening"

        bound = _as_attacker(listen)
        assert bound.startswith("PermissionError"), bound
        assert not os.path.exists(os.path.join(folder, "caked.sock"))
    finally:
        client.close()


def test_a_fallback_folder_another_user_made_while_the_client_looked_is_refused(another_user, monkeypatch):
    # The same race, one step earlier: the folder appears between the client's look and its own mkdir.
    folder, elsewhere, squat = another_user
    os.mkdir(folder, 0o777)
    os.chown(folder, ATTACKER_UID, ATTACKER_UID)
    with pytest.raises(cake.client._Refused) as refused:
        cake.client._claim_own_folder(folder, OTHER_USER)
    assert f"belongs to another user (uid {ATTACKER_UID})" in str(refused.value)


def test_the_users_own_closed_fallback_folder_is_used_and_an_explicit_socket_as_given(another_user, monkeypatch,
                                                                                     daemon):
    folder, elsewhere, squat = another_user
    os.mkdir(folder, 0o700)
    own = squat(folder)
    os.chown(folder, OTHER_USER, OTHER_USER)
    assert cake.default_socket_path() == os.path.join(folder, "caked.sock")  # the user's own daemon first
    with cake.Client(connect_timeout_s=2) as client:
        client.ping()
    assert own.calls == ["Ping"]
    # $CAKE_SOCKET is the user's choice, taken as given, as socket= is.
    monkeypatch.setenv("CAKE_SOCKET", daemon.socket_path)
    os.chown(folder, ATTACKER_UID, ATTACKER_UID)
    assert cake.default_socket_path() == daemon.socket_path
    monkeypatch.setenv("CAKE_SOCKET", os.path.join(folder, "caked.sock"))
    with cake.Client(connect_timeout_s=2) as client:
        client.ping()
    assert own.calls == ["Ping", "Ping"]


def test_a_runtime_dir_fallback_owned_by_another_user_is_refused(another_user, monkeypatch, daemon, tmp_path):
    folder, elsewhere, squat = another_user
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    os.mkdir(runtime / "cake", 0o700)
    bound = socket.socket(socket.AF_UNIX)
    bound.bind(str(runtime / "cake" / "caked.sock"))
    try:
        # Outside a world-writable parent, root's folder is trusted (only root or this user can make one there) ...
        assert cake.default_socket_path() == str(runtime / "cake" / "caked.sock")
        # ... another user's is not.
        os.chown(runtime / "cake", ATTACKER_UID, ATTACKER_UID)
        assert cake.default_socket_path() == daemon.socket_path
    finally:
        bound.close()


def test_no_daemon_is_unavailable(tmp_path):
    with pytest.raises(cake.CakeError) as error:
        cake.Client(str(tmp_path / "nobody.sock"), connect_timeout_s=0.5)
    assert error.value.code == grpc.StatusCode.UNAVAILABLE
    assert "nobody.sock" in error.value.message


def test_admin_calls(fresh_daemon):
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "50")
    with daemon.client() as client:
        ns = small_namespace("admin")
        tokens = prompt(2, seed=10)
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[bytes(ns.chunk_bytes)] * 2)
        assert client.set_read_cap("dram", 20) == pytest.approx(50)
        assert client.status()["tiers"][0]["read_limit_gbps"] == pytest.approx(20)
        chunks, nbytes = client.evict("dram")
        assert chunks == 2 and nbytes >= 2 * ns.chunk_bytes
        assert client.lookup(ns, tokens=tokens).cached_chunks == 0


def test_a_tier_the_client_does_not_know_is_refused_before_any_call(client):
    client._admin = None  # any call would fail otherwise
    for call in (client.evict, lambda tier: client.set_read_cap(tier, 1.0), client.verify):
        with pytest.raises(ValueError, match="'tape' is not one of dram, disk, remote"):
            call("tape")
        with pytest.raises(ValueError):
            call("none")  # the wire's "not cached", never a tier to act on


def test_limits_say_the_daemons_configuration(fresh_daemon, tmp_path):
    """GetLimits: what the daemon accepts, asked once; the client sizes its inline store batches (a quarter of the
    daemon's message limit, 64 MiB at most) and retires a stream opened ahead (after a third of the daemon's
    start timeout, 20 s at most) by it. A daemon older than GetLimits answers UNIMPLEMENTED: the client then
    assumes the default configuration's limits."""
    config = tmp_path / "caked.toml"
    config.write_text("[server]\nmax_message_bytes = 8388608\n[loader]\nstart_timeout_ms = 300\n"
                      "[limits]\nregion_lease_ms = 900\n")
    daemon = fresh_daemon("--config", str(config), "--dram-capacity-mib", "64")
    with daemon.client() as client:
        limits = client.limits()
        assert client.limits() is limits
        if limits.from_daemon:
            assert (limits.max_message_bytes, limits.load_start_timeout_ms, limits.region_lease_ms) == (
                8 << 20, 300, 900)
            assert limits.default_chunk_tokens == 256 and limits.default_load_window == 4
            assert client._inline_store_batch_bytes() == 2 << 20
            assert client._ahead_max_age_s() == pytest.approx(0.1)
        else:
            assert limits == cake.Limits()
            assert (limits.max_message_bytes, limits.load_start_timeout_ms) == (256 << 20, 60000)
            assert client._inline_store_batch_bytes() == 64 << 20
            assert client._ahead_max_age_s() == 20.0
    with fresh_daemon("--dram-capacity-mib", "64").client() as client:  # the default configuration
        limits = client.limits()
        assert client._inline_store_batch_bytes() == 64 << 20 and client._ahead_max_age_s() == 20.0
        assert dataclasses.replace(limits, from_daemon=False) == cake.Limits()  # the fallback is today's defaults


def test_check_regions_finds_every_region_a_restarted_daemon_lost_at_once(fresh_daemon):
    """The default lease is 30 s, so the renewer would tell only that much later; check_regions asks now."""
    d = fresh_daemon("--dram-capacity-mib", "64")
    with d.client() as client:
        kept = [client.register_region(4096), client.register_region(4096)]
        assert client.check_regions() == set() and all(client.holds_region(r) for r in kept)
        d.restart(kill=True)
        assert client.check_regions() == {r.id for r in kept}
        assert not any(client.holds_region(r) for r in kept)
        fresh = client.register_region(4096)  # the same client registers again on the new daemon
        assert client.holds_region(fresh) and client.check_regions() == set()


def test_the_client_renews_its_regions_leases(fresh_daemon, tmp_path):
    config = tmp_path / "caked.toml"
    # 1 s: the renewer runs every third of the lease with that third as its RPC deadline, and shares the GIL.
    config.write_text("[limits]\nregion_lease_ms = 1000\n")
    d = fresh_daemon("--config", str(config), "--dram-capacity-mib", "64")
    with d.client() as client:
        region = client.register_region(4096)
        time.sleep(3.5)  # three and a half leases: only the client's renewals keep the region
        assert client.stats()["regions_expired"] == 0
        assert client.status()["regions"] == 1
        client.release_region(region)
    # A caller that registers and never renews loses its region one lease later.
    with d.client(client_id="py-silent") as silent:
        reply = silent._kv.RegisterRegion(kv_pb2.RegisterRegionRequest(client_id="py-silent", bytes=4096))
        assert reply.lease_ms == 1000
        deadline = time.monotonic() + 10
        while silent.stats()["regions_expired"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert silent.stats()["regions_expired"] == 1
        with pytest.raises(CakeError) as gone:
            silent._call(silent._kv.RenewRegion, kv_pb2.RenewRegionRequest(client_id="py-silent",
                                                                          region_id=reply.region_id))
        assert gone.value.code == grpc.StatusCode.NOT_FOUND
