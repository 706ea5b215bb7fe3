"""The router's client to the engines: pooled keep-alive HTTP/1.1 connections.

A request goes out as one write (request line, headers and body in one buffer) on an idle
connection to the backend, or a new one; the answer is parsed by httptools' response parser
(the parser uvicorn uses). :meth:`UpstreamPool.request` returns once the status line and
headers are in; the body is then read as the parser hands it over (:meth:`UpstreamResponse.read`
returns everything that arrived since the last call, chunked framing removed, nothing else
decoded).

Why not an HTTP client library: on the router's request path aiohttp's ``ClientSession`` took
about a third of the router's CPU per streamed request (request and response objects, header
multidicts, its connector and stream reader per request) and added about 0.45 ms per request
on an idle machine (``bench/router_overhead.py``). The router needs none of it: the headers are
passed through as bytes, the body is never decoded.

**Pool**: per backend an ordered set of idle connections, taken last-used first so that few
stay warm; at most ``max_idle_per_backend`` are kept. A connection the engine closes while idle
leaves the set at once. An answer read to the end on a keep-alive connection returns the
connection to the pool (:meth:`UpstreamResponse.release`); any other ends it
(:meth:`UpstreamResponse.close`), which the engine sees as a client disconnect.

**Stale connections**: a reused connection that closes before a single byte of the answer
(the engine closed it as idle just as the request went out) is not the engine's failure: the
request is sent once more on a new connection.

**Flow control**: reading from the engine pauses while more than ``HIGH_WATER_BYTES`` of body
wait for the client, and resumes when the client took them.

**Cost**: per request one write and one parse of the head; per body chunk one parser callback
and at most one wake-up of the task that reads it.
"""

from __future__ import annotations

import asyncio
from typing import cast
from urllib.parse import urlsplit

import httptools

HIGH_WATER_BYTES = 256 * 1024


def backend_address(backend: str) -> tuple[str, int, bytes]:
    """Host, port and ``Host`` header value of an engine's base URL (``http://HOST:PORT``);
    ``ValueError`` naming the URL and the expected form for anything else."""
    parts = urlsplit(backend)
    if parts.scheme != "http" or not parts.hostname or parts.path.strip("/"):
        raise ValueError(
            f"backend {backend!r}: give an engine's base URL as http://HOST:PORT "
            "(the router speaks plain HTTP to the engines, without a path)"
        )
    return parts.hostname, parts.port or 80, parts.netloc.encode("latin-1")


class UpstreamError(Exception):
    """The engine closed the connection or sent a malformed answer."""


class UpstreamResponse:
    """One answer from an engine: ``status`` and ``raw_headers`` (bytes, as sent), then the
    body through :meth:`read`."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.complete = False  # the whole answer arrived
        self._keep_alive = False
        self._body: list[bytes] = []
        self._buffered = 0
        self._error: UpstreamError | None = None
        self._head: asyncio.Future[None] = connection.loop.create_future()
        self._waiter: asyncio.Future[None] | None = None

    async def wait_for_head(self) -> None:
        """Wait for the status line and headers; :class:`UpstreamError` when the connection
        failed first."""
        await self._head

    async def read(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; ``b""`` at the
        end. Raises :class:`UpstreamError` when the connection failed before the end."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            self._waiter = self._connection.loop.create_future()
            await self._waiter
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        if self._buffered > HIGH_WATER_BYTES:
            self._connection.resume()
        self._buffered = 0
        return data

    def at_eof(self) -> bool:
        """Whether the whole body arrived and was read."""
        return self.complete and not self._body

    def release(self) -> None:
        """Done with the answer: the connection goes back to the pool when the answer was read
        to the end and the engine keeps it alive, otherwise it is closed."""
        if self.at_eof() and self._keep_alive:
            self._connection.idle()
        else:
            self.close()

    def close(self) -> None:
        """Close the connection (the engine sees the client go away)."""
        self._connection.close()

    # Called by the connection --------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _headers_done(self, status: int) -> None:
        self.status = status
        if not self._head.done():
            self._head.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered > HIGH_WATER_BYTES:
            self._connection.pause()
        self._wake()

    def _finish(self, keep_alive: bool) -> None:
        self.complete = True
        self._keep_alive = keep_alive
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self.complete:
            return
        self._error = error
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()


class _Connection(asyncio.Protocol):
    """One connection to an engine and the answer it is reading (httptools callbacks)."""

    def __init__(self, pool: UpstreamPool, backend: str) -> None:
        self.pool = pool
        self.backend = backend
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.head_only = False  # answering a HEAD request: no body follows the headers
        self.response_started = False  # a byte of the current answer arrived
        self.lost = False
        self._informational = False

    def send(self, data: bytes, *, head_only: bool) -> UpstreamResponse:
        assert self.transport is not None
        self.response = UpstreamResponse(self)
        self.response_started = False
        self.head_only = head_only
        self.transport.write(data)
        return self.response

    def idle(self) -> None:
        self.response = None
        self.pool.put_idle(self)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.lost:
            self.transport.resume_reading()

    # asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self.response is None:  # bytes while idle: the connection is out of step
            self.close()
            return
        self.response_started = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.response._fail(UpstreamError(f"malformed answer from {self.backend}: {error}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        if self.response is not None:
            self.response._fail(UpstreamError(f"{self.backend} closed the connection"))

    # httptools callbacks -------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.response is not None
        self.response.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.response is not None
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # 1xx: an interim answer, the real one follows
            self._informational = True
            self.response.raw_headers.clear()
            return
        self.response._headers_done(status)
        if self.head_only:  # no body follows; llhttp would wait for Content-Length bytes
            self.response._finish(keep_alive=False)

    def on_body(self, body: bytes) -> None:
        assert self.response is not None
        self.response._feed(body)

    def on_message_complete(self) -> None:
        assert self.response is not None
        if self._informational:
            self._informational = False
            return
        self.response._finish(self.parser.should_keep_alive())


class UpstreamPool:
    """Keep-alive connections to the engines (see the module docstring).

    ``connect_timeout_s``: longest wait for a new connection. ``max_idle_per_backend``: idle
    connections kept per backend; more are closed when their answer is done.
    """

    def __init__(self, *, connect_timeout_s: float, max_idle_per_backend: int = 256) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_per_backend = max_idle_per_backend
        self._idle: dict[str, dict[_Connection, None]] = {}
        self._addresses: dict[str, tuple[str, int, bytes]] = {}

    def _address(self, backend: str) -> tuple[str, int, bytes]:
        address = self._addresses.get(backend)
        if address is None:
            address = self._addresses[backend] = backend_address(backend)
        return address

    async def _connect(self, backend: str) -> _Connection:
        host, port, _ = self._address(backend)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                lambda: _Connection(self, backend), host, port
            )
        return connection

    def _take_idle(self, backend: str) -> _Connection | None:
        idle = self._idle.get(backend)
        while idle:
            connection, _ = idle.popitem()
            if not connection.lost:
                return connection
        return None

    def put_idle(self, connection: _Connection) -> None:
        idle = self._idle.setdefault(connection.backend, {})
        if connection.lost or len(idle) >= self.max_idle_per_backend:
            connection.close()
        else:
            idle[connection] = None

    def forget(self, connection: _Connection) -> None:
        idle = self._idle.get(connection.backend)
        if idle is not None:
            idle.pop(connection, None)

    async def request(
        self,
        backend: str,
        method: str,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> UpstreamResponse:
        """Send a request to ``backend`` (a base URL) and wait for the answer's status and
        headers. Raises ``OSError`` or ``TimeoutError`` when no connection could be made and
        :class:`UpstreamError` when the connection failed before the headers."""
        _, _, host = self._address(backend)
        lines = [f"{method} {path} HTTP/1.1\r\n".encode("latin-1"), b"host: ", host, b"\r\n"]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        if body or method not in ("GET", "HEAD"):
            lines += (b"content-length: ", str(len(body)).encode(), b"\r\n")
        lines += (b"\r\n", body)
        data = b"".join(lines)
        head_only = method == "HEAD"
        connection = self._take_idle(backend)
        if connection is not None:
            try:
                return await self._send(connection, data, head_only)
            except UpstreamError:
                if connection.response_started:
                    raise
                # closed by the engine while idle: once more on a new connection
        return await self._send(await self._connect(backend), data, head_only)

    @staticmethod
    async def _send(connection: _Connection, data: bytes, head_only: bool) -> UpstreamResponse:
        """Send ``data`` and wait for the answer's head; on any error or cancellation the
        connection is closed (the engine must not go on computing an answer nobody reads)."""
        response = connection.send(data, head_only=head_only)
        try:
            await response.wait_for_head()
        except BaseException:
            connection.close()
            raise
        return response

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for connection in list(idle):
                connection.close()
            idle.clear()
