"""Running the router app under uvicorn, with a header timeout.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for a
request's headers once a client has sent a first byte, so a slow client can hold connections
open. :class:`HeaderTimeoutProtocol` closes a connection whose request headers are not
complete within ``header_timeout_s`` of the connection opening or of the first bytes of the
next request on a kept-alive connection (idle kept-alive connections are uvicorn's
``timeout_keep_alive``). uvicorn's ``httptools`` protocol is the base (``uvicorn[standard]``).

The protocol also offers the app a disconnect hook: ``scope[DISCONNECT_HOOK](callback)``
registers ``callback``, which the server calls once when the client's connection is lost
before the response is complete (at once if it already was); ``scope[DISCONNECT_HOOK](None)``
clears it. The router uses it instead of a task per request that waits for ASGI's
``http.disconnect`` message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DISCONNECT_HOOK = "prefixserving.disconnect_hook"


class RouterServerConfig(uvicorn.Config):
    """uvicorn's settings plus ``header_timeout_s`` for :class:`HeaderTimeoutProtocol`: a
    plain attribute, so the config pickles into ``--workers`` processes."""

    def __init__(self, app: ASGIApp | str, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s = header_timeout_s


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus a deadline for receiving each request's headers and
    the disconnect hook (see the module docstring). The deadline is the config's
    ``header_timeout_s`` (:class:`RouterServerConfig`), 10 s under a plain ``uvicorn.Config``."""

    header_timeout_s: float = 10.0

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.header_timeout_s = getattr(config, "header_timeout_s", self.header_timeout_s)
        self._header_timer: asyncio.TimerHandle | None = None
        self._on_disconnect: Callable[[], None] | None = None
        self._lost = False
        self._in_headers = False

    def _register_disconnect(self, callback: Callable[[], None] | None) -> None:
        """Call ``callback`` when the connection is lost before the current response is
        complete, at once if it already was; None clears it (the app's response is done)."""
        if self._lost and callback is not None:
            callback()
        else:
            self._on_disconnect = callback

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
        super().data_received(data)
        # Headers still incomplete after these bytes: the first bytes of the next request on
        # a kept-alive connection start its deadline. Headers that arrive whole (the usual
        # case) arm no timer at all.
        if (
            self._in_headers
            and self._header_timer is None
            and not self._lost
            and (self.cycle is None or self.cycle.response_complete)
        ):
            self._arm()

    def on_message_begin(self) -> None:
        self._in_headers = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._disarm()
        self.scope[DISCONNECT_HOOK] = self._register_disconnect  # type: ignore[literal-required]
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._lost = True
        in_progress = self.cycle is not None and not self.cycle.response_complete
        callback, self._on_disconnect = self._on_disconnect, None
        super().connection_lost(exc)
        if callback is not None and in_progress:
            callback()


def uvicorn_config(
    app: ASGIApp | str,
    *,
    host: str,
    port: int,
    header_timeout_s: float = 10.0,
    idle_timeout_s: int = 30,
    log_config: dict[str, Any] | None = None,
    workers: int = 1,
) -> RouterServerConfig:
    """uvicorn settings for the router: uvloop, the header timeout, ``idle_timeout_s`` for
    idle keep-alive connections, no access log, no ``X-Forwarded-*`` rewriting (the router
    never reads the client address), and no ``server``/``date`` headers of its own (the
    engine's pass through).

    ``app`` is the ASGI app, or for ``workers`` > 1 the ``module:function`` import string of
    a factory that builds it in each worker process (uvicorn binds the port once and the
    workers accept from the shared socket; uvicorn restarts a worker that dies).
    """
    return RouterServerConfig(
        app,
        header_timeout_s=header_timeout_s,
        host=host,
        port=port,
        http=HeaderTimeoutProtocol,
        loop="auto",
        timeout_keep_alive=idle_timeout_s,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        log_config=log_config,
        lifespan="on",
        workers=workers,
        factory=isinstance(app, str),
    )
