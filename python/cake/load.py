"""LoadSession: one Cake load over the daemon's bidirectional Load stream (docs/protocol.md, "Load").

A reader thread owns the stream: it takes the Plan, every ChunkLoaded and Done as they arrive and records them
under one condition variable. The engine's thread never blocks on gRPC: progress() only queues a message (gRPC's
own thread sends it), and every wait takes a timeout. Leaving the `with` block ends the load: Release (the daemon
answers once every read of the load has drained, so the window is free when the block is left), or a cancel when
the daemon does not answer in time or the stream already failed.

A daemon is a peer like any other, and a frozen one must not freeze the engine: every wait without a timeout of its
own (iterating, `plan`, `done`, wait_resident) gives up once the daemon has sent nothing for the session's idle
timeout, cancels the load and raises DeadlineExceeded; the wait for the end after Release has its own timeout.
"""
import queue
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple, Optional

import grpc

from cake._stubs import kv_pb2
from cake.errors import CakeError, DeadlineExceeded

# The wire's enums as the Python API spells them: one table each (the client's admin calls use them too).
TIER_NAMES = {kv_pb2.TIER_NONE: "none", kv_pb2.TIER_DRAM: "dram", kv_pb2.TIER_DISK: "disk",
              kv_pb2.TIER_REMOTE: "remote"}
STRATEGY_NAMES = {kv_pb2.LoadPlan.STRATEGY_CAKE: "cake", kv_pb2.LoadPlan.STRATEGY_IO_ONLY: "io_only",
                  kv_pb2.LoadPlan.STRATEGY_COMPUTE_ONLY: "compute_only"}
# How long an engine waits at the predicted meeting for loads that fell behind, beyond the plan's predicted
# time to first token: a fifth of it plus a millisecond (docs/protocol.md; the C++ NextFrontStep's constants).
WAIT_SLACK_FRACTION = 0.2
WAIT_SLACK_S = 1e-3
# An engine that waits on the loads' measured pace (next_step's compute_s) waits half as long again as that pace
# says, plus 2 ms, so loads that slip a little still land within the wait (one that gives up early computes a chunk
# about to land). The C++ NextFrontStep's paced mode uses the same two.
PACE_WAIT_FACTOR = 1.5
PACE_WAIT_SLACK_S = 2e-3


@dataclass(frozen=True)
class LoadPlan:
    load_id: str
    total_chunks: int
    cached_chunks: int            # H: the daemon loads from [lowest_loadable, H)
    tiers: list                   # per cached chunk: "dram", "disk" or "remote"
    lowest_loadable: int          # chunks below it do not fit the window: the engine computes them
    chunk_bytes: int
    strategy: str                 # "cake", "io_only" or "compute_only"
    predicted_meeting_chunk: Optional[int]
    predicted_cake_s: Optional[float]
    predicted_compute_only_s: Optional[float]
    predicted_io_only_s: Optional[float]


class ChunkLoaded(NamedTuple):
    """One landed chunk (a named tuple: the reader thread makes one per chunk, so it must be cheap)."""
    chunk: int
    region_offset: int            # from the start of the region (not of the window)
    bytes: int
    data: Optional[bytes]         # inline loads only


class Step(NamedTuple):
    """What an engine computing the front does next (LoadSession.next_step, next_front_step): "compute" its next
    chunk; "wait" for the loads until `until` (a time.monotonic() deadline: wait_resident(chunk, until - now)), then
    ask again; or "stop" computing the front (wait_done gives the final split, and the chunks up to it are the
    engine's). With "compute", compute_through is the chunk (exclusive) the engine may compute up to before it must
    ask again, unless a chunk it reaches is resident first: what an engine that computes several chunks per step
    caps its steps at (0 with "wait" and "stop"; the C++ FrontStep's field of the same name)."""
    action: str
    until: Optional[float] = None
    compute_through: int = 0


_STOP = Step("stop")


@dataclass(frozen=True)
class LoadDone:
    meeting_chunk: int            # compute [0, meeting_chunk), use the loaded [meeting_chunk, cached_chunks)
    loaded_chunks: int
    failed_chunks: int            # reads that failed or were corrupt: the engine computes them


class _BadMessage(Exception):
    """A message from the daemon that breaks the protocol; the load ends with DATA_LOSS."""


def _optional(message, field):
    return getattr(message, field) if message.HasField(field) else None


def _plan_from_proto(p):
    return LoadPlan(load_id=p.load_id, total_chunks=p.total_chunks, cached_chunks=p.cached_chunks,
                    tiers=[TIER_NAMES.get(t, "none") for t in p.chunk_tiers], lowest_loadable=p.lowest_loadable,
                    chunk_bytes=p.chunk_bytes, strategy=STRATEGY_NAMES.get(p.strategy, "cake"),
                    predicted_meeting_chunk=_optional(p, "predicted_meeting_chunk"),
                    predicted_cake_s=_optional(p, "predicted_cake_s"),
                    predicted_compute_only_s=_optional(p, "predicted_compute_only_s"),
                    predicted_io_only_s=_optional(p, "predicted_io_only_s"))


def _front_limit(plan):
    """The chunk the front may compute up to (exclusive): lowest_loadable under "io_only", else cached_chunks."""
    return plan.lowest_loadable if plan.strategy == "io_only" else plan.cached_chunks


def _meeting_deadline(plan, started):
    """Under "cake" with both predictions: started + predicted_cake_s * 1.2 + 1 ms; None otherwise."""
    if plan.strategy != "cake" or plan.predicted_meeting_chunk is None or plan.predicted_cake_s is None:
        return None
    return started + plan.predicted_cake_s * (1 + WAIT_SLACK_FRACTION) + WAIT_SLACK_S


def next_front_step(plan, started, next_chunk, loaded_low, done_meeting, now, *, stream_ended=False,
                    compute_s=None, resident_in_s=None, paced_wait_given=False):
    """The front-step rule, on what the engine knows when it is about to compute chunk `next_chunk`: a Step.
    One rule in both client libraries: the C++ cake::NextFrontStep (client/client.h; FrontStepExtras carries the
    keyword arguments) is the same function, and tests/golden/front_steps.toml pins both, row by row.
    plan: the LoadPlan; started, now: time.monotonic() of the Start and of now; loaded_low: the lowest chunk of the
    loaded suffix (cached_chunks while nothing landed); done_meeting: Done's meeting chunk once Done arrived;
    stream_ended: the stream ended without Done (nothing more lands).
    - past what the front may compute (lowest_loadable under "io_only", else cached_chunks): stop;
    - Done arrived: compute below its meeting chunk (failed reads moved it up), stop at it;
    - next_chunk resident (so all of [next_chunk, cached) are): stop;
    - under another strategy than "cake", or once the stream ended: compute up to the limit, never wait;
    - paced (compute_s, the engine's estimate of what computing next_chunk takes; resident_in_s, when the loads
      reach next_chunk at their measured pace, None while there is no pace): wait until now + resident_in_s * 1.5
      + 2 ms when that ETA is no longer than compute_s, once per chunk (paced_wait_given: that wait was given);
      else compute this one chunk and ask again. The pace replaces the prediction: it adapts when the engine runs
      faster or slower than its hint said (docs/benchmarks.md section 16);
    - under "cake" with both predicted_meeting_chunk and predicted_cake_s: compute up to the predicted meeting;
      at or past it, wait until started + predicted_cake_s * 1.2 + 1 ms (computing a chunk the loads are about to
      deliver is work thrown away); past that deadline the loads fell behind: compute on to the limit;
    - otherwise compute up to the limit."""
    limit = _front_limit(plan)
    if next_chunk >= limit:
        return _STOP
    if done_meeting is not None:
        return _STOP if next_chunk >= done_meeting else Step("compute", None, min(done_meeting, limit))
    if loaded_low is not None and loaded_low <= next_chunk < plan.cached_chunks:
        return _STOP
    if plan.strategy != "cake" or stream_ended:
        return Step("compute", None, limit)
    if compute_s is not None:
        if resident_in_s is None or resident_in_s > compute_s or paced_wait_given:
            return Step("compute", None, next_chunk + 1)
        return Step("wait", now + resident_in_s * PACE_WAIT_FACTOR + PACE_WAIT_SLACK_S)
    deadline = _meeting_deadline(plan, started)
    if deadline is not None:
        if next_chunk < plan.predicted_meeting_chunk:
            return Step("compute", None, min(plan.predicted_meeting_chunk, limit))
        if now < deadline:
            return Step("wait", deadline)
    return Step("compute", None, limit)


class LoadSession:
    """Made by Client.load(); use it as a context manager. Before each engine step: next_step(c) says whether to
    compute chunk c, wait for the loads or stop; after it, progress(c + 1). release() once the loaded chunks are
    copied out."""

    def __init__(self, stub, start=None, chunk_bytes=0, region_size=None, release_timeout_s=30.0,
                 idle_timeout_s=30.0):
        """start None: the stream opens now, ahead of a load that begin() starts later (Client keeps one ready,
        so a load does not wait for a stream's set-up and a thread). idle_timeout_s: how long a wait goes on
        while the daemon sends nothing before the load is given up (a live load sends a message per chunk)."""
        self.started_at = self._opened_at = time.monotonic()
        self._release_timeout_s = release_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._last_message_at = self._opened_at
        # The daemon is a peer like any other: what it sends is checked against what this client asked for.
        self._region_size = region_size          # None: an inline load
        self._chunk_bytes = chunk_bytes           # 0: the namespace takes the daemon's default chunk size
        self._requests = queue.SimpleQueue()
        self._on_release = None
        if start is not None:
            self._requests.put(kv_pb2.LoadRequest(start=start))
        # One lock, two conditions: the engine waiting for Done is not woken by every ChunkLoaded.
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)        # Plan, Done, the end of the stream
        self._chunk_cv = threading.Condition(self._lock)  # every ChunkLoaded (and Done, and the end)
        self._plan = None
        self._done = None
        self._loaded = []              # ChunkLoaded in arrival order (highest chunk first)
        self._by_chunk = {}
        self._arrivals = []            # monotonic time of each ChunkLoaded, for the engine's ETA of the loads
        self._loaded_low = None        # lowest chunk of the loaded suffix
        self._paced_wait_for = None    # the chunk next_step last said to wait for on the loads' pace
        self.loaded_messages = 0       # messages that carried landed chunks (fewer than chunks with batches)
        self._error = None             # CakeError: the stream ended with a status other than OK
        self._ended = False            # the stream is over (OK or not)
        self._sending = True           # the send side is still open
        self._released = False
        self._abandoned = False        # given up on a silent daemon: cancelled, and every wait raises _error
        self._call = stub.Load(self._request_stream())
        self._reader = threading.Thread(target=self._read, name="cake-load-reader", daemon=True)
        self._reader.start()

    def usable(self, max_age_s):
        """Opened ahead, not ended, and opened less than max_age_s ago (young enough that the daemon takes a Start
        on it: Client says how young)."""
        with self._cv:
            return not self._ended and time.monotonic() - self._opened_at < max_age_s

    def begin(self, start, chunk_bytes=0, region_size=None, on_release=None):
        """Starts the load on a stream opened ahead. on_release runs once release() has sent Release."""
        with self._cv:
            self.started_at = time.monotonic()
            self._region_size = region_size
            self._chunk_bytes = chunk_bytes
        self._on_release = on_release
        self._send(kv_pb2.LoadRequest(start=start))
        return self

    # --- the stream -----------------------------------------------------------------------------------------
    def _request_stream(self):
        while True:
            request = self._requests.get()
            if request is None:
                return  # closes the send side
            yield request

    def _read(self):
        error = None
        try:
            for response in self._call:
                self._on_response(response)
        except grpc.RpcError as rpc_error:
            error = CakeError.from_rpc_error(rpc_error)
        except _BadMessage as bad:
            error = CakeError(grpc.StatusCode.DATA_LOSS, f"the daemon sent a message this client refuses: {bad}")
            self._call.cancel()
        except Exception as unexpected:  # a malformed message must not kill the thread silently
            error = CakeError(grpc.StatusCode.INTERNAL, f"reading the Load stream: {unexpected!r}")
            self._call.cancel()
        with self._cv:
            if self._error is None:  # a load given up on keeps the reason it was given up for
                self._error = error
            self._ended = True
            self._cv.notify_all()
            self._chunk_cv.notify_all()
        self._close_send_side()

    def _on_response(self, response):
        which = response.WhichOneof("msg")
        if which == "loaded" or which == "loaded_batch":
            # One message may carry several landed chunks (loaded_batch, for a load that set accept_loaded_batch):
            # taken under one lock, with one wake-up, which is what makes small chunks cheap.
            messages = (response.loaded,) if which == "loaded" else response.loaded_batch.chunks
            with self._cv:
                now = self._last_message_at = time.monotonic()
                self.loaded_messages += 1
                for m in messages:
                    event = ChunkLoaded(m.chunk, m.region_offset, m.bytes, m.data or None)
                    self._check_loaded_locked(event)
                    self._loaded.append(event)
                    self._arrivals.append(now)
                    self._by_chunk[event.chunk] = event
                    if event.chunk < self._loaded_low:
                        self._loaded_low = event.chunk
                self._chunk_cv.notify_all()
            return
        with self._cv:
            self._last_message_at = time.monotonic()
            if which == "plan":
                if self._plan is not None:
                    raise _BadMessage("a second Plan")
                plan = _plan_from_proto(response.plan)
                if not (plan.lowest_loadable <= plan.cached_chunks <= plan.total_chunks) or (
                        plan.cached_chunks and self._chunk_bytes and plan.chunk_bytes != self._chunk_bytes):
                    raise _BadMessage(f"a Plan of {plan.cached_chunks} cached chunks of {plan.total_chunks}, "
                                      f"lowest loadable {plan.lowest_loadable}, {plan.chunk_bytes}-byte chunks")
                self._plan = plan
                self._loaded_low = plan.cached_chunks
            elif which == "done":
                if self._plan is None or self._done is not None:
                    raise _BadMessage("Done before a Plan, or twice")
                d = response.done
                # [m, H) must all have been reported loaded: the engine is about to use them.
                if d.meeting_chunk > self._plan.cached_chunks or d.meeting_chunk < self._loaded_low:
                    raise _BadMessage(f"Done at chunk {d.meeting_chunk} with chunks loaded only from "
                                      f"{self._loaded_low}")
                self._done = LoadDone(meeting_chunk=d.meeting_chunk, loaded_chunks=d.loaded_chunks,
                                      failed_chunks=d.failed_chunks)
                self._chunk_cv.notify_all()
            else:
                raise _BadMessage("a LoadResponse with no message set")
            self._cv.notify_all()

    def _check_loaded_locked(self, event):
        plan = self._plan
        if plan is None or self._done is not None:
            raise _BadMessage(f"ChunkLoaded for chunk {event.chunk} before the Plan or after Done")
        if not plan.lowest_loadable <= event.chunk < plan.cached_chunks or event.chunk in self._by_chunk:
            raise _BadMessage(f"ChunkLoaded for chunk {event.chunk}, outside [{plan.lowest_loadable}, "
                              f"{plan.cached_chunks}) or twice")
        if self._region_size is None:
            if event.data is None or len(event.data) != plan.chunk_bytes:
                raise _BadMessage(f"inline chunk {event.chunk} of {len(event.data or b'')} bytes, not "
                                  f"{plan.chunk_bytes}")
        elif event.bytes != plan.chunk_bytes or event.region_offset + event.bytes > self._region_size:
            raise _BadMessage(f"chunk {event.chunk} at {event.region_offset} (+{event.bytes} bytes) is outside "
                              f"the {self._region_size}-byte region")

    def _close_send_side(self):
        with self._cv:
            if not self._sending:
                return
            self._sending = False
        self._requests.put(None)

    def _send(self, request):
        with self._cv:
            if not self._sending:
                return False
            self._requests.put(request)
            return True

    def _wait(self, predicate, timeout, condition=None):
        """Waits on `condition` (default: Plan/Done/end) until predicate() holds or the stream ended, and returns
        None then; "timeout" once the caller's `timeout` (seconds; None: none) has passed; "silent" once the daemon
        has sent nothing for the idle timeout, counted from its last message or from the start of this wait,
        whichever is later (an engine busy computing between two waits has not seen the daemon fall silent).
        A load given up on returns at once. Call with the lock held."""
        condition = condition or self._cv
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        while not predicate() and not self._ended and not self._abandoned:
            now = time.monotonic()
            silent_at = max(self._last_message_at, started) + self._idle_timeout_s
            if deadline is not None and now >= deadline:
                return "timeout"
            if now >= silent_at:
                return "silent"
            condition.wait((silent_at if deadline is None else min(deadline, silent_at)) - now)
        return None

    def _gave_up(self, outcome, what, timeout):
        """The DeadlineExceeded for a wait that ended with `outcome` ("timeout" or "silent"). A silent daemon's
        load is cancelled (call without the lock): the engine computes instead, and every later wait fails at once."""
        if outcome == "timeout":
            return DeadlineExceeded(f"{what} did not arrive within {timeout} s")
        error = DeadlineExceeded(f"the daemon sent nothing for {self._idle_timeout_s} s while this client waited "
                                 f"for {what}; the load was cancelled")
        with self._cv:
            self._abandoned = True
            if self._error is None and not self._ended:
                self._error = error
            error = self._error or error
        self._call.cancel()
        self._close_send_side()
        return error

    # --- what an engine calls -------------------------------------------------------------------------------
    def wait_plan(self, timeout=None):
        """The daemon's Plan; raises CakeError if the daemon refused the load, DeadlineExceeded (a TimeoutError)
        after `timeout` s or once the daemon has been silent for the idle timeout."""
        with self._cv:
            outcome = self._wait(lambda: self._plan is not None, timeout)
            if outcome is None:
                if self._plan is None:
                    raise self._error or CakeError(grpc.StatusCode.INTERNAL, "the Load stream ended before its Plan")
                return self._plan
        raise self._gave_up(outcome, "the Plan", timeout)

    @property
    def plan(self):
        return self.wait_plan()

    def progress(self, computed_through):
        """Chunks [0, computed_through) are computed. Never blocks; a no-op once the load has ended."""
        self._send(kv_pb2.LoadRequest(progress=kv_pb2.LoadProgress(computed_through=computed_through)))

    def is_resident(self, chunk):
        """Whether chunk's bytes are in the region (or held inline); True means all of [chunk, cached) are."""
        with self._cv:
            return self._resident_locked(chunk)

    def _resident_locked(self, chunk):
        return self._plan is not None and self._loaded_low <= chunk < self._plan.cached_chunks

    @property
    def loaded_low(self):
        """The lowest chunk of the loaded suffix so far (cached_chunks while nothing is loaded; None before Plan)."""
        with self._cv:
            return self._loaded_low

    def wait_resident(self, chunk, timeout=None):
        """Waits until chunk is resident, Done arrived or the stream ended; returns is_resident(chunk). With a
        timeout (seconds), gives up then: an engine waiting at the predicted meeting for loads that fell behind.
        Raises DeadlineExceeded once the daemon has been silent for the idle timeout."""
        with self._cv:
            outcome = self._wait(lambda: self._resident_locked(chunk) or self._done is not None, timeout,
                                 self._chunk_cv)
            if outcome != "silent":
                return self._resident_locked(chunk)
        raise self._gave_up(outcome, f"chunk {chunk}", timeout)

    def seconds_until_resident(self, chunk):
        """How long until the loads reach `chunk`, from the pace they have kept so far: 0 when it is resident,
        None while there is no pace to go by (fewer than two chunks landed and no I/O-only prediction). An
        engine at chunk c computes it when this is longer than computing c takes, and otherwise waits for it:
        computing a chunk the loads deliver sooner is work thrown away (LoadSession docs, docs/engines.md)."""
        with self._cv:
            if self._plan is None or self._resident_locked(chunk):
                return 0.0 if self._plan is not None else None
            if self._done is not None or self._ended or chunk < self._plan.lowest_loadable:
                return None  # nothing more will land there
            remaining = self._loaded_low - chunk
            arrivals = self._arrivals
            # The pace over about the last four chunks; chunks of one batch share an arrival time, so the window
            # reaches back to the last arrival before the latest message.
            first = max(len(arrivals) - 5, 0)
            while first > 0 and arrivals[first] == arrivals[-1]:
                first -= 1
            if len(arrivals) >= 2 and arrivals[first] < arrivals[-1]:
                interval = (arrivals[-1] - arrivals[first]) / (len(arrivals) - 1 - first)
                return max(0.0, arrivals[-1] + remaining * interval - time.monotonic())
            loadable = self._plan.cached_chunks - self._plan.lowest_loadable
            if self._plan.predicted_io_only_s is not None and loadable > 0:
                interval = self._plan.predicted_io_only_s / loadable
                since = self._arrivals[-1] if self._arrivals else self.started_at
                return max(0.0, since + remaining * interval - time.monotonic())
            return None

    def meeting_deadline(self):
        """Under strategy "cake" with a prediction: the monotonic time until which an engine at the predicted
        meeting should wait for the loads (started_at + predicted_cake_s * 1.2 + 1 ms); None otherwise."""
        return _meeting_deadline(self.plan, self.started_at)

    def next_step(self, next_chunk, compute_s=None):
        """What an engine that has computed [0, next_chunk) does next: a Step ("compute" up to compute_through,
        "wait" until a deadline, or "stop"); waits for the Plan first (raising as wait_plan does). The rule is
        next_front_step (the C++ NextFrontStep; tests/golden/front_steps.toml pins both) on this load's state:
        stop at the limit, at Done's meeting chunk or at a resident chunk; under "cake" wait at the predicted
        meeting until meeting_deadline(); otherwise compute. compute_s (the engine's own estimate of what computing
        next_chunk takes) asks for the paced mode: the ETA is seconds_until_resident(next_chunk), and the session
        remembers the chunk it last said to wait for, so the wait comes once per chunk. A stream that ended without
        Done delivers nothing more: the engine computes on, and wait_done raises. (The C++ LoadSession::NextStep
        has no compute_s: its session does not measure the loads' pace; an engine there passes the ETA to
        NextFrontStep itself.)"""
        plan = self.wait_plan()
        with self._cv:
            done_meeting = None if self._done is None else self._done.meeting_chunk
            loaded_low = self._loaded_low
            ended = self._ended or self._abandoned
        paced_wait_given = self._paced_wait_for == next_chunk
        resident_in_s = None
        if compute_s is not None and plan.strategy == "cake" and not ended and done_meeting is None:
            resident_in_s = self.seconds_until_resident(next_chunk)
        step = next_front_step(plan, self.started_at, next_chunk, loaded_low, done_meeting, time.monotonic(),
                               stream_ended=ended, compute_s=compute_s, resident_in_s=resident_in_s,
                               paced_wait_given=paced_wait_given)
        if step.action == "wait" and compute_s is not None:
            self._paced_wait_for = next_chunk
        return step

    def chunk(self, chunk):
        """The ChunkLoaded of a resident chunk (its region_offset, or its inline data); KeyError otherwise."""
        with self._cv:
            return self._by_chunk[chunk]

    def loaded_since(self, index):
        """The ChunkLoaded events from the index-th on, without waiting: an engine polls this between steps to
        take chunks as they land."""
        with self._cv:
            return self._loaded[index:]

    def region_offset(self, chunk):
        return self.chunk(chunk).region_offset

    def __iter__(self):
        """Every ChunkLoaded as it lands, highest chunk first, until Done; raises CakeError if the stream failed,
        DeadlineExceeded once the daemon has been silent for the idle timeout."""
        index = 0
        while True:
            with self._cv:
                outcome = self._wait(lambda: index < len(self._loaded) or self._done is not None, None,
                                     self._chunk_cv)
                if outcome is None:
                    if index < len(self._loaded):
                        event = self._loaded[index]
                    elif self._done is not None or self._error is None:
                        return
                    else:
                        raise self._error
            if outcome is not None:
                raise self._gave_up(outcome, "the next chunk or Done", None)
            index += 1
            yield event

    def wait_done(self, timeout=None):
        """The final split; raises CakeError if the stream failed first, DeadlineExceeded (a TimeoutError) after
        `timeout` s or once the daemon has been silent for the idle timeout."""
        with self._cv:
            outcome = self._wait(lambda: self._done is not None, timeout)
            if outcome is None:
                if self._done is None:
                    raise self._error or CakeError(grpc.StatusCode.INTERNAL, "the Load stream ended before Done")
                return self._done
        raise self._gave_up(outcome, "Done", timeout)

    @property
    def done(self):
        return self.wait_done()

    @property
    def ended(self):
        with self._cv:
            return self._ended

    def release(self, timeout=None, wait=True):
        """Tells the daemon the loaded chunks were copied out and closes the send side. With wait (the default),
        waits for the stream's end (the daemon ends it once every read of the load has drained: the window is
        then free) and raises CakeError if it ended with an error; a stream that does not end within `timeout`
        s is cancelled. wait=False returns at once: an engine that has copied out what it needs computes on
        while reads it no longer needs drain, and calls wait_ended() before it reuses the window."""
        self._released = True
        self._send(kv_pb2.LoadRequest(release=kv_pb2.LoadRelease()))
        self._close_send_side()
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()
        if wait:
            self.wait_ended(timeout)

    def wait_ended(self, timeout=None):
        """Waits for the stream's end (the window is free then); raises CakeError if it ended with an error. A
        stream that does not end within `timeout` s (default: the session's release timeout) is cancelled."""
        timeout = self._release_timeout_s if timeout is None else timeout
        self._reader.join(timeout)
        if self._reader.is_alive():
            self.cancel()
            raise DeadlineExceeded(f"the daemon did not end the load within {timeout} s of Release; cancelled it")
        if self._error is not None:
            raise self._error

    def cancel(self):
        """Cancels the stream; the daemon frees what the load held once its reads drain."""
        self._call.cancel()
        self._close_send_side()
        self._reader.join(5.0)

    def close(self):
        """Ends the load however it stands: Release if it is still running (and not released yet, nor given up
        on), quietly."""
        if self.ended or self._released or self._abandoned:
            self._close_send_side()
            return
        try:
            self.release()
        except CakeError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
