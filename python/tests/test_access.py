"""Who may do what: principals established by the daemon (the unix peer's uid), tenants that cannot see or poison
each other, regions only their owner can use or map, admin as a role, and cakectl refused for state changes.

The engines here are real processes running as other users (started through setpriv by this root test), reaching the
daemon's socket through its group, as the documented deployment has it."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from cake.testing import SpawnedDaemon, caked_path

ENGINE_A, ENGINE_B, MONITOR, STRANGER = 61001, 61002, 61003, 61004
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="calling as other users needs root and setpriv (util-linux)")

CONFIG = textwrap.dedent(f"""
    [server]
    socket_mode = 0o660

    [[access.principal]]
    name = "engine-a"
    unix_uids = [{ENGINE_A}]
    tenants = ["a"]
    roles = ["engine"]

    [[access.principal]]
    name = "engine-b"
    unix_uids = [{ENGINE_B}]
    tenants = ["b"]
    roles = ["engine"]

    [[access.principal]]
    name = "dashboard"
    unix_uids = [{MONITOR}]
    roles = ["monitor"]
""")

# What every child runs first: the client, the test helpers, and `attempt`, which turns a call into
# [status code name, detail] (OSError: its errno name) so the parent can check each outcome.
PRELUDE = textwrap.dedent("""
    import errno, json, os, sys, types
    import cake
    from cake._stubs import kv_pb2
    from cake.errors import CakeError
    from helpers import pattern, prompt, small_namespace

    def attempt(call, *args, **kwargs):
        try:
            value = call(*args, **kwargs)
            return ["OK", value if isinstance(value, (int, str, list, type(None))) else None]
        except CakeError as error:
            return [error.code.name, error.message]
        except OSError as error:
            return [errno.errorcode.get(error.errno, str(error.errno)), str(error)]

    SOCKET = os.environ["CAKE_SOCKET"]
    TOKENS = prompt(4, seed=77)
""")


def _child_env(daemon):
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_DIR, *paths]), CAKE_SOCKET=daemon.socket_path,
                HOME="/")


def _as_user(uid):
    """argv prefix running a command as `uid` in the daemon's group (here root's), which is what lets it open the
    socket. setpriv changes the ids after exec: subprocess's own user=/group= would fork() this process, whose gRPC
    threads then crash it now and then (cake.testing explains the same for preexec_fn)."""
    return [shutil.which("setpriv"), "--reuid", str(uid), "--regid", str(uid), "--groups", str(os.getgid()), "--"]


def run_as(uid, daemon, body, timeout_s=60):
    """Runs PRELUDE + body as `uid`; body leaves its outcome in `result`, returned parsed."""
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
    proc = subprocess.run([*_as_user(uid), sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout_s, env=_child_env(daemon), cwd="/")
    assert proc.returncode == 0, f"child as uid {uid} failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def tenants_daemon():
    with SpawnedDaemon(["--dram-capacity-mib", "64"], config=CONFIG, open_dir=True) as d:
        yield d
        assert d.alive(), d.log()


def test_unconfigured_daemon_serves_one_user_and_says_so(daemon, client):
    assert "single-user mode" in daemon.log()
    client.ping()
    client.status()


@needs_root
def test_two_tenants_cannot_see_poison_or_touch_each_other(tenants_daemon):
    daemon = tenants_daemon
    # Engine A stores a prompt from its region and keeps the region while B tries everything against it.
    owner = subprocess.Popen([*_as_user(ENGINE_A), sys.executable, "-c", PRELUDE + textwrap.dedent("""
        client = cake.Client(SOCKET, client_id="engine")
        ns = small_namespace("shared-model")               # names no tenant: the principal's own ("a")
        region = client.register_region(4 * ns.chunk_bytes)
        for c in range(4):
            region.numpy()[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes] = pattern(c, ns.chunk_bytes, salt=1)
        stored = client.store(ns, tokens=TOKENS, first_chunk=0, chunk_count=4, region=region)
        print(json.dumps({"region_id": region.id, "shm_name": region.shm_name, "stored": stored.stored_chunks}),
              flush=True)
        sys.stdin.readline()                                # B has done its worst
        after = {"lookup": client.lookup(ns, tokens=TOKENS).cached_chunks}
        region.numpy()[:] = 0
        with client.load(ns, tokens=TOKENS, region=region, mode="io_only") as load:
            list(load)
            after["loaded"] = load.done.loaded_chunks
            view = region.numpy()
            after["bit_exact"] = all(
                bytes(view[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes]) == pattern(c, ns.chunk_bytes, 1).tobytes()
                for c in range(4))
            load.release()
        after["renew_and_release"] = attempt(client.release_region, region)[0]
        print(json.dumps(after), flush=True)
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_child_env(daemon), cwd="/")
    try:
        setup = json.loads(owner.stdout.readline() or "null")
        assert setup is not None, owner.stderr.read()
        assert setup["stored"] == 4

        attack = run_as(ENGINE_B, daemon, f"""
            client = cake.Client(SOCKET, client_id="engine")   # even the same client id as A's
            theirs = small_namespace("shared-model", tenant="a")
            mine = small_namespace("shared-model")
            region = types.SimpleNamespace(id={setup["region_id"]!r}, size=4 * mine.chunk_bytes)
            garbage = [b"\\xee" * mine.chunk_bytes] * 4
            result = {{
                "lookup_theirs": attempt(client.lookup, theirs, tokens=TOKENS)[0],
                "store_theirs": attempt(client.store, theirs, tokens=TOKENS, first_chunk=0, chunks=garbage)[0],
                "load_theirs": attempt(lambda: client.load(theirs, tokens=TOKENS, mode="io_only").wait_plan(10))[0],
                # In its own tenant the same prompt is simply not cached, and B's bytes land in B's tenant only.
                "lookup_mine": client.lookup(mine, tokens=TOKENS).cached_chunks,
                "store_mine": attempt(lambda: client.store(mine, tokens=TOKENS, first_chunk=0,
                                                           chunks=garbage).already_cached)[1],
                # A's region: as if it did not exist.
                "store_from_region": attempt(client.store, mine, tokens=TOKENS, first_chunk=0, chunk_count=1,
                                             region=region)[0],
                "load_into_region": attempt(lambda: client.load(mine, tokens=TOKENS, region=region,
                                                                mode="io_only").wait_plan(10))[0],
                "renew_region": attempt(client._call, client._kv.RenewRegion, kv_pb2.RenewRegionRequest(
                    client_id="engine", region_id=region.id))[0],
                "release_region": attempt(client._call, client._kv.ReleaseRegion, kv_pb2.ReleaseRegionRequest(
                    client_id="engine", region_id=region.id))[0],
                "map_region": attempt(os.open, "/dev/shm" + {setup["shm_name"]!r}, os.O_RDWR)[0],
                "status": attempt(client.status)[0],
                "stats": attempt(client.stats)[0],
                "evict": attempt(client.evict, "dram")[0],
                "set_read_cap": attempt(client.set_read_cap, "dram", 1.0)[0],
                "ping": attempt(client.ping)[0],
            }}
        """)
        assert attack == {
            "lookup_theirs": "PERMISSION_DENIED", "store_theirs": "PERMISSION_DENIED",
            "load_theirs": "PERMISSION_DENIED", "lookup_mine": 0, "store_mine": 0,
            "store_from_region": "NOT_FOUND", "load_into_region": "NOT_FOUND", "release_region": "NOT_FOUND",
            "renew_region": "NOT_FOUND",
            "map_region": "EACCES", "status": "PERMISSION_DENIED", "stats": "PERMISSION_DENIED",
            "evict": "PERMISSION_DENIED", "set_read_cap": "PERMISSION_DENIED", "ping": "OK"}

        owner.stdin.write("go on\n")
        owner.stdin.flush()
        after = json.loads(owner.stdout.readline() or "null")
        assert after == {"lookup": 4, "loaded": 4, "bit_exact": True, "renew_and_release": "OK"}, owner.stderr.read()
    finally:
        owner.kill()
        owner.wait()


@needs_root
def test_an_engine_in_the_group_maps_its_own_region_and_not_another(tenants_daemon):
    first = run_as(ENGINE_A, tenants_daemon, """
        client = cake.Client(SOCKET, client_id="mapper")
        region = client.register_region(1 << 16)
        region.numpy()[:4] = [1, 2, 3, 4]          # mapped read-write by the engine that asked for it
        mode = os.stat("/dev/shm" + region.shm_name).st_mode & 0o777
        result = {"mapped": True, "others_bits": mode & 0o007}
    """)
    assert first == {"mapped": True, "others_bits": 0}


@needs_root
def test_the_documented_single_user_deployment_works_for_an_engine_in_the_group():
    """No principals (the shipped config): an engine under its own user, in the daemon's group, registers, maps,
    stores and loads; its region is shared with it alone."""
    daemon = SpawnedDaemon(["--dram-capacity-mib", "64"], open_dir=True)
    try:
        result = run_as(ENGINE_A, daemon, """
            client = cake.Client(SOCKET, client_id="grouped")
            ns = small_namespace("single-user")
            region = client.register_region(4 * ns.chunk_bytes)
            for c in range(4):
                region.numpy()[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes] = pattern(c, ns.chunk_bytes, salt=3)
            client.store(ns, tokens=TOKENS, first_chunk=0, chunk_count=4, region=region)
            region.numpy()[:] = 0
            with client.load(ns, tokens=TOKENS, region=region, mode="io_only") as load:
                list(load)
                load.release()
            view = region.numpy()
            result = {"bit_exact": all(bytes(view[c * ns.chunk_bytes:(c + 1) * ns.chunk_bytes]) ==
                                       pattern(c, ns.chunk_bytes, 3).tobytes() for c in range(4)),
                      "shm": region.shm_name}
        """)
        assert result["bit_exact"]
        assert "single-user mode" in daemon.log()
    finally:
        daemon.stop()


@needs_root
def test_callers_without_a_principal_and_monitors(tenants_daemon):
    # A uid no principal names is closed at accept, before the daemon reads a byte from it (docs/security.md): its
    # client never connects, and the daemon's log names the uid for the operator.
    stranger = run_as(STRANGER, tenants_daemon, """
        result = attempt(cake.Client, SOCKET, connect_timeout_s=2)
    """)
    assert stranger[0] == "UNAVAILABLE" and "access policy name this user" in stranger[1]
    assert f"from uid {STRANGER} closed at accept" in tenants_daemon.log()
    monitor = run_as(MONITOR, tenants_daemon, """
        client = cake.Client(SOCKET)
        result = [attempt(client.status)[0], attempt(client.stats)[0], attempt(client.evict, "dram")[0],
                  attempt(client.lookup, small_namespace("x"), tokens=TOKENS)[0]]
    """)
    assert monitor == ["OK", "OK", "PERMISSION_DENIED", "PERMISSION_DENIED"]


@needs_root
def test_cakectl_as_a_non_admin_is_refused_state_changes(tenants_daemon):
    cakectl = os.path.join(os.path.dirname(os.path.abspath(caked_path())), "cakectl")

    def run(uid, *args):
        prefix = _as_user(uid) if uid != 0 else []
        return subprocess.run([*prefix, cakectl, "--socket", tenants_daemon.socket_path, *args], capture_output=True,
                              text=True, timeout=30, cwd="/")

    status = run(MONITOR, "status")
    assert status.returncode == 0, status.stderr
    refused = run(MONITOR, "evict", "--tier", "dram")
    assert refused.returncode != 0
    assert "admin role" in refused.stderr, refused.stderr
    assert run(ENGINE_A, "evict", "--tier", "dram").returncode != 0
    # Root (the operator) administers without being named.
    evicted = run(0, "evict", "--tier", "dram")
    assert evicted.returncode == 0, evicted.stderr


@needs_root
def test_connections_reusing_descriptors_keep_their_own_principal(tenants_daemon):
    """The daemon finds a call's principal by its connection's descriptor, which the kernel reuses as soon as a
    connection closes: two users reconnecting over and over at once must each always be themselves."""
    body = """
        mine, theirs = small_namespace("reuse"), small_namespace("reuse", tenant=OTHER)
        outcomes = set()
        for _ in range(25):
            with cake.Client(SOCKET) as client:
                outcomes.add((attempt(client.lookup, mine, tokens=TOKENS)[0],
                              attempt(client.lookup, theirs, tokens=TOKENS)[0]))
        result = sorted(outcomes)
    """
    children = []
    for uid, other in ((ENGINE_A, "b"), (ENGINE_B, "a")):
        code = PRELUDE + f"OTHER = {other!r}\n" + textwrap.dedent(body) + "\nprint(json.dumps(result))\n"
        children.append(subprocess.Popen([*_as_user(uid), sys.executable, "-c", code], stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True, env=_child_env(tenants_daemon), cwd="/"))
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == [["OK", "PERMISSION_DENIED"]]
