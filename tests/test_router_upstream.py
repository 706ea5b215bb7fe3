"""The router's upstream client against scripted raw HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from prefixserving.router.upstream import HIGH_WATER_BYTES, UpstreamError, UpstreamPool
from prefixserving_lab.testing import wait_for_async

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"

# A connection handler gets the connection's number (0 for the first) and its streams.
Handler = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawServer:
    url: str
    connections: int = 0
    closed_by_client: int = 0
    requests: list[bytes] = field(default_factory=list)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request (head and Content-Length body); b"" when the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[RawServer]:
    state = RawServer(url="")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        number = state.connections
        state.connections += 1
        with contextlib.suppress(ConnectionError):
            await handler(number, reader, writer)
            if not writer.is_closing() and await reader.read() == b"":
                state.closed_by_client += 1
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield state


def answer_every_request(state_requests: list[bytes], reply: bytes = OK) -> Handler:
    async def handler(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while request := await read_request(reader):
            state_requests.append(request)
            writer.write(reply)
            await writer.drain()

    return handler


async def read_all(pool: UpstreamPool, url: str, method: str = "POST") -> tuple[int, bytes]:
    response = await pool.request(url, method, "/v1/completions", [(b"x-id", b"1")], b"{}")
    body = b""
    while chunk := await response.read():
        body += chunk
    response.release()
    return response.status, body


async def test_request_bytes_and_keep_alive_reuse() -> None:
    requests: list[bytes] = []
    async with raw_server(answer_every_request(requests)) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        assert await read_all(pool, server.url) == (200, b"ok")
        assert await read_all(pool, server.url) == (200, b"ok")
        pool.close()
    assert server.connections == 1
    port = server.url.rsplit(":", 1)[1]
    assert requests[0] == (
        b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:" + port.encode() + b"\r\n"
        b"x-id: 1\r\ncontent-length: 2\r\n\r\n{}"
    )


async def test_a_connection_closed_while_idle_is_replaced_without_an_error() -> None:
    async def handler(n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if n == 0:  # the second request on the first connection is dropped unanswered
            await read_request(reader)
            writer.transport.abort()
            return
        while await read_request(reader):
            writer.write(OK)

    async with raw_server(handler) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        assert await read_all(pool, server.url) == (200, b"ok")
        assert await read_all(pool, server.url) == (200, b"ok")
        pool.close()
    assert server.connections == 2


async def test_a_new_connection_closed_before_answering_is_an_error() -> None:
    async def handler(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.transport.abort()

    async with raw_server(handler) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        with pytest.raises(UpstreamError, match="closed the connection"):
            await read_all(pool, server.url)
    assert server.connections == 1


async def test_a_connection_error_after_the_first_byte_is_raised() -> None:
    async def handler(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        writer.transport.abort()

    async with raw_server(handler) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        response = await pool.request(server.url, "POST", "/", [], b"{}")
        assert response.status == 200
        assert await response.read() == b"abc"
        with pytest.raises(UpstreamError):
            await response.read()


async def test_nothing_listening_raises_oserror() -> None:
    async with raw_server(answer_every_request([])) as server:
        url = server.url
    with pytest.raises(OSError):
        await UpstreamPool(connect_timeout_s=1).request(url, "GET", "/", [], b"")


async def test_head_answers_end_at_the_headers() -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"
    async with raw_server(answer_every_request([], reply)) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        response = await pool.request(server.url, "HEAD", "/v1/models", [], b"")
        assert (response.status, await response.read(), response.at_eof()) == (200, b"", True)
        assert (b"content-length", b"5") in response.raw_headers
        response.release()


@pytest.mark.parametrize("apart_s", [0.0, 0.1], ids=["one-write", "two-writes"])
async def test_interim_1xx_answers_are_skipped(apart_s: float) -> None:
    async def handler(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        interim = b"HTTP/1.1 100 Continue\r\n\r\n"
        final = b"HTTP/1.1 201 Created\r\nx-a: b\r\ncontent-length: 2\r\n\r\nok"
        if not apart_s:  # both answers in one read
            writer.write(interim + final)
            return
        writer.write(interim)
        await writer.drain()
        # A server that pauses between the answers (the condition under test): the interim
        # answer is usually parsed on its own; the one-write case covers the other order.
        await asyncio.sleep(apart_s)
        writer.write(final)
        await writer.drain()

    async with raw_server(handler) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        response = await pool.request(server.url, "POST", "/", [], b"{}")
        assert response.status == 201
        assert response.raw_headers == [(b"x-a", b"b"), (b"content-length", b"2")]
        assert await response.read() == b"ok"


async def test_a_malformed_answer_is_an_error() -> None:
    async with raw_server(answer_every_request([], b"NOT HTTP\r\n\r\n")) as server:
        with pytest.raises(UpstreamError, match="malformed"):
            await read_all(UpstreamPool(connect_timeout_s=1), server.url)


async def test_reading_pauses_while_the_client_is_slow() -> None:
    size = 16 * HIGH_WATER_BYTES
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"x" * size
    async with raw_server(answer_every_request([], reply)) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        response = await pool.request(server.url, "POST", "/", [], b"{}")
        # Nobody reads the body: the client stops reading once it holds the high-water mark.
        transport = response._connection.transport
        assert transport is not None
        await wait_for_async(lambda: not transport.is_reading(), what="reading paused")
        first = await response.read()
        assert HIGH_WATER_BYTES < len(first) < size
        assert transport.is_reading(), "reading resumes once the client took the bytes"
        rest = b""
        while chunk := await response.read():
            rest += chunk
        assert len(first) + len(rest) == size and response.at_eof()


async def test_cancelled_request_closes_its_connection() -> None:
    started = asyncio.Event()

    async def handler(_n: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        started.set()  # never answers

    async with raw_server(handler) as server:
        pool = UpstreamPool(connect_timeout_s=1)
        task = asyncio.create_task(pool.request(server.url, "POST", "/", [], b"{}"))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for_async(lambda: server.closed_by_client, what="the server to see the close")
    assert server.closed_by_client == 1


async def test_unread_answers_close_and_idle_connections_are_capped() -> None:
    requests: list[bytes] = []
    async with raw_server(answer_every_request(requests)) as server:
        pool = UpstreamPool(connect_timeout_s=1, max_idle_per_backend=1)
        answers = await asyncio.gather(*(read_all(pool, server.url) for _ in range(3)))
        assert answers == [(200, b"ok")] * 3
        unread = await pool.request(server.url, "POST", "/", [], b"{}")
        unread.release()  # body not read: the connection is closed, not reused
        assert await read_all(pool, server.url) == (200, b"ok")
        pool.close()
        await wait_for_async(
            lambda: server.closed_by_client == server.connections,
            what="the server to see every connection closed",
        )
    assert server.connections == 4  # 3 at once, 1 kept idle, then 1 new after the unread one
    assert server.closed_by_client == 4
