"""uvicorn's HTTP/1.1 protocol with a deadline for request headers (a slowloris defence).

uvicorn closes idle keep-alive connections, but a client that sends its headers a byte at a time
holds a connection (and a file descriptor) for as long as it likes: 220 such connections stayed
open for over a minute, descriptors 9 -> 229. Here every request's headers must be complete
within HEADER_TIMEOUT seconds of the connection opening (or of the previous response ending),
else the connection is closed. Slow bodies are bounded by `http.read_json` (BODY_TIMEOUT), and
the number of connections by uvicorn's `limit_concurrency` (MAX_CONNECTIONS: beyond it requests
get 503).
"""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.h11_impl import H11Protocol

# seconds for a request line and headers to arrive (MLXCEL_HEADER_TIMEOUT: tests shorten it)
HEADER_TIMEOUT = float(os.environ.get("MLXCEL_HEADER_TIMEOUT", "10"))
MAX_CONNECTIONS = 1000  # open connections and requests in flight before new requests get 503


class HeaderDeadlineProtocol(H11Protocol):
    _deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(HEADER_TIMEOUT, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        waiting = self.cycle is None or self.cycle.response_complete  # no request read yet
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def handle_events(self) -> None:
        before = self.cycle
        super().handle_events()
        if self.cycle is not None and self.cycle is not before:  # a request's headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this connection gets its own deadline

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)
