"""An OpenAI-compatible load client that measures what a user sees.

Each request is sent with ``stream: true`` and ``stream_options.include_usage``, so one
request yields both the time to first token (TTFT: send to first content chunk) and the
engine's usage block with ``prompt_tokens_details.cached_tokens``. Requests start at their
arrival offsets (open loop, like real traffic) and at most ``concurrency`` are in flight.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class TimedRequest:
    """A request body to POST to ``path`` at ``arrival_s`` after the replay starts."""

    arrival_s: float
    path: str
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RequestResult:
    ok: bool
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    error: str = ""


async def send_streaming(
    client: httpx.AsyncClient, base_url: str, request: TimedRequest
) -> RequestResult:
    """POST one request with streaming on; return TTFT, latency and token usage."""
    body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft = 0.0
    usage: Mapping[str, Any] = {}
    try:
        async with client.stream("POST", f"{base_url}{request.path}", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return _failed(start, f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                if not ttft and chunk.get("choices"):
                    ttft = time.perf_counter() - start
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError as exc:
        return _failed(start, f"{type(exc).__name__}: {exc}")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(
        ok=True,
        ttft_s=ttft or time.perf_counter() - start,
        latency_s=time.perf_counter() - start,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


def _failed(start: float, error: str) -> RequestResult:
    elapsed = time.perf_counter() - start
    return RequestResult(False, elapsed, elapsed, 0, 0, error)


async def replay(
    base_url: str,
    requests: Sequence[TimedRequest],
    *,
    concurrency: int = 64,
    timeout_s: float = 300.0,
    on_done: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Send every request at its arrival offset; results are in the order of ``requests``."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()

        async def one(request: TimedRequest) -> RequestResult:
            delay = request.arrival_s - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                result = await send_streaming(client, base_url, request)
            if on_done is not None:
                on_done(result)
            return result

        return list(await asyncio.gather(*(one(r) for r in requests)))
