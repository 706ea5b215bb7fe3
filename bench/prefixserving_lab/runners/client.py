"""The streaming client of every benchmark that measures what a user sees (TTFT, cached tokens).

Each request is sent with ``stream: true`` and ``stream_options.include_usage``, so one request
yields the time to first token (TTFT: from sending it to the first server-sent event that
carries ``choices``), the time of every such event after it (token gaps), and the engine's
usage block with ``prompt_tokens_details.cached_tokens``. An answer other than 200, a
transport error or a stream without content is a failed :class:`RequestResult` with the
error, never an exception: a benchmark counts failures beside its figures.

:func:`replay` sends requests at their arrival offsets (open loop, like real traffic) with at
most ``concurrency`` in flight; give every request arrival 0 and it is a closed loop of
``concurrency`` clients. Cost: one JSON parse per streamed event.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from prefixserving_lab.workloads.prompts import TimedRequest

DATA = "data: "
DONE = "data: [DONE]"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request saw. Times are seconds from sending it; ``sent_s`` is when it was
    sent, from the start of the replay; ``event_times_s``: every event with ``choices``."""

    ok: bool
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    event_times_s: tuple[float, ...] = ()
    sent_s: float = 0.0
    error: str = ""

    @property
    def done_s(self) -> float:
        """When the answer ended, from the start of the replay."""
        return self.sent_s + self.latency_s

    def token_gaps_s(self) -> list[float]:
        """Seconds between consecutive streamed tokens after the first."""
        return [b - a for a, b in itertools.pairwise(self.event_times_s[1:])]


async def send_streaming(
    client: httpx.AsyncClient, base_url: str, request: TimedRequest
) -> RequestResult:
    """POST one request with streaming on; return TTFT, latency, token times and usage."""
    body = {**request.body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    events: list[float] = []
    usage: Mapping[str, Any] = {}
    try:
        async with client.stream("POST", f"{base_url}{request.path}", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return _failed(start, f"HTTP {response.status_code}: {text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith(DATA) or line == DONE:
                    continue
                chunk = json.loads(line[len(DATA) :])
                if chunk.get("choices"):
                    events.append(time.perf_counter() - start)
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError as exc:
        return _failed(start, f"{type(exc).__name__}: {exc}")
    if not events:
        return _failed(start, "the stream ended without a token")
    details = usage.get("prompt_tokens_details") or {}
    return RequestResult(
        ok=True,
        ttft_s=events[0],
        latency_s=time.perf_counter() - start,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        event_times_s=tuple(events),
    )


def _failed(start: float, error: str) -> RequestResult:
    elapsed = time.perf_counter() - start
    return RequestResult(False, elapsed, elapsed, 0, 0, error=error)


async def replay(
    base_url: str,
    requests: Sequence[TimedRequest],
    *,
    concurrency: int = 64,
    timeout_s: float = 300.0,
    on_done: Callable[[RequestResult], None] | None = None,
) -> list[RequestResult]:
    """Send every request at its arrival offset, at most ``concurrency`` at once; results are
    in the order of ``requests``."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        start = time.perf_counter()

        async def one(request: TimedRequest) -> RequestResult:
            delay = request.arrival_s - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            async with gate:
                sent_s = time.perf_counter() - start
                result = replace(await send_streaming(client, base_url, request), sent_s=sent_s)
            if on_done is not None:
                on_done(result)
            return result

        return list(await asyncio.gather(*(one(r) for r in requests)))
