"""Streaming forward of one request to a backend, with one retry before the first byte.

**Algorithm** (one :class:`Exchange`, run as the ASGI response of a routed request; its
``candidates`` are the routing decision's backend followed by its fallbacks):

1. Send the buffered request body to the first candidate over a pooled keep-alive connection
   (``router.upstream``).
2. *Before the first byte*: a connection error, a 5xx status, or an error while reading the
   first body chunk counts as a backend failure (``BackendPool.record_failure``) and the
   request is sent once more, to the next candidate. Without another candidate, a 5xx is
   passed through and a connection error answers ``502``.
3. *After the first byte* the status, headers (minus hop-by-hop ones) and raw body bytes are
   passed through unchanged, chunk by chunk (no decoding, no re-encoding). An upstream error
   from then on ends the client's response early; it is never retried.
4. When the client goes away during the exchange, the exchange is cancelled and the upstream
   response closed, which closes its connection, so the engine aborts the request and frees
   its KV blocks. A response read to the end returns its connection to the pool. The server's
   disconnect hook (``router.server.DISCONNECT_HOOK``) reports the client going away; under a
   server without it, a watcher task waits for ASGI's ``http.disconnect`` message instead.
5. Read timeout (``read_timeout_s``): steps 1-2 must complete within it (a timeout is a
   failure before the first byte, so it is retried); after the first byte an idle timer checks
   every ``read_timeout_s`` that a chunk arrived since its last check and otherwise ends the
   exchange like an upstream error, so an upstream that falls silent is cut after between one
   and two ``read_timeout_s`` (a timer re-armed per chunk would cost a timer per chunk).

The router's in-flight count of a backend is held from the upstream send to the end of the
attempt (``BackendPool.acquire`` / ``release``).

**Cost**: the added latency is the routing work before step 1 plus one pass of the first
chunk through the event loop. Per streamed chunk: one upstream read, one ``send`` of the bytes
as they came (no parsing, no re-encoding, no metric update) and one counter increment.
Measured in ``bench/router_overhead.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from starlette.types import Message, Receive, Scope, Send

from prefixserving.router.backends import BackendPool
from prefixserving.router.errors import error_response
from prefixserving.router.exposition import RouterMetrics
from prefixserving.router.server import DISCONNECT_HOOK
from prefixserving.router.upstream import UpstreamError, UpstreamPool, UpstreamResponse

_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# The body is complete before it goes upstream, so ``expect: 100-continue`` is answered here.
_REQUEST_DROP = _HOP_BY_HOP | {b"host", b"content-length", b"expect"}
_TRANSPORT_ERRORS = (UpstreamError, TimeoutError, OSError)
# The first try and one retry (step 2).
MAX_ATTEMPTS = 2


def upstream_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Client request headers to send upstream (no hop-by-hop, host, length or expect)."""
    return [(k, v) for k, v in headers if k.lower() not in _REQUEST_DROP]


def downstream_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Upstream response headers to pass to the client (no hop-by-hop ones)."""
    return [(k.lower(), v) for k, v in headers if k.lower() not in _HOP_BY_HOP]


def _outcome(status: int) -> str:
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "server_error"


@dataclass(frozen=True, slots=True)
class Proxy:
    """What every exchange of one router shares: the upstream connections, the backend pool
    (in-flight counts, failures), the metrics and ``read_timeout_s`` (step 5 above)."""

    upstream: UpstreamPool
    pool: BackendPool
    metrics: RouterMetrics
    read_timeout_s: float


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """What is sent to a backend: method, path with its query string, headers, whole body."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @classmethod
    def of(cls, scope: Scope, body: bytes) -> UpstreamRequest:
        """The client's request in ``scope`` with ``body``, headers cut to what goes upstream."""
        path = scope["raw_path"] or scope["path"].encode()
        if scope["query_string"]:
            path += b"?" + scope["query_string"]
        return cls(
            scope["method"], path.decode("latin-1"), upstream_headers(scope["headers"]), body
        )


@dataclass
class _Attempt:
    backend: str
    response: UpstreamResponse | None = None
    first: bytes | None = None
    failure: str | None = None


@dataclass
class Exchange:
    """One routed request: the ASGI app that forwards ``request`` to ``candidates`` in turn
    (at most ``MAX_ATTEMPTS``, see the module docstring).

    ``received_at``: ``time.perf_counter()`` when the router had the request body.
    ``backend``: the candidate of the current (at the end: the last) attempt.
    """

    proxy: Proxy
    request: UpstreamRequest
    candidates: tuple[str, ...]
    received_at: float
    backend: str = field(default="", init=False)
    _disconnected: bool = field(default=False, init=False)
    _idle: bool = field(default=False, init=False)
    _late: bool = field(default=False, init=False)
    _chunks: int = field(default=0, init=False)
    _idle_timer: asyncio.TimerHandle | None = field(default=None, init=False)
    _completed: bool = field(default=False, init=False)
    _outcome: str = field(default="upstream_error", init=False)
    _scope: Scope = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("an exchange needs at least one candidate backend")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._scope = scope
        task = asyncio.current_task()
        assert task is not None
        register = scope.get(DISCONNECT_HOOK)
        watcher = None
        if register is not None:
            register(lambda: self._client_gone(task))
        else:
            watcher = asyncio.get_running_loop().create_task(self._watch(receive, task))
        try:
            await self._run(send)
        except asyncio.CancelledError:
            if not (self._disconnected or self._idle):
                raise
            task.uncancel()  # our own cancellation: the client went away or upstream fell silent
        finally:
            if register is not None:
                register(None)  # drop the reference to this exchange
            if watcher is not None:
                watcher.cancel()
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            outcome = (
                "disconnected" if self._disconnected and not self._completed else self._outcome
            )
            self.proxy.metrics.requests.inc(self.backend, outcome)

    def _client_gone(self, task: asyncio.Task[None]) -> None:
        """Cancel the exchange when the client disconnects before the answer is complete."""
        if not self._completed:
            self._disconnected = True
            task.cancel()

    async def _watch(self, receive: Receive, task: asyncio.Task[None]) -> None:
        """Wait for ASGI's ``http.disconnect`` (servers without the disconnect hook)."""
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                self._client_gone(task)
                return

    def _check_idle(self, task: asyncio.Task[None], seen: int) -> None:
        """Idle timer: cancel the exchange when no chunk arrived since the last check."""
        if self._completed or self._disconnected:
            return
        if self._chunks == seen:
            self._idle = True
            task.cancel()
            return
        self._arm_idle_timer(task)

    def _arm_idle_timer(self, task: asyncio.Task[None]) -> None:
        loop = asyncio.get_running_loop()
        self._idle_timer = loop.call_later(
            self.proxy.read_timeout_s, self._check_idle, task, self._chunks
        )

    async def _open(self, attempt: _Attempt) -> None:
        """Send the request and read the first chunk within ``read_timeout_s``; a failure is
        noted in ``attempt``. The deadline is one timer that cancels this task (cheaper than
        ``asyncio.timeout``, which the router paid on every request)."""
        task = asyncio.current_task()
        assert task is not None
        self._late = False
        timer = asyncio.get_running_loop().call_later(
            self.proxy.read_timeout_s, self._too_late, task
        )
        try:
            await self._send_and_read_first(attempt)
        except asyncio.CancelledError:
            if not self._late or self._disconnected:
                raise
            task.uncancel()
            attempt.failure = "read_error"
        finally:
            timer.cancel()

    def _too_late(self, task: asyncio.Task[None]) -> None:
        """First-byte deadline: cancel the attempt (see :meth:`_open`)."""
        self._late = True
        task.cancel()

    async def _send_and_read_first(self, attempt: _Attempt) -> None:
        try:
            request = self.request
            attempt.response = await self.proxy.upstream.request(
                attempt.backend, request.method, request.path, request.headers, request.body
            )
        except _TRANSPORT_ERRORS:
            attempt.failure = "connect_error"
            return
        if attempt.response.status >= 500:
            attempt.failure = "server_error"
            return
        try:
            attempt.first = await attempt.response.read()
        except _TRANSPORT_ERRORS:
            attempt.failure = "read_error"

    def _close(self, attempt: _Attempt) -> None:
        """Close the upstream response: its connection goes back to the pool only when the
        answer was read to the end, otherwise it is closed (the engine sees the disconnect)."""
        if attempt.response is not None:
            attempt.response.release()
        self.proxy.pool.release(attempt.backend)

    async def _run(self, send: Send) -> None:
        tries = self.candidates[:MAX_ATTEMPTS]
        for number, backend in enumerate(tries, start=1):
            self.backend = backend
            attempt = _Attempt(backend)
            self.proxy.pool.acquire(backend)
            sent_at = time.perf_counter()
            try:
                await self._open(attempt)
                if attempt.failure is None:
                    await self._stream(attempt, send, sent_at - self.received_at)
                    return
                self.proxy.pool.record_failure(backend)
                if number == len(tries):
                    await self._give_up(attempt, send, sent_at - self.received_at)
                    return
            finally:
                self._close(attempt)
            self.proxy.metrics.retries.inc(attempt.failure)

    async def _give_up(self, attempt: _Attempt, send: Send, before_s: float) -> None:
        """No candidate left: pass a 5xx through, or answer 502 for a connection error."""
        if attempt.response is not None and attempt.failure == "server_error":
            await self._stream(attempt, send, before_s)
            return
        response = error_response(
            502, f"backend {attempt.backend} failed before answering ({attempt.failure})"
        )
        await response(self._scope, _no_receive, send)

    async def _stream(self, attempt: _Attempt, send: Send, before_s: float) -> None:
        response = attempt.response
        assert response is not None
        received_at = time.perf_counter()
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": downstream_headers(response.raw_headers),
            }
        )
        # A whole answer already read (most non-streamed ones) goes out in one write.
        whole = response.at_eof()
        first = attempt.first or b""
        await send({"type": "http.response.body", "body": first, "more_body": not whole})
        self.proxy.metrics.added_latency.observe(before_s + time.perf_counter() - received_at)
        if not whole:
            task = asyncio.current_task()
            assert task is not None
            self._arm_idle_timer(task)
            try:
                while chunk := await response.read():
                    self._chunks += 1
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except _TRANSPORT_ERRORS:
                return  # after the first byte: end the client's response early
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        self._completed = True
        self._outcome = _outcome(response.status)
        if response.status < 500:
            self.proxy.pool.record_success(attempt.backend)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
