"""The daemon is a peer like any other: a server that speaks cake.v1 but breaks the Load protocol (chunks outside
the plan or the region, wrong sizes, Done before its chunks) ends that load with CakeError(DATA_LOSS), and the
client keeps working; one that falls silent (connected, alive, answering nothing) ends every wait with
DeadlineExceeded within the client's timeout. The server here is a real gRPC server on a unix socket, scripted
per test."""
import itertools
import os
import threading
import time
from concurrent import futures

import grpc
import pytest

import cake
from cake._stubs import admin_pb2, admin_pb2_grpc, kv_pb2, kv_pb2_grpc
from helpers import small_namespace

NS = small_namespace("hostile")
CHUNK = NS.chunk_bytes


def plan(cached=4, total=4, lowest=0, chunk_bytes=CHUNK):
    return kv_pb2.LoadResponse(plan=kv_pb2.LoadPlan(load_id="x", total_chunks=total, cached_chunks=cached,
                                                    lowest_loadable=lowest, chunk_bytes=chunk_bytes))


def loaded(chunk, offset=None, nbytes=CHUNK, data=b""):
    return kv_pb2.LoadResponse(loaded=kv_pb2.ChunkLoaded(chunk=chunk, region_offset=chunk * CHUNK if offset is None
                                                         else offset, bytes=nbytes, data=data))


def done(meeting, loaded_chunks=0):
    return kv_pb2.LoadResponse(done=kv_pb2.LoadDone(meeting_chunk=meeting, loaded_chunks=loaded_chunks))


FREEZE = "freeze"  # in a script: the daemon answers nothing more on that stream (until the test ends)


class Scripted(kv_pb2_grpc.KvServiceServicer, admin_pb2_grpc.AdminServiceServicer):
    script = []
    release_freezes = False  # ReleaseRegion never answers

    def __init__(self):
        self.thaw = threading.Event()
        self._region_ids = itertools.count(1)

    def Load(self, requests, context):
        next(requests)  # the Start
        for message in self.script:
            if message == FREEZE:
                self.thaw.wait()
                return
            yield message

    def RegisterRegion(self, request, context):
        return kv_pb2.RegisterRegionResponse(region_id=f"r-{next(self._region_ids)}", kind=kv_pb2.REGION_HOST_SHM,
                                             bytes=request.bytes, shm_name=self.shm_name)

    def ReleaseRegion(self, request, context):
        if self.release_freezes:
            self.thaw.wait()
        return kv_pb2.ReleaseRegionResponse()

    def Ping(self, request, context):
        return admin_pb2.PingResponse()


@pytest.fixture
def hostile(tmp_path):
    servicer = Scripted()
    # A real shared-memory object for the region the fake daemon hands out.
    servicer.shm_name = f"/cake-test-{os.getpid()}"
    fd = os.open("/dev/shm" + servicer.shm_name, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8 * CHUNK)
    os.close(fd)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    kv_pb2_grpc.add_KvServiceServicer_to_server(servicer, server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
    socket = str(tmp_path / "hostile.sock")
    server.add_insecure_port("unix:" + socket)
    server.start()
    servicer.socket = socket
    client = cake.Client(socket)
    yield servicer, client
    servicer.thaw.set()
    client._channel.close()
    server.stop(0)
    os.unlink("/dev/shm" + servicer.shm_name)


BAD_SCRIPTS = {
    "chunk past the plan": [plan(), loaded(4)],
    "chunk below lowest_loadable": [plan(lowest=2), loaded(1)],
    "the same chunk twice": [plan(), loaded(3), loaded(3)],
    "offset past the region": [plan(), loaded(3, offset=8 * CHUNK)],
    "wrong chunk size": [plan(), loaded(3, nbytes=CHUNK * 2)],
    "plan of another chunk size": [plan(chunk_bytes=CHUNK + 1)],
    "plan with more cached than total": [plan(cached=5, total=4)],
    "done before its chunks": [plan(), loaded(3), done(1, 3)],
    "done past the prefix": [plan(), done(9)],
    "chunk after done": [plan(), loaded(3), loaded(2), loaded(1), loaded(0), done(0, 4), loaded(0)],
}


@pytest.mark.parametrize("name", list(BAD_SCRIPTS))
def test_a_protocol_breaking_daemon_ends_the_load_with_data_loss(hostile, name):
    servicer, client = hostile
    servicer.script = BAD_SCRIPTS[name]
    region = client.register_region(8 * CHUNK)
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region) as load:
        with pytest.raises(cake.CakeError) as error:
            load.wait_done(10)
            list(load)
            load.release(5)
        assert error.value.code == grpc.StatusCode.DATA_LOSS, error.value
    client.ping()  # the client still works


def test_inline_chunks_of_the_wrong_size(hostile):
    servicer, client = hostile
    servicer.script = [plan(), loaded(3, offset=0, nbytes=CHUNK, data=b"short")]
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens))) as load:
        with pytest.raises(cake.CakeError) as error:
            load.wait_done(10)
        assert error.value.code == grpc.StatusCode.DATA_LOSS


def test_a_well_behaved_script_passes(hostile):
    servicer, client = hostile
    servicer.script = [plan(), loaded(3), loaded(2), done(2, 2)]
    region = client.register_region(8 * CHUNK)
    with client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region) as load:
        assert load.wait_done(10).meeting_chunk == 2
        assert [e.chunk for e in load] == [3, 2]


# --- a silent daemon -----------------------------------------------------------------------------------------------
TIMEOUT_S = 0.5
SLACK_S = 2.0  # a loaded machine's scheduling, well short of a wait without end


def _within(seconds, call):
    """call()'s result or exception, run on a thread of its own so that a wait without end fails the test instead of
    hanging it; also the seconds it took."""
    outcome = {}

    def run():
        started = time.monotonic()
        try:
            outcome["result"] = call()
        except BaseException as error:  # noqa: B902 (what the call raised is what the test looks at)
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return outcome


def _silent_client(servicer):
    return cake.Client(servicer.socket, timeout_s=TIMEOUT_S, load_timeout_s=TIMEOUT_S)


SILENCES = {  # where the daemon falls silent, and the wait that meets it
    "before the plan: plan": ([FREEZE], lambda load: load.plan),
    "before the plan: iterating": ([FREEZE], lambda load: list(load)),
    "before the plan: done": ([FREEZE], lambda load: load.wait_done()),
    "after the plan: iterating": ([plan(), FREEZE], lambda load: list(load)),
    "after the plan: done": ([plan(), FREEZE], lambda load: load.done),
    "after the plan: a resident chunk": ([plan(), FREEZE], lambda load: load.wait_resident(0)),
    "after a chunk: iterating": ([plan(), loaded(3), FREEZE], lambda load: [e.chunk for e in load]),
    "a longer wait than the silence allows": ([plan(), FREEZE], lambda load: load.wait_done(600)),
}


@pytest.mark.parametrize("name", list(SILENCES))
def test_a_silent_daemon_ends_every_wait_of_a_load_within_the_timeout(hostile, name):
    servicer, _ = hostile
    servicer.script, wait = SILENCES[name]
    with _silent_client(servicer) as client:
        region = client.register_region(8 * CHUNK)
        load = client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region)
        outcome = _within(TIMEOUT_S + SLACK_S, lambda: wait(load))
        error = outcome.get("error")
        assert isinstance(error, cake.DeadlineExceeded), outcome
        assert isinstance(error, TimeoutError) and error.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "sent nothing" in error.message
        # The load was given up on: every later wait fails at once, and leaving it does not wait again.
        again = _within(SLACK_S, lambda: load.wait_done())
        assert isinstance(again.get("error"), cake.CakeError) and again["seconds"] < TIMEOUT_S, again
        assert _within(SLACK_S, load.close)["seconds"] < TIMEOUT_S


def test_a_daemon_that_keeps_sending_is_waited_for_past_the_timeout(hostile):
    """The timeout counts silence, not a load's length: each message from the daemon starts the count again."""
    servicer, _ = hostile
    # A longer timeout than the other cases and gaps a quarter of it: the test and its scripted daemon share one
    # interpreter, so a loaded machine stretches each gap by whatever the GIL and the scheduler add. Ten messages
    # (the fixture's region holds 8 chunks) take 4.5 s, past twice the timeout with a gap to spare.
    timeout_s, gap_s, chunks = 1.8, 0.45, 8

    class Slow(list):
        def __iter__(self):
            for message in super().__iter__():
                time.sleep(gap_s)
                yield message

    servicer.script = Slow([plan(chunks, chunks)] + [loaded(c) for c in reversed(range(chunks))] +
                           [done(0, chunks)])
    with cake.Client(servicer.socket, timeout_s=timeout_s, load_timeout_s=timeout_s) as client:
        region = client.register_region(chunks * CHUNK)
        with client.load(NS, tokens=list(range(chunks * NS.chunk_tokens)), region=region) as load:
            outcome = _within(10 * timeout_s + SLACK_S, lambda: [e.chunk for e in load])
            assert outcome.get("result") == list(reversed(range(chunks))), outcome
            assert outcome["seconds"] > timeout_s * 2  # the load outlasted the timeout twice over


def test_release_against_a_silent_daemon_gives_up_within_the_timeout(hostile):
    servicer, _ = hostile
    servicer.script = [plan(), loaded(3), loaded(2), loaded(1), loaded(0), done(0, 4), FREEZE]  # never ends it
    with _silent_client(servicer) as client:
        region = client.register_region(8 * CHUNK)
        load = client.load(NS, tokens=list(range(4 * NS.chunk_tokens)), region=region)
        assert load.wait_done(10).meeting_chunk == 0
        outcome = _within(TIMEOUT_S + SLACK_S + 5.0, load.release)  # + the cancel's own bounded join
        assert isinstance(outcome.get("error"), cake.DeadlineExceeded), outcome
        assert "within 0.5 s of Release" in outcome["error"].message
        assert outcome["seconds"] < TIMEOUT_S + SLACK_S


def test_releasing_regions_on_a_silent_daemon_gives_up_within_the_timeout(hostile):
    servicer, _ = hostile
    servicer.release_freezes = True
    client = _silent_client(servicer)
    region = client.register_region(8 * CHUNK)
    outcome = _within(TIMEOUT_S + SLACK_S, lambda: client.release_region(region))
    assert isinstance(outcome.get("error"), cake.DeadlineExceeded), outcome
    assert region.closed  # unmapped here all the same
    # Closing with several regions waits for one deadline, not one per region.
    for _ in range(10):
        client.register_region(8 * CHUNK)
    outcome = _within(10 * TIMEOUT_S + SLACK_S, client.close)
    assert "error" not in outcome, outcome
    assert outcome["seconds"] < 5 * TIMEOUT_S, outcome  # one per region would be 10
