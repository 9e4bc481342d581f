"""One rule per fact across the two client libraries: the golden tables in tests/golden/ that the C++ tests in
tests/client/ check too, row by row (as test_keys.py and tests/keys/namespace_test.cc share chunk_keys.toml).
- front_steps.toml: the engine's front-step rule, cake.load.next_front_step (the C++ NextFrontStep);
- socket_choice.toml: which daemon socket a client uses when not told (the C++ socket_discovery.cc);
- limit_defaults.toml: the limits assumed of a daemon older than GetLimits, cake.Limits() (the C++ DaemonLimits{}).
Changing a rule in one language alone fails one of the two tests."""
import contextlib
import os
import shutil
import socket
import tempfile
import tomllib
from dataclasses import asdict

import pytest

import cake
from cake import client as cake_client
from cake._stubs import kv_pb2
from cake.load import LoadPlan, next_front_step

GOLDEN = os.path.join(os.environ.get("CAKE_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "tests", "golden")
OTHER_OWNER = 65534   # "other": the owner of a row's entry that is not the test's user (socket_choice.toml)
OTHER_VIEWER = 40000  # viewer "other": the uid the rule is judged as, neither root nor any entry's owner


def golden(name):
    with open(os.path.join(GOLDEN, name), "rb") as f:
        return tomllib.load(f)


# --- front_steps.toml -------------------------------------------------------------------------------------------

STEPS = golden("front_steps.toml")["step"]


@pytest.mark.parametrize("row", STEPS, ids=lambda row: row["name"])
def test_front_step(row):
    cached = row["cached"]
    plan = LoadPlan(load_id="golden", total_chunks=row.get("total", cached), cached_chunks=cached, tiers=[],
                    lowest_loadable=row.get("lowest", 0), chunk_bytes=4096, strategy=row.get("strategy", "cake"),
                    predicted_meeting_chunk=row.get("meeting"), predicted_cake_s=row.get("cake_s"),
                    predicted_compute_only_s=None, predicted_io_only_s=None)
    step = next_front_step(plan, row.get("started_ms", 0) / 1000, row["next"], row.get("loaded_low", cached),
                           row.get("done"), row.get("now_ms", 0) / 1000, stream_ended=row.get("ended", False),
                           compute_s=row.get("compute_s"), resident_in_s=row.get("resident_in_s"),
                           paced_wait_given=row.get("paced_wait_given", False))
    assert step.action == row["action"]
    if row["action"] == "wait":
        assert step.until * 1000 == pytest.approx(row["until_ms"], abs=1e-3)
        assert step.compute_through == 0
    else:
        assert step.until is None
        assert step.compute_through == row.get("compute_through", 0)


def test_the_front_step_table_reaches_every_branch():
    """Each kind of row the rule has a branch for is there (a table cut down by mistake fails here)."""
    names = " ".join(row["name"] for row in STEPS)
    for strategy in ("cake", "io_only", "compute_only"):
        assert any(row.get("strategy", "cake") == strategy for row in STEPS)
    for action in ("compute", "wait", "stop"):
        assert any(row["action"] == action for row in STEPS)
    assert any("done" in row for row in STEPS) and any(row.get("ended") for row in STEPS)
    assert any("compute_s" in row and row["action"] == "wait" for row in STEPS)
    assert any(row.get("paced_wait_given") for row in STEPS)
    assert any("meeting" in row and row["action"] == "wait" for row in STEPS)
    assert "past the deadline" in names


# --- socket_choice.toml -----------------------------------------------------------------------------------------

SOCKETS = golden("socket_choice.toml")


@contextlib.contextmanager
def effective_uid(uid):
    """Runs the block as `uid` (the effective uid only; root gets its own back after)."""
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)


def build_layout(root, entries):
    """The row's entries under root, in order (socket_choice.toml says what each kind is)."""
    for entry in entries:
        path = os.path.join(root, entry["path"])
        kind = entry["kind"]
        if kind == "folder":
            os.mkdir(path)
            os.chmod(path, entry["mode"])  # mkdir's mode passes through the umask
        elif kind == "file":
            with open(path, "w"):
                pass
            os.chmod(path, entry["mode"])
        elif kind == "socket":
            bound = socket.socket(socket.AF_UNIX)
            bound.bind(path)
            bound.close()  # the socket file stays
        elif kind == "symlink":
            os.symlink(os.path.join(root, entry["target"]), path)
        else:
            raise AssertionError(f"unknown entry kind {kind}")
        if entry.get("owner", "self") == "other":
            os.lchown(path, OTHER_OWNER, OTHER_OWNER)


def needs_root(row):
    return row.get("viewer", "self") != "self" or any(e.get("owner", "self") != "self" for e in row["entry"])


@pytest.mark.parametrize("row", SOCKETS["candidates"], ids=lambda row: row["name"])
def test_socket_candidates(row):
    environ = {} if "xdg" not in row else {"XDG_RUNTIME_DIR": row["xdg"]}
    candidates = cake_client._socket_candidates(row["euid"], environ)
    own = candidates[0] if len(candidates) > 1 else ""
    assert (own, candidates[-1]) == (row["own"], row["system"])


@pytest.mark.parametrize("row", SOCKETS["choice"], ids=lambda row: row["name"])
def test_socket_choice(row):
    if needs_root(row) and os.geteuid() != 0:
        pytest.skip("another user's entries, or another viewer, need root")
    root = tempfile.mkdtemp(prefix="cake-golden-")  # short: socket paths stay far below 107 bytes
    try:
        os.chmod(root, 0o755)  # a viewer of another uid looks in
        build_layout(root, row["entry"])
        own = os.path.join(root, row["own"]) if row["own"] else None
        system = os.path.join(root, row["system"])
        viewer = OTHER_VIEWER if row.get("viewer", "self") == "other" else None
        with effective_uid(viewer) if viewer is not None else contextlib.nullcontext():
            path, refusals = cake_client._choose_among(own, system, os.geteuid())
    finally:
        shutil.rmtree(root, ignore_errors=True)  # removes symbolic links, never what they lead to
    if "choice" in row:
        assert path == (own if row["choice"] == "own" else system)
    else:
        # Python's _find_socket raises FAILED_PRECONDITION when something was refused, and waits (its own folder
        # claimed) when there is simply no socket: the C++ UNAVAILABLE.
        assert path is None
        assert bool(refusals) == (row["error"] == "failed_precondition")
    assert len(refusals) == len(row["refused"]), refusals
    for refusal, expected in zip(refusals, row["refused"]):
        assert expected in refusal


@pytest.mark.parametrize("row", SOCKETS["explicit"], ids=lambda row: row["name"])
def test_cake_socket_is_taken_as_given(row, monkeypatch):
    monkeypatch.delenv("CAKE_SOCKET", raising=False)
    unset = cake.default_socket_path()
    monkeypatch.setenv("CAKE_SOCKET", row["cake_socket"])
    assert cake.default_socket_path() == row.get("path", unset)


# --- limit_defaults.toml ----------------------------------------------------------------------------------------

LIMITS = golden("limit_defaults.toml")["limit"]


def test_limit_defaults():
    defaults = asdict(cake.Limits())
    assert defaults.pop("from_daemon") is False
    assert defaults == {row["key"]: row["value"] for row in LIMITS}


def test_every_field_of_get_limits_has_a_default():
    assert [field.name for field in kv_pb2.GetLimitsResponse.DESCRIPTOR.fields] == [row["key"] for row in LIMITS]
