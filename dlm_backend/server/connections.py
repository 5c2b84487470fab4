"""Connection hygiene uvicorn leaves out: read deadlines and a cap on open connections.

uvicorn times out idle keep-alive connections, but a connection that sends part of a request (or
nothing) is held forever: 1,500 half-open connections stayed open against ``dlm serve``, and a POST
whose body never came was held 40 s and more (1,030 of them locked every client out). This h11
protocol closes a connection that has not sent a whole request head within ``HEADER_TIMEOUT_S`` of
opening or of its previous response, or whose body has not all arrived ``BODY_TIMEOUT_S`` after its
head. Past ``MAX_CONNECTIONS`` it closes the oldest connection that is not being served (no request
yet, between requests, or a body still arriving) to make room, so stalled connections cannot lock
clients out; only when every connection is being served is the new one refused.
"""

from __future__ import annotations

import itertools

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
#: The whole body, from the end of its head: a 1 MiB body (the default body limit) at 35 KB/s.
BODY_TIMEOUT_S = 30.0


def _cap(wanted: int = 1024) -> int:
    """``wanted``, or fewer where the open-file limit is lower: past it accept() fails (EMFILE)
    before this cap, and stalled connections could no longer be closed to make room. 64 files are
    left for the model, the log and the engine (a common soft limit is 1024)."""
    try:
        import resource
    except ImportError:                     # not on Windows
        return wanted
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return wanted if soft == resource.RLIM_INFINITY else max(16, min(wanted, soft - 64))


MAX_CONNECTIONS = _cap()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with request-head and body deadlines and a connection cap."""

    header_timeout_s = HEADER_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer, self._awaiting_body, self._opened = None, False, next(_OPENED)
        if len(self.connections) > self.max_connections:
            stalled = [c for c in self.connections if c is not self and _stalled(c)]
            if not stalled:
                transport.close()
                return
            min(stalled, key=lambda c: c._opened).transport.close()
        self._arm(self.header_timeout_s, self._head_timeout)

    def _arm(self, seconds: float, callback) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        timer = getattr(self, "_timer", None)
        if timer is not None:
            timer.cancel()
            self._timer = None
        self._awaiting_body = False

    def _head_timeout(self) -> None:
        self._timer = None
        if self.cycle is None or self.cycle.response_complete:     # no request in progress
            self.transport.close()

    def _body_timeout(self) -> None:
        self._timer = None
        if self.cycle is not None and self.cycle.more_body and not self.cycle.response_complete:
            self.transport.close()              # the route waiting on the body sees a disconnect

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and self.cycle is not None:      # a whole request head arrived
            if self.cycle.more_body:
                self._arm(self.body_timeout_s, self._body_timeout)
                self._awaiting_body = True
            else:
                self._disarm()
        elif self._awaiting_body and self.cycle is not None and not self.cycle.more_body:
            self._disarm()                      # the whole body is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm(self.header_timeout_s, self._head_timeout)    # the next request's head: same deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)


_OPENED = itertools.count()       # the order connections opened in (the clock can tie within a batch)


def _stalled(conn) -> bool:
    """Whether a connection may be closed to make room: it is not being served."""
    cycle = getattr(conn, "cycle", None)
    if not hasattr(conn, "_opened") or conn.transport is None or conn.transport.is_closing():
        return False
    return cycle is None or cycle.response_complete or (cycle.more_body and not cycle.response_started)
