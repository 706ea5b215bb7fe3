"""A fake OpenAI-compatible engine for router tests and the proxy-overhead benchmark.

It answers ``/v1/completions`` and ``/v1/chat/completions`` (JSON, or server-sent events when
``"stream": true``), ``/v1/models``, ``/health`` and ``/metrics`` with vLLM's metric names,
records what it received, and can be told to fail: answer 500, break the connection after
the headers, or report itself unhealthy. No model runs; answers take ``first_delay_s`` plus
``chunk_delay_s`` per streamed chunk.

:func:`serving` runs any ASGI app (this one or the router) under uvicorn on a free loopback
port inside the current event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send


@dataclass
class FakeEngine:
    """Behaviour and records of one fake engine (mutable from tests).

    ``fail_next``: the next N completion requests answer 500. ``break_next``: the next N send
    their headers and then drop the connection. ``break_stream_next``: the next N streams
    drop the connection after their first event. ``received``: bodies received, in order.
    ``aborted``: requests the client went away from before the end.
    """

    name: str
    model: str = "fake-model"
    chunks: int = 3
    first_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    running: float = 0.0
    healthy: bool = True
    fail_next: int = 0
    break_next: int = 0
    break_stream_next: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    received_headers: list[dict[str, str]] = field(default_factory=list)
    aborted: int = 0
    completed_streams: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self._completion, methods=["POST"]),
                Route("/v1/chat/completions", self._completion, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
            ]
        )

    def answer(self, index: int) -> dict[str, Any]:
        """The non-streamed answer to the ``index``-th request."""
        return {
            "id": f"cmpl-{self.name}-{index}",
            "object": "text_completion",
            "model": self.model,
            "backend": self.name,
            "choices": [{"index": 0, "text": "ok " * self.chunks, "finish_reason": "length"}],
        }

    def chunk(self, index: int, position: int) -> bytes:
        """One streamed event."""
        event = {"id": f"cmpl-{self.name}-{index}", "backend": self.name, "position": position}
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    async def _completion(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.received.append(body)
        self.received_headers.append(dict(request.headers))
        index = len(self.received)
        if self.fail_next > 0:
            self.fail_next -= 1
            return JSONResponse({"error": {"message": "fake failure", "code": 500}}, 500)
        if self.break_next > 0:
            self.break_next -= 1
            return _BrokenResponse()
        if self.first_delay_s:
            await asyncio.sleep(self.first_delay_s)
        if not body.get("stream"):
            if await request.is_disconnected():
                self.aborted += 1
            return JSONResponse(self.answer(index))
        broken = self.break_stream_next > 0
        self.break_stream_next -= broken
        return StreamingResponse(self._events(index, broken), media_type="text/event-stream")

    async def _events(self, index: int, broken: bool) -> AsyncIterator[bytes]:
        finished = False
        try:
            for position in range(self.chunks):
                if position and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                if position and broken:
                    raise ConnectionAbortedError("fake engine dropped the stream")
                yield self.chunk(index, position)
            yield b"data: [DONE]\n\n"
            finished = True
            self.completed_streams += 1
        finally:
            if not finished:
                self.aborted += 1

    async def _models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def _health(self, _request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _metrics(self, _request: Request) -> Response:
        labels = f'{{engine="0",model_name="{self.model}"}}'
        text = (
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{labels} {self.waiting}\n"
            "# HELP vllm:num_requests_waiting_by_reason Waiting requests by reason.\n"
            "# TYPE vllm:num_requests_waiting_by_reason gauge\n"
            f'vllm:num_requests_waiting_by_reason{{engine="0",reason="capacity"}} 99.0\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} {self.kv_usage}\n"
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {self.running}\n"
        )
        return PlainTextResponse(text)


class _BrokenResponse(Response):
    """Sends a 200 status line, then fails so the server drops the connection."""

    def __init__(self) -> None:
        super().__init__(status_code=200)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ConnectionAbortedError("fake engine dropped the connection")


@contextlib.asynccontextmanager
async def serving(config: uvicorn.Config) -> AsyncIterator[str]:
    """Run ``config`` in this event loop; yield ``http://HOST:PORT`` (port 0: a free one)."""
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{config.host}:{port}"
    finally:
        server.should_exit = True
        await task


def fake_engine_config(
    engine: FakeEngine, host: str = "127.0.0.1", port: int = 0
) -> uvicorn.Config:
    """uvicorn settings for a fake engine on loopback, quiet."""
    return uvicorn.Config(
        engine.app(), host=host, port=port, log_config=None, log_level="warning", access_log=False
    )
