"""Connection hygiene uvicorn leaves out: a header-read timeout and a cap on open connections.

uvicorn times out idle keep-alive connections, but a connection that sends part of a request (or
nothing) is held forever: 1,500 half-open connections stayed open against ``dlm serve``. This h11
protocol closes a connection that has not sent a whole request head within ``HEADER_TIMEOUT_S`` of
opening or of its previous response, and refuses connections beyond ``MAX_CONNECTIONS``.
"""

from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request-head deadline and a connection cap."""

    header_timeout_s = HEADER_TIMEOUT_S
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self.cycle is None or self.cycle.response_complete:     # no request in progress
            self.transport.close()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:            # a whole request head arrived
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()                            # the next request's head gets the same deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)
