"""What an operator does with cakectl and caked beyond status: regions (list, release), loads, the effective
configuration (secrets masked, and caked --print-config reads back), verify of the disk tier's checksums, the
health verb that probes use, JSON from every verb, exit codes, and SIGHUP reloading the log level and read caps."""
import json
import os
import signal
import subprocess
import time
import tomllib

import grpc
import pytest

import cake
from cake.testing import SpawnedDaemon, caked_path
from helpers import prompt, small_namespace

NOT_RUNNING, REFUSED, BAD_USAGE = 3, 1, 2


def cakectl(daemon, *args):
    binary = os.path.join(os.path.dirname(os.path.abspath(caked_path())), "cakectl")
    return subprocess.run([binary, "--socket", daemon.socket_path, *args], capture_output=True, text=True, timeout=60)


def cakectl_json(daemon, *args):
    done = cakectl(daemon, "--output", "json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def disk_daemon(tmp_path):
    with SpawnedDaemon(["--dram-capacity-mib", "64", "--disk-root", str(tmp_path / "disk"), "--disk-capacity-mib",
                        "64"]) as d:
        yield d


def test_regions_are_listed_and_an_operator_releases_one(daemon):
    with daemon.client(client_id="engine-7") as client:
        region = client.register_region(1 << 20)
        listed = cakectl_json(daemon, "regions")["regions"]
        mine = [r for r in listed if r["client_id"] == "engine-7"]
        # protobuf's JSON: uint64 as a string, an enum by its value's name
        assert len(mine) == 1 and mine[0]["bytes"] == str(1 << 20) and mine[0]["kind"] == "REGION_HOST_SHM"
        assert [(r["region_id"], r["bytes"], r["kind"]) for r in client.list_regions()
                if r["client_id"] == "engine-7"] == [(region.id, 1 << 20, "host")]
        text = cakectl(daemon, "regions", "list")
        assert text.returncode == 0 and "engine-7" in text.stdout and "1.0 MiB" in text.stdout
        released = cakectl(daemon, "regions", "release", mine[0]["region_id"])
        assert released.returncode == 0 and "engine-7" in released.stdout, released.stderr
        with pytest.raises(cake.CakeError) as gone:
            client.release_region(region)
        assert gone.value.code == grpc.StatusCode.NOT_FOUND
    again = cakectl(daemon, "regions", "release", mine[0]["region_id"])
    assert again.returncode == REFUSED and "NOT_FOUND" in again.stderr


def test_running_loads_are_listed(daemon):
    ns, tokens = small_namespace("listed-model"), prompt(3, seed=21)
    with daemon.client(client_id="lister") as client:
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[b"\x05" * ns.chunk_bytes] * 3)
        with client.load(ns, tokens=tokens, mode="io_only") as load:
            load.wait_plan(10)
            loads = cakectl_json(daemon, "loads")["loads"]
            assert [(l["model"], l["client_id"], l["cached_chunks"], l["strategy"]) for l in loads] == [
                ("listed-model", "lister", 3, "STRATEGY_IO_ONLY")]
            assert "listed-model" in cakectl(daemon, "loads").stdout
            listed = client.list_loads()
            assert [(l["model"], l["client_id"], l["strategy"]) for l in listed] == [
                ("listed-model", "lister", "io_only")]
            assert listed[0]["phase"] in ("loading", "met")
            load.release()
        assert client.list_loads() == []
    assert cakectl_json(daemon, "loads") == {"loads": []}


def test_config_is_the_effective_one_with_secrets_masked(tmp_path):
    config = '[keys]\nsecret = "hunter2"\n[dram]\ncapacity_bytes = 67108864\n'
    with SpawnedDaemon(["--window", "6"], config=config) as daemon:
        shown = cakectl(daemon, "config")
        assert shown.returncode == 0, shown.stderr
        assert "hunter2" not in shown.stdout
        parsed = tomllib.loads(shown.stdout)
        assert parsed["keys"]["secret"] == "(set; masked)"
        assert parsed["dram"]["capacity_bytes"] == 64 << 20  # the file
        assert parsed["loader"]["window"] == 6                # the flag
        assert parsed["server"]["socket"] == daemon.socket_path
        assert cakectl_json(daemon, "config")["toml"] == shown.stdout
    # What caked prints reads back as a valid configuration.
    printed = subprocess.run([caked_path(), "--print-config", "--window", "6"], capture_output=True, text=True)
    assert printed.returncode == 0, printed.stderr
    path = tmp_path / "printed.toml"
    path.write_text(printed.stdout)
    path.chmod(0o600)
    check = subprocess.run([caked_path(), "--check-config", "--config", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_print_config_names_every_key_the_shipped_config_documents():
    source = os.environ.get("CAKE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
    documented, table = set(), None
    with open(os.path.join(source, "deploy", "caked.toml")) as f:
        for line in f:
            line = line.strip().lstrip("# ").strip()
            if line.startswith("[") and line.endswith("]") and not line.startswith("[["):
                table = line.strip("[]")
            elif table and "=" in line and line.split("=")[0].strip().replace("_", "").isalnum():
                if table != "access":  # [[access.principal]]'s keys are per entry
                    documented.add((table, line.split("=")[0].strip()))
    printed = tomllib.loads(subprocess.run([caked_path(), "--print-config"], capture_output=True, text=True,
                                           check=True).stdout)
    missing = sorted(f"{t}.{k}" for t, k in documented if k not in printed.get(t, {}))
    assert documented and not missing, f"caked --print-config leaves out {missing}"


def test_verify_finds_and_removes_a_corrupt_chunk_on_disk(disk_daemon, tmp_path):
    ns, tokens = small_namespace("verify"), prompt(4, seed=31)
    with disk_daemon.client() as client:
        client.store(ns, tokens=tokens, first_chunk=0, chunks=[bytes([c]) * ns.chunk_bytes for c in range(4)])
        files = []
        deadline = time.monotonic() + 10
        while len(files) < 4 and time.monotonic() < deadline:  # the write-back is asynchronous
            files = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "disk") for f in fs if f.endswith(".chunk")]
            time.sleep(0.05)
        assert len(files) == 4
        clean = cakectl_json(disk_daemon, "verify")
        assert (clean["chunks_checked"], clean["corrupt_removed"]) == ("4", "0")
        with open(files[0], "r+b") as f:  # one byte of the payload, after the 4096-byte header
            f.seek(4096)
            byte = f.read(1)
            f.seek(4096)
            f.write(bytes([byte[0] ^ 0xFF]))
        found = cakectl(disk_daemon, "verify", "--tier", "disk")
        assert found.returncode == REFUSED, found.stdout + found.stderr  # something was wrong: exit 1
        assert "1 corrupt (removed)" in found.stdout
        assert not os.path.exists(files[0])
        assert cakectl_json(disk_daemon, "verify")["chunks_checked"] == "3"
        stats = client.stats()
        assert stats["tier_disk_corrupt_removed"] == 1
        checked = client.verify("disk")
        assert (checked["chunks_checked"], checked["corrupt_removed"]) == (3, 0)
        with pytest.raises(cake.CakeError, match="no checksums"):
            client.verify("dram")
    refused = cakectl(disk_daemon, "verify", "--tier", "dram")
    assert refused.returncode == REFUSED and "no checksums" in refused.stderr


def test_health_verb_follows_drain_and_every_verb_speaks_json(fresh_daemon):
    daemon = fresh_daemon()
    assert cakectl(daemon, "health").stdout.strip() == "SERVING"
    assert cakectl_json(daemon, "health") == {"status": "SERVING"}
    assert cakectl(daemon, "drain").returncode == 0
    drained = cakectl(daemon, "health")
    assert drained.returncode == REFUSED and drained.stdout.strip() == "NOT_SERVING"
    assert cakectl(daemon, "health", "--service", "cake.v1.KvService").returncode == REFUSED
    unknown = cakectl(daemon, "health", "--service", "no.such.Service")
    assert unknown.returncode == REFUSED and "NOT_FOUND" in unknown.stderr
    assert cakectl(daemon, "drain", "--resume").returncode == 0
    for verb in (["status"], ["stats"], ["ping"], ["regions"], ["loads"], ["config"], ["health"],
                 ["drain", "--resume"]):
        cakectl_json(daemon, *verb)  # parses
    assert cakectl(daemon, "regions", "frobnicate").returncode == BAD_USAGE
    daemon.stop()
    assert cakectl(daemon, "health").returncode == NOT_RUNNING


def test_sighup_reloads_the_log_level_and_read_caps(tmp_path):
    config_text = '[server]\nlog_level = "info"\n[dram]\ncapacity_bytes = 67108864\nread_gbps = 100\n'
    with SpawnedDaemon([], config=config_text) as daemon:
        config_path = os.path.join(daemon.dir, "caked.toml")
        with open(config_path, "w") as f:
            f.write(config_text.replace('"info"', '"debug"').replace("read_gbps = 100", "read_gbps = 40")
                    + "[loader]\nio_threads = 7\n")
        daemon.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "need a restart" not in daemon.log():  # the reload's last line (io_threads changed)
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
        log = daemon.log()
        assert "log level info -> debug" in log
        assert "SIGHUP: dram tier read cap 100 -> 40 Gbit/s" in log
        with daemon.client() as client:
            dram = [t for t in client.status()["tiers"] if t["tier"] == "dram"][0]
            assert dram["read_limit_gbps"] == pytest.approx(40)
        running = tomllib.loads(cakectl(daemon, "config").stdout)
        assert running["server"]["log_level"] == "debug"
        assert running["dram"]["read_gbps"] == pytest.approx(40)
        assert running["loader"]["io_threads"] == 4  # not applied: it needs a restart
        assert daemon.alive()
