"""LoadSession.next_step, the rule an engine computing the front follows: each branch on a session fed a scripted
stream (what the session feeds the rule: its Plan, loaded suffix, Done, the stream's end, the loads' pace), then a
Cake load against a real caked driven by it. The rule itself, next_front_step (the C++ NextFrontStep), is pinned
row by row by tests/golden/front_steps.toml in test_golden_rules.py and tests/client/front_step_golden_test.cc."""
import queue
import threading
import time

import grpc
import pytest

import cake
from cake._stubs import kv_pb2
from cake.load import LoadSession
from helpers import prompt, small_namespace

CHUNK = small_namespace().chunk_bytes
STRATEGIES = {"cake": kv_pb2.LoadPlan.STRATEGY_CAKE, "io_only": kv_pb2.LoadPlan.STRATEGY_IO_ONLY,
              "compute_only": kv_pb2.LoadPlan.STRATEGY_COMPUTE_ONLY}


class ScriptedStream:
    """Stands in for the stub and its Load call: what the test sends arrives on the session's reader thread, in
    order; end() (or the session's cancel) ends the stream without an error."""

    def __init__(self):
        self._responses = queue.SimpleQueue()

    def Load(self, requests):
        return self

    def __iter__(self):
        while (response := self._responses.get()) is not None:
            yield response

    def send(self, *responses):
        for response in responses:
            self._responses.put(response)

    def end(self):
        self._responses.put(None)

    cancel = end


def plan(cached=4, lowest=0, strategy="cake", meeting=None, cake_s=None, io_only_s=None):
    p = kv_pb2.LoadPlan(load_id="scripted", total_chunks=cached, cached_chunks=cached, lowest_loadable=lowest,
                        chunk_bytes=CHUNK, strategy=STRATEGIES[strategy])
    if meeting is not None:
        p.predicted_meeting_chunk = meeting
    if cake_s is not None:
        p.predicted_cake_s = cake_s
    if io_only_s is not None:
        p.predicted_io_only_s = io_only_s
    return kv_pb2.LoadResponse(plan=p)


def loaded(chunk):
    return kv_pb2.LoadResponse(loaded=kv_pb2.ChunkLoaded(chunk=chunk, region_offset=chunk * CHUNK, bytes=CHUNK))


def done(meeting, loaded_chunks):
    return kv_pb2.LoadResponse(done=kv_pb2.LoadDone(meeting_chunk=meeting, loaded_chunks=loaded_chunks))


@pytest.fixture
def scripted():
    """scripted(*responses) -> (stream, session): a session whose stream has sent these (the Plan is in)."""
    sessions = []

    def start(*responses):
        stream = ScriptedStream()
        session = LoadSession(stream, start=kv_pb2.LoadStart(), chunk_bytes=CHUNK, region_size=8 * CHUNK,
                              idle_timeout_s=10)
        sessions.append(session)
        stream.send(*responses)
        if responses:
            session.wait_plan(5)
        return stream, session

    yield start
    for session in sessions:
        session.cancel()


def test_before_the_plan_it_waits_for_it_or_raises_as_wait_plan_does(scripted):
    stream, session = scripted()
    threading.Timer(0.05, stream.send, [plan()]).start()
    assert session.next_step(0) == ("compute", None, 4)
    stream, session = scripted()
    stream.end()  # the stream ends with no Plan
    with pytest.raises(cake.CakeError) as error:
        session.next_step(0)
    assert error.value.code == grpc.StatusCode.INTERNAL and "before its Plan" in error.value.message


@pytest.mark.parametrize("strategy, lowest, limit", [("cake", 1, 4), ("io_only", 2, 2), ("compute_only", 4, 4)])
def test_the_front_stops_where_the_strategy_says(scripted, strategy, lowest, limit):
    """Up to lowest_loadable under io_only (the daemon loads the rest), else up to cached_chunks."""
    _, session = scripted(plan(cached=4, lowest=lowest, strategy=strategy))
    assert [session.next_step(c) for c in range(limit)] == [("compute", None, limit)] * limit
    assert session.next_step(limit) == ("stop", None, 0)


def test_a_resident_chunk_stops_the_front(scripted):
    _, session = scripted(plan(), loaded(3))
    assert session.wait_resident(3, 5)
    assert session.next_step(2) == ("compute", None, 4)
    assert session.next_step(3) == ("stop", None, 0)


def test_after_done_the_front_computes_up_to_the_meeting_resident_or_not(scripted):
    """A failed read moves the meeting above chunks that did land: the engine computes them all the same."""
    _, session = scripted(plan(), loaded(3), loaded(2), done(3, 2))
    assert session.wait_done(5).meeting_chunk == 3 and session.is_resident(2)
    assert session.next_step(2) == ("compute", None, 3)
    assert session.next_step(3) == ("stop", None, 0)


def test_at_the_predicted_meeting_the_front_waits_until_the_deadline(scripted):
    _, session = scripted(plan(meeting=2, cake_s=10.0))
    deadline = session.started_at + 10.0 * 1.2 + 1e-3
    assert session.meeting_deadline() == pytest.approx(deadline)
    assert session.next_step(1) == ("compute", None, 2)  # up to the predicted meeting, then ask again
    assert session.next_step(2) == ("wait", session.meeting_deadline(), 0)
    assert session.next_step(3) == ("wait", session.meeting_deadline(), 0)  # past the prediction: still waits


def test_past_the_deadline_or_without_a_prediction_the_front_computes_on(scripted):
    _, late = scripted(plan(meeting=2, cake_s=0.0))  # the deadline was 1 ms after the start
    time.sleep(0.01)
    assert late.next_step(2) == ("compute", None, 4)
    _, unpredicted = scripted(plan(meeting=2))
    assert unpredicted.meeting_deadline() is None and unpredicted.next_step(2) == ("compute", None, 4)
    _, io_only = scripted(plan(lowest=3, strategy="io_only", meeting=2, cake_s=10.0))  # only "cake" waits
    assert io_only.next_step(2) == ("compute", None, 3)


def test_a_wait_ends_when_the_loads_arrive_and_the_front_stops(scripted):
    stream, session = scripted(plan(meeting=2, cake_s=10.0))
    step = session.next_step(2)
    assert step.action == "wait"
    threading.Timer(0.05, stream.send, [loaded(3), loaded(2)]).start()
    assert session.wait_resident(2, timeout=step.until - time.monotonic())
    assert session.next_step(2) == ("stop", None, 0)


def test_a_stream_that_ended_without_done_is_not_waited_for(scripted):
    """Nothing more will land: waiting until the deadline would spin (wait_resident returns at once)."""
    stream, session = scripted(plan(meeting=2, cake_s=10.0))
    stream.end()
    deadline = time.monotonic() + 5
    while not session.ended:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert session.next_step(2) == ("compute", None, 4)  # up to the limit: no meeting to stop at any more


def test_with_the_engines_cost_the_front_waits_on_the_loads_pace_once_per_chunk(scripted):
    """compute_s: wait when the loads reach the chunk no later than computing it would (here their predicted pace,
    1 s a chunk, with nothing landed yet), for 1.5x that plus 2 ms; once per chunk."""
    _, session = scripted(plan(io_only_s=4.0))
    assert session.next_step(3, compute_s=0.5) == ("compute", None, 4)  # chunk 3 lands in about 1 s
    now = time.monotonic()
    step = session.next_step(3, compute_s=2.0)
    eta = session.started_at + 1.0 - now
    assert step.action == "wait" and step.until == pytest.approx(now + eta * 1.5 + 2e-3, abs=0.05)
    assert session.next_step(3, compute_s=2.0) == ("compute", None, 4)  # waited for it once already
    assert session.next_step(2, compute_s=5.0).action == "wait"


def test_a_cake_load_driven_by_next_step_meets_the_daemon(fresh_daemon):
    """An engine's loop on next_step against a real caked, reads capped so that loading and computing overlap:
    it stops, and every chunk from where it stopped (or Done's meeting) to the cached end is resident."""
    daemon = fresh_daemon("--dram-capacity-mib", "64", "--dram-read-gbps", "0.01")  # about 3 ms a chunk
    ns, tokens = small_namespace("stepper"), prompt(12, seed=51)
    compute_s = 0.003
    with daemon.client() as client:
        region = client.register_region(12 * ns.chunk_bytes)
        client.store(ns, tokens=tokens, first_chunk=0, chunk_count=12, region=region)
        with client.load(ns, tokens=tokens, region=region, compute_first_chunk_s=compute_s) as load:
            computed, steps = 0, []
            while (step := load.next_step(computed)).action != "stop":
                steps.append(step.action)
                if step.action == "wait":
                    load.wait_resident(computed, timeout=max(0.0, step.until - time.monotonic()))
                    continue
                time.sleep(compute_s)  # the engine computes chunk `computed`
                computed += 1
                load.progress(computed)
            result = load.wait_done(10)
            assert computed <= load.plan.cached_chunks
            assert all(load.is_resident(c) for c in range(max(computed, result.meeting_chunk), 12)), steps
            load.release()
        client.release_region(region)
