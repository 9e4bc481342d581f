"""Fixtures: a real caked per test module (or per test where the test needs its own), started on a temporary
socket and stopped and waited for afterwards."""
import pytest

from cake.testing import SpawnedDaemon


@pytest.fixture(scope="module")
def daemon():
    with SpawnedDaemon(["--dram-capacity-mib", "256"]) as d:
        yield d
        assert d.alive(), f"caked died during the tests:\n{d.log()}"


@pytest.fixture
def client(daemon):
    with daemon.client() as c:
        yield c


@pytest.fixture
def fresh_daemon():
    """A daemon of the test's own, for tests that change its state (caps, evictions, killed clients)."""
    started = []

    def start(*args):
        d = SpawnedDaemon(list(args) or ["--dram-capacity-mib", "256"])
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
