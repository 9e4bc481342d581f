"""Checks of the deployment files nothing here can run: the Grafana dashboard, the Kubernetes manifests, the Dockerfile.

Pure Python on Debian's /usr/bin/python3 (tomllib is in 3.11's standard library; the YAML tests need python3-yaml
and are skipped without it). They check that the files parse and agree with each other and with the metrics the
daemon exports; they start nothing.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/deploy/

dashboard_metric_names() is meant for reuse: a scrape test can check that a running daemon exports each name.
"""

import fnmatch
import json
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy/grafana/cake-dashboard.json"
DAEMONSET = REPO / "deploy/kubernetes/caked-daemonset.yaml"
ENGINE_EXAMPLE = REPO / "deploy/kubernetes/engine-pod-example.yaml"
DOCKERFILE = REPO / "deploy/docker/Dockerfile"
DOCKERIGNORE = REPO / "deploy/docker/Dockerfile.dockerignore"

SOCKET = "/run/cake/caked.sock"
METRICS_PORT = 9464

# What the daemon exports (docs/operations.md), by family: "counter", "gauge" or "histogram". A histogram's samples
# are <family>_bucket, _sum and _count.
EXPORTED_FAMILIES = {
    # per tier (label tier = dram | disk | remote)
    "cake_tier_reads_total": "counter",
    "cake_tier_read_bytes_total": "counter",
    "cake_tier_written_bytes_total": "counter",
    "cake_tier_writes_total": "counter",
    "cake_tier_evictions_total": "counter",
    "cake_tier_corrupt_removed_total": "counter",
    "cake_tier_used_bytes": "gauge",
    "cake_tier_capacity_bytes": "gauge",
    "cake_tier_chunks": "gauge",
    "cake_tier_load_bandwidth_bytes_per_second": "gauge",
    "cake_tier_read_seconds": "histogram",
    # loads
    "cake_loads_total": "counter",
    "cake_load_chunks_total": "counter",
    "cake_load_duration_seconds": "histogram",
    "cake_load_plan_seconds": "histogram",
    "cake_load_first_chunk_seconds": "histogram",
    "cake_load_loaded_share": "histogram",
    "cake_loads_active": "gauge",
    "cake_regions": "gauge",
    "cake_region_bytes": "gauge",
    "cake_region_bytes_released_in_use": "gauge",
    "cake_io_queue_depth": "gauge",
    "cake_write_back_queued_bytes": "gauge",
    "cake_inline_bytes_held": "gauge",
    "cake_draining": "gauge",
    "cake_build_info": "gauge",
    # RPCs
    "cake_rpc_responses_total": "counter",
}
# The counters cakectl stats shows, each exported as cake_<name>_total (server/core/counters.h).
STATS_COUNTERS = [
    "lookups", "lookup_chunks", "lookup_cached_chunks", "loads_started", "loads_finished", "loads_cancelled",
    "load_chunks_loaded", "load_bytes_loaded", "load_chunk_read_failures", "load_chunks_computed",
    "loads_not_promoted", "stores", "store_chunks_stored",
    "store_chunks_already_cached", "store_bytes_stored", "store_chunks_rejected", "regions_registered",
    "regions_released", "invalid_requests", "loads_idle_ended", "regions_reclaimed", "regions_expired",
    "inline_reads_waited", "lookups_network_skipped",
]
EXPORTED_FAMILIES.update({f"cake_{name}_total": "counter" for name in STATS_COUNTERS})

# Families the dashboard must show: all of the above but the stats counters it has no panel for.
_STATS_FAMILIES = {f"cake_{name}_total" for name in STATS_COUNTERS}
DASHBOARD_MUST_SHOW = (set(EXPORTED_FAMILIES) - _STATS_FAMILIES) | {
    "cake_lookups_total", "cake_lookup_chunks_total", "cake_lookup_cached_chunks_total", "cake_stores_total",
    "cake_store_bytes_stored_total", "cake_invalid_requests_total", "cake_regions_reclaimed_total",
    "cake_loads_idle_ended_total"}
assert DASHBOARD_MUST_SHOW <= set(EXPORTED_FAMILIES)

METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])cake_[a-z_]+")


def _sample_names():
    """Every sample name the daemon's exposition has: counters and gauges by their family name, histograms as
    their _bucket, _sum and _count series."""
    names = set()
    for family, kind in EXPORTED_FAMILIES.items():
        if kind == "histogram":
            names |= {family + "_bucket", family + "_sum", family + "_count"}
        else:
            names.add(family)
    return names


def _family(sample_name):
    for suffix in ("_bucket", "_sum", "_count"):
        base = sample_name[: -len(suffix)]
        if sample_name.endswith(suffix) and EXPORTED_FAMILIES.get(base) == "histogram":
            return base
    return sample_name


def _dashboard():
    return json.loads(DASHBOARD.read_text())


def _data_panels(dashboard):
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            yield from panel.get("panels", [])  # a collapsed row keeps its panels inside it
        else:
            yield panel


def _exprs(dashboard):
    """The PromQL the dashboard runs: every target's expr and every query variable's."""
    for panel in _data_panels(dashboard):
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            query = variable["query"]
            yield query["query"] if isinstance(query, dict) else query


def dashboard_metric_names():
    """The metric names the dashboard's queries use, sorted, as they appear in the daemon's /metrics exposition
    (a histogram's as <family>_bucket, _sum or _count)."""
    names = set()
    for expr in _exprs(_dashboard()):
        names.update(METRIC_NAME.findall(expr))
    return sorted(names)


# ---- the dashboard


def test_dashboard_is_importable():
    dashboard = _dashboard()
    assert dashboard["id"] is None
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 39
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("job", "instance", "tier", "tenant", "model"):
        assert variables[name]["type"] == "query", name
        assert variables[name]["datasource"]["uid"] == "${DS_PROMETHEUS}", name


def test_every_panel_has_a_place_and_targets():
    dashboard = _dashboard()
    rows = [p for p in dashboard["panels"] if p.get("type") == "row"]
    panels = list(_data_panels(dashboard))
    assert len(panels) >= 20
    ids = [p["id"] for p in rows + panels]
    for panel in rows + panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    for panel in panels:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], f"{panel['title']}: no targets"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert "legendFormat" in target, panel["title"]
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_panels_do_not_overlap():
    cells = {}
    for panel in _dashboard()["panels"]:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_queries_are_balanced_and_use_the_selectors():
    for expr in _exprs(_dashboard()):
        for opening, closing in ("()", "{}", "[]"):
            assert expr.count(opening) == expr.count(closing), expr
        assert expr.count('"') % 2 == 0, expr
        if expr.startswith("label_values("):
            continue
        # Every selector narrows to the chosen daemons, so one dashboard serves many nodes.
        for selector in re.findall(r"cake_[a-z_]+\{([^}]*)\}", expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, expr
        assert not re.search(r"cake_[a-z_]+(?![a-z_{])", expr), f"a metric without the selectors: {expr}"
        # rate() and increase() over counters and buckets only.
        for name in re.findall(r"(?:rate|increase)\((cake_[a-z_]+)", expr):
            kind = EXPORTED_FAMILIES.get(_family(name))
            assert kind == "counter" or name.endswith("_bucket"), f"rate of a {kind}: {expr}"
        if expr.startswith("histogram_quantile("):
            assert all(name.endswith("_bucket") for name in METRIC_NAME.findall(expr)), expr


def test_dashboard_metric_names_are_exported():
    names = dashboard_metric_names()
    assert names
    unknown = sorted(set(names) - _sample_names())
    assert not unknown, f"the dashboard names metrics the daemon does not export: {unknown}"


def test_dashboard_shows_every_metric():
    shown = {_family(name) for name in dashboard_metric_names()}
    missing = sorted(DASHBOARD_MUST_SHOW - shown)
    assert not missing, f"no panel uses {missing}"


def test_required_panels_are_there():
    exprs = "\n".join(_exprs(_dashboard()))
    for needle in (
        'cake_tier_reads_total{job=~"$job", instance=~"$instance", tier=~"$tier", result="hit"}',
        "histogram_quantile(0.99, sum by (tier, le) (rate(cake_tier_read_seconds_bucket",
        "histogram_quantile(0.5, sum by (tier, le) (rate(cake_tier_read_seconds_bucket",
        "histogram_quantile(0.99, sum by (model, le) (rate(cake_load_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(cake_load_plan_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(cake_load_first_chunk_seconds_bucket",
        'code!="OK"',
        "sum by (strategy) (rate(cake_loads_total",
        "cake_lookup_cached_chunks_total",
    ):
        assert needle in exprs, needle
    assert "heatmap" in {p["type"] for p in _data_panels(_dashboard())}


# ---- the Kubernetes manifests


def _yaml_documents(path):
    yaml = pytest.importorskip("yaml", reason="python3-yaml is not installed: the Kubernetes manifests go unchecked")
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _by_kind(path):
    out = {}
    for doc in _yaml_documents(path):
        assert doc["kind"] not in out, f"two {doc['kind']}s in {path.name}"
        out[doc["kind"]] = doc
    return out


def _dockerfile_arg(name):
    return int(re.search(rf"^ARG {name}=(\d+)$", DOCKERFILE.read_text(), re.M).group(1))


def _caked_toml():
    config_map = _by_kind(DAEMONSET)["ConfigMap"]
    return tomllib.loads(config_map["data"]["caked.toml"])


def _quantity_bytes(quantity):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(quantity)).groups()
    return float(number) * units.get(unit, 1)


def _host_paths(pod_spec):
    return {v["name"]: v["hostPath"]["path"] for v in pod_spec.get("volumes", []) if "hostPath" in v}


def _mounts(container):
    return {m["mountPath"]: m for m in container.get("volumeMounts", [])}


def test_manifests_have_their_kinds():
    assert set(_by_kind(DAEMONSET)) == {"Namespace", "ConfigMap", "NetworkPolicy", "DaemonSet"}
    kinds = _by_kind(ENGINE_EXAMPLE)
    assert set(kinds) & {"Pod", "Deployment"}
    for path in (DAEMONSET, ENGINE_EXAMPLE):
        for doc in _yaml_documents(path):
            assert doc["apiVersion"] and doc["metadata"]["name"], path.name


def test_configmap_holds_a_valid_caked_toml():
    config = _caked_toml()
    assert config["metrics"]["listen"] == f"0.0.0.0:{METRICS_PORT}"
    assert isinstance(config["metrics"]["max_namespace_series"], int)
    assert config["server"]["run_dir"] == "/run/cake"
    assert config["server"]["socket"] == SOCKET
    assert config["disk"]["root"] == "/var/cache/cake"
    assert "password" not in config.get("remote", {}), "a ConfigMap is readable by everyone"


def test_configmap_passes_caked_check_config(tmp_path):
    """With $CAKE_CAKED naming a built caked, its own parser and validation read the ConfigMap's file."""
    caked = os.environ.get("CAKE_CAKED")
    if not caked:
        pytest.skip("CAKE_CAKED is not set (a built caked to run --check-config with)")
    config_map = _by_kind(DAEMONSET)["ConfigMap"]
    path = tmp_path / "caked.toml"
    path.write_text(config_map["data"]["caked.toml"])
    path.chmod(0o600)
    result = subprocess.run([caked, "--config", str(path), "--check-config"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_daemonset_runs_one_caked_per_node():
    daemonset = _by_kind(DAEMONSET)["DaemonSet"]
    spec = daemonset["spec"]
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    assert spec["updateStrategy"]["rollingUpdate"].get("maxSurge", 0) == 0
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items())
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    assert annotations["prometheus.io/path"] == "/metrics"
    caked = spec["template"]["spec"]["containers"][0]
    assert {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"} in caked["ports"]
    assert _caked_toml()["metrics"]["listen"].endswith(f":{METRICS_PORT}")


def test_daemonset_probes_ask_cakectl():
    caked = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    health = ["/usr/bin/cakectl", "--socket", SOCKET, "health"]
    assert caked["readinessProbe"]["exec"]["command"] == health
    assert caked["startupProbe"]["exec"]["command"] == health
    # Liveness asks whether it answers: a drained daemon is NOT_SERVING by design.
    assert caked["livenessProbe"]["exec"]["command"] == ["/usr/bin/cakectl", "--socket", SOCKET, "ping"]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert caked[probe]["timeoutSeconds"] >= 1, probe


def test_daemonset_shares_the_socket_shm_and_cache_with_the_node():
    pod = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]
    host = _host_paths(pod)
    caked = pod["containers"][0]
    mounts = _mounts(caked)
    assert host[mounts["/run/cake"]["name"]] == "/run/cake"
    assert host[mounts["/var/cache/cake"]["name"]] == "/var/cache/cake"
    assert pod.get("hostIPC") is True or host[mounts["/dev/shm"]["name"]] == "/dev/shm"
    config_map_volume = next(v for v in pod["volumes"] if v["name"] == mounts["/etc/cake"]["name"])
    assert config_map_volume["configMap"]["name"] == _by_kind(DAEMONSET)["ConfigMap"]["metadata"]["name"]
    assert caked["args"][-1].endswith("exec /usr/bin/caked --config /etc/cake/caked.toml")
    # The init container hands the hostPath folders to the daemon's uid.
    init = pod["initContainers"][0]
    assert {"/run/cake", "/var/cache/cake"} <= set(_mounts(init))
    uid, gid = _dockerfile_arg("CAKE_UID"), _dockerfile_arg("CAKE_GID")
    assert f"chown {uid}:{gid} /run/cake /var/cache/cake" in " ".join(init["command"])


def test_daemonset_runs_as_the_images_cake_user():
    caked = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    context = caked["securityContext"]
    assert context["runAsUser"] == _dockerfile_arg("CAKE_UID")
    assert context["runAsGroup"] == _dockerfile_arg("CAKE_GID")
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False


def test_daemonset_memory_covers_the_configuration():
    """The limit covers what the configuration lets the daemon hold: the DRAM tier with its evicted chunks awaiting
    the disk (1.5x), every host region (caked allocates and touches their pages), gRPC's buffers, inline loads'
    chunks and the promotion queue, with 1 GiB for the rest."""
    config = _caked_toml()
    needed = (1.5 * config["dram"]["capacity_bytes"] + config["limits"]["max_total_region_bytes"]
              + config["server"].get("transport_memory_bytes", 1 << 30)
              + config["loader"].get("max_inline_bytes", 512 << 20)
              + config["dram"].get("promotion_queue_bytes", 256 << 20) + (1 << 30))
    resources = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    limit = _quantity_bytes(resources["limits"]["memory"])
    assert limit >= needed, f"memory limit {limit / 2**30:.2f} GiB < {needed / 2**30:.2f} GiB the config allows"
    assert _quantity_bytes(resources["requests"]["memory"]) == limit
    assert "cpu" not in resources["limits"]


def test_daemonset_grace_period_outlasts_the_drain():
    pod = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]
    pre_stop = " ".join(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"])
    assert "drain --exit-when-idle" in pre_stop
    drain_s = int(re.search(r"\btimeout (\d+)\b", pre_stop).group(1))
    stop_s = 2 * _caked_toml()["server"]["shutdown_grace_s"]  # calls, then write-backs
    assert pod["terminationGracePeriodSeconds"] > drain_s + stop_s


def test_engine_example_reaches_caked():
    engine_kinds = _by_kind(ENGINE_EXAMPLE)
    workload = engine_kinds.get("Deployment") or engine_kinds["Pod"]
    pod = workload["spec"]["template"]["spec"] if workload["kind"] == "Deployment" else workload["spec"]
    caked_pod = _by_kind(DAEMONSET)["DaemonSet"]["spec"]["template"]["spec"]
    gid = _dockerfile_arg("CAKE_GID")
    assert gid in pod["securityContext"]["supplementalGroups"]
    assert pod["securityContext"]["runAsUser"] != _dockerfile_arg("CAKE_UID"), "the daemon's own uid is an admin"
    engine = pod["containers"][0]
    assert {"name": "CAKE_SOCKET", "value": SOCKET} in engine["env"]
    host = _host_paths(pod)
    mounts = _mounts(engine)
    assert host[mounts["/run/cake"]["name"]] == "/run/cake"
    if caked_pod.get("hostIPC"):
        assert pod.get("hostIPC") is True
    else:
        assert host[mounts["/dev/shm"]["name"]] == "/dev/shm"


# ---- the Dockerfile


def test_dockerfile_builds_and_runs_as_asked():
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert froms == [("debian:12", "builder"), ("debian:12-slim", "")]
    runtime = text[text.index("FROM debian:12-slim"):]
    assert re.search(r"^USER cake$", runtime, re.M)
    assert re.search(r"^EXPOSE 9464$", runtime, re.M)
    assert 'ENTRYPOINT ["/usr/bin/caked"]' in runtime
    assert 'CMD ["--config", "/etc/cake/caked.toml"]' in runtime
    assert "apt-get install -y --no-install-recommends /tmp/cake_*.deb" in runtime
    assert "rm -rf /var/lib/apt/lists/*" in runtime
    builder = text[: text.index("FROM debian:12-slim")]
    assert "scripts/setup" in builder
    assert "-G Ninja" in builder and "cpack -G DEB" in builder
    for flag in ("-DCAKE_BUILD_TESTS=OFF", "-DCAKE_BUILD_BENCH=OFF", "-DCAKE_BUILD_PYTHON=ON"):
        assert flag in builder, flag


def test_dockerignore_keeps_build_folders_out():
    patterns = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    for folder in ("build", "build-*", ".git"):
        assert folder in patterns, folder
    # The build needs these: none may be ignored.
    for needed in ("scripts", "cmake", "deploy", "proto", "python", "server"):
        assert not any(fnmatch.fnmatch(needed, p) for p in patterns), needed
