"""The vLLM integration's log, and the regions its workers hold.

log: a logger under vLLM's own "vllm" logger ("vllm.cake"). vLLM's logging configuration gives "vllm" its handler
and format (VLLM_LOGGING_LEVEL, VLLM_CONFIGURE_LOGGING) and stops it there, so a logger outside that tree has no
handler in a vLLM process: the connector's lines under "cake.vllm" were never seen. Without vLLM, "vllm.cake"
propagates to the root logger like any other.

once(): one line per reason (not per request: a daemon that is down would otherwise log every lookup), said again
only after forget() (the trouble ended, so the next one is news).

RegionSlot: one of a worker's regions, registered again when the daemon no longer holds it (it restarted, or the
region's lease ran out while the daemon was unreachable), so the cache works again without restarting vLLM.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("vllm.cake")

_said: set = set()
_said_lock = threading.Lock()


def once(level: int, reason: str, message: str, *args) -> bool:
    """Logs message at level unless reason was said since the last forget(reason). True when it logged."""
    with _said_lock:
        if reason in _said:
            return False
        _said.add(reason)
    log.log(level, message, *args)
    return True


def forget(reason: str) -> bool:
    """The trouble named reason is over: True when it had been said (so a recovery line is worth logging)."""
    with _said_lock:
        if reason in _said:
            _said.discard(reason)
            return True
        return False


def forget_all(prefix: str) -> bool:
    """forget() of every reason that starts with prefix: True when any had been said."""
    with _said_lock:
        gone = {reason for reason in _said if reason.startswith(prefix)}
        _said.difference_update(gone)
        return bool(gone)


def region_unknown(error) -> bool:
    """Whether a call failed because the daemon does not hold the region it named (NOT_FOUND on a region)."""
    code = getattr(error, "code", None)
    return getattr(code, "name", None) == "NOT_FOUND" and "region" in str(error)


class RegionSlot:
    """A region of `size` bytes the worker keeps registered. get() gives the region, or registers a new one when
    the daemon lost the last (the client's lease renewer heard NOT_FOUND, or a call naming it did: lost()); at
    most one try per retry_s, so a daemon that is down costs the engine's step nothing but a clock read.

    Not thread-safe by itself: its user serialises get() and lost() with its transfers (the I/O-only loads and
    stores under their region claim; the split's loads on the engine's thread), since dropping a region unmaps it."""

    def __init__(self, client, size: int, kind: str, device: int, what: str, retry_s: float = 1.0):
        self.client, self.size, self.kind, self.device, self.what = client, size, kind, device, what
        self.retry_s = retry_s
        self.region = None
        self.generation = 0  # registrations so far: a user holding windows of an older one lets them go
        self._next_try = 0.0

    def valid(self) -> bool:
        return self.region is not None and self.client.holds_region(self.region)

    def get(self):
        if self.valid():
            return self.region
        if self.region is not None:
            self._drop()
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self.retry_s
        try:
            region = self.client.register_region(self.size, kind=self.kind, device=self.device)
        except Exception as error:  # anything: the engine runs on without the cache
            once(logging.WARNING, f"region:{self.what}", "caked's connector could not register its %s region "
                 "(%d bytes): %s; loads and stores are off until it can (tried again every %.0f s)", self.what,
                 self.size, error, self.retry_s)
            return None
        self.region = region
        self.generation += 1
        if forget(f"region:{self.what}") or self.generation > 1:
            log.info("caked's connector registered its %s region again (%d bytes; the daemon had restarted, or the "
                     "region's lease ran out while it was unreachable): the cache is back", self.what, self.size)
        return region

    def lost(self) -> None:
        """A call naming the region was answered NOT_FOUND: the next get() registers another. The daemon most likely
        restarted and lost the client's other regions too: they are checked now (holds_region() then says so for
        each), so another slot of the same client registers again at its next use, not after a failed transfer."""
        if self.region is not None:
            self._drop()
            self._next_try = 0.0
            try:
                self.client.check_regions()
            except Exception:  # anything: the other slots find out at their own next call
                pass

    def _drop(self) -> None:
        region, self.region = self.region, None
        once(logging.WARNING, f"region:{self.what}", "caked no longer holds the connector's %s region (it "
             "restarted, or the lease ran out while it was unreachable): registering another", self.what)
        try:
            self.client.release_region(region, timeout_s=1.0)  # unmaps it here; the daemon has forgotten it
        except Exception:
            pass

    def close(self) -> None:
        if self.region is not None:
            region, self.region = self.region, None
            try:
                self.client.release_region(region, timeout_s=1.0)
            except Exception:
                pass
