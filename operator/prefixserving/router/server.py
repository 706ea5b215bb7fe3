"""Running the router app under uvicorn, with a header timeout.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a
request's headers once a client has sent a first byte, so a slow client can hold connections
open. :class:`HeaderTimeoutProtocol` closes a connection whose request headers are not
complete within ``header_timeout_s`` of the connection opening or of the first bytes of the
next request on a kept-alive connection (idle kept-alive connections are uvicorn's
``timeout_keep_alive``). uvicorn's ``httptools`` protocol is the base (``uvicorn[standard]``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for receiving each request's headers."""

    header_timeout_s: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with_header_timeout(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """A :class:`HeaderTimeoutProtocol` subclass with the given deadline."""
    return type(
        "HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": header_timeout_s}
    )


def uvicorn_config(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    header_timeout_s: float = 10.0,
    idle_timeout_s: int = 30,
    log_config: dict[str, Any] | None = None,
) -> uvicorn.Config:
    """uvicorn settings for the router: uvloop, the header timeout, ``idle_timeout_s`` for
    idle keep-alive connections, no access log, and no ``server``/``date`` headers of its own
    (the engine's pass through)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_with_header_timeout(header_timeout_s),
        loop="auto",
        timeout_keep_alive=idle_timeout_s,
        access_log=False,
        server_header=False,
        date_header=False,
        log_config=log_config,
        lifespan="on",
    )
