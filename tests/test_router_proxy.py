"""The proxy path: pass-through bytes, streaming, disconnects, retry before the first byte."""

from __future__ import annotations

import time

import httpx
import pytest
import uvicorn

from prefixserving.router.app import Router, RouterConfig, build_app
from prefixserving.router.backends import BackendPool
from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving_lab.runners.fake_engine import serving
from prefixserving_lab.testing import wait_for_async
from router_support import (
    FAST_POOL,
    FirstPolicy,
    completion,
    fake_engines,
    metric_value,
    running_router,
)


async def test_non_streamed_answer_passes_through_unchanged() -> None:
    async with fake_engines(1) as [(engine, url)], running_router([url]) as r:
        response = await r.client.post(
            "/v1/completions",
            json=completion("hello", user="u1"),
            headers={"Authorization": "Bearer k", "X-Request-Id": "r1"},
        )
        assert response.status_code == 200
        assert response.json() == engine.answer(1)
        assert response.headers["content-type"] == "application/json"
        assert engine.received == [completion("hello", user="u1")]
        sent = engine.received_headers[0]
        assert sent["authorization"] == "Bearer k" and sent["x-request-id"] == "r1"
        assert sent["host"] != r.url.removeprefix("http://")  # host is the engine's, not ours


async def test_stream_passes_every_byte_in_order() -> None:
    async with fake_engines(1, chunks=20) as [(engine, url)], running_router([url]) as r:
        async with r.client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "fake-model",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
        ) as response:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        assert response.headers["content-type"].startswith("text/event-stream")
        expected = b"".join(engine.chunk(1, p) for p in range(20)) + b"data: [DONE]\n\n"
        assert raw == expected
        assert engine.completed_streams == 1


async def test_client_disconnect_mid_stream_closes_the_upstream_request() -> None:
    async with (
        fake_engines(1, chunks=100, chunk_delay_s=0.05) as [(engine, url)],
        running_router([url]) as r,
    ):
        async with r.client.stream(
            "POST", "/v1/completions", json=completion("x", stream=True)
        ) as response:
            async for _ in response.aiter_raw():
                break  # read one chunk, then hang up
        await wait_for_async(lambda: engine.aborted == 1, what="the engine to see the hang-up")
        assert engine.completed_streams == 0
        text = (await r.client.get("/metrics")).text
        assert (
            metric_value(
                text, "prefixserving_router_requests_total", backend=url, outcome="disconnected"
            )
            == 1
        )
        assert r.router.pool.state(url).in_flight == 0


async def test_client_disconnect_before_the_answer_reaches_the_engine() -> None:
    # The client gives up long before the engine would answer, even on a stalled machine.
    async with fake_engines(1, first_delay_s=2.0) as [(engine, url)], running_router([url]) as r:
        with pytest.raises(httpx.ReadTimeout):
            await r.client.post("/v1/completions", json=completion("slow"), timeout=0.2)
        await wait_for_async(lambda: engine.aborted == 1, what="the engine to see the hang-up")
        await wait_for_async(
            lambda: r.router.pool.state(url).in_flight == 0, what="no request in flight"
        )


async def test_5xx_before_first_byte_is_retried_once_on_the_next_backend() -> None:
    async with fake_engines(2) as engines, running_router([u for _, u in engines]) as r:
        (first, _), (second, _) = sorted(engines, key=lambda e: e[1])  # FirstPolicy's order
        first.fail_next = 1
        response = await r.client.post("/v1/completions", json=completion("a"))
        assert response.status_code == 200 and response.json()["backend"] == second.name
        assert len(first.received) == len(second.received) == 1
        text = (await r.client.get("/metrics")).text
        assert metric_value(text, "prefixserving_router_retries_total", reason="server_error") == 1


class _ReversePolicy(RoutingPolicy):
    """The first backend in sorted order, then the others in reverse: a fallback order no
    ranking by URL would give."""

    name = "reverse"

    def select(self, ctx: RoutingContext) -> Decision:
        first, *rest = sorted(ctx.backends)
        return Decision(first, DecisionReason.AFFINITY, tuple(reversed(rest)))


async def test_the_retry_goes_to_the_first_fallback_of_the_decision() -> None:
    async with (
        fake_engines(3) as engines,
        running_router([u for _, u in engines], policy=_ReversePolicy()) as r,
    ):
        first, middle, last = (engine for engine, _ in sorted(engines, key=lambda e: e[1]))
        first.fail_next = 1
        response = await r.client.post("/v1/completions", json=completion("a"))
        assert response.status_code == 200 and response.json()["backend"] == last.name
        assert (len(first.received), len(middle.received), len(last.received)) == (1, 0, 1)


async def test_connection_dropped_before_first_byte_is_retried() -> None:
    async with fake_engines(2) as engines, running_router([u for _, u in engines]) as r:
        (first, _), (second, _) = sorted(engines, key=lambda e: e[1])  # FirstPolicy's order
        first.break_next = 1
        response = await r.client.post("/v1/completions", json=completion("a", stream=True))
        assert response.status_code == 200
        assert response.content.startswith(second.chunk(1, 0))
        text = (await r.client.get("/metrics")).text
        assert metric_value(text, "prefixserving_router_retries_total", reason="read_error") == 1


async def test_connect_error_is_retried_and_a_second_failure_is_not() -> None:
    async with fake_engines(1) as [(engine, url)]:
        dead = "http://127.0.0.1:1"  # nothing listens; sorts before any other port
        async with running_router([dead, url]) as r:  # the dead one sorts first
            response = await r.client.post("/v1/completions", json=completion("a"))
            assert response.status_code == 200 and response.json()["backend"] == engine.name
            engine.fail_next = 2
            response = await r.client.post("/v1/completions", json=completion("b"))
            # dead -> retried once on the engine, which answers 500: passed through.
            assert response.status_code == 500
            assert response.json()["error"]["message"] == "fake failure"
        async with running_router([dead]) as r:
            response = await r.client.post("/v1/completions", json=completion("a"))
            assert response.status_code == 502
            assert response.json()["error"]["type"] == "upstream_error"


async def test_error_after_first_byte_is_passed_through_not_retried() -> None:
    async with fake_engines(2, chunks=5) as engines, running_router([u for _, u in engines]) as r:
        (first, _), (second, _) = sorted(engines, key=lambda e: e[1])  # FirstPolicy's order
        first.break_stream_next = 1
        received = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with r.client.stream(
                "POST", "/v1/completions", json=completion("a", stream=True)
            ) as response:
                assert response.status_code == 200
                async for chunk in response.aiter_raw():
                    received += chunk
        assert received == first.chunk(1, 0)
        assert second.received == []
        text = (await r.client.get("/metrics")).text
        assert metric_value(text, "prefixserving_router_retries_total", reason="read_error") == 0


async def test_models_is_forwarded() -> None:
    async with fake_engines(2) as engines, running_router([u for _, u in engines]) as r:
        response = await r.client.get("/v1/models")
        assert response.status_code == 200
        assert response.json()["data"][0]["id"] == "fake-model"


async def test_no_answer_within_the_read_timeout_is_retried_on_the_next_backend() -> None:
    config = RouterConfig(read_timeout_s=1.0)
    async with (
        fake_engines(2) as engines,
        running_router([u for _, u in engines], config=config) as r,
    ):
        (first, _), (second, _) = sorted(engines, key=lambda e: e[1])  # FirstPolicy's order
        first.first_delay_s = 3.0  # silent for 3 read timeouts; the second answers at once
        response = await r.client.post("/v1/completions", json=completion("a"))
        assert response.status_code == 200 and response.json()["backend"] == second.name
        text = (await r.client.get("/metrics")).text
        assert metric_value(text, "prefixserving_router_retries_total", reason="read_error") == 1
        await wait_for_async(
            lambda: first.aborted == 1, what="the silent engine to see the hang-up"
        )


async def test_a_stream_that_falls_silent_is_cut_after_the_read_timeout() -> None:
    config = RouterConfig(read_timeout_s=1.0)
    async with (
        fake_engines(1, chunks=50, chunk_delay_s=0.05) as [(engine, url)],
        running_router([url], config=config) as r,
    ):
        # Chunks 0.05 s apart keep a 1 s idle timer satisfied for the whole stream (a busy
        # machine may stall this loop for a while)...
        async with r.client.stream(
            "POST", "/v1/completions", json=completion("steady", stream=True)
        ) as response:
            raw = b"".join([chunk async for chunk in response.aiter_raw()])
        assert raw.endswith(b"data: [DONE]\n\n") and engine.completed_streams == 1
        # ...but a stream that stalls after its first chunk is cut within twice the timeout,
        # long before its next chunk.
        engine.chunk_delay_s = 60.0
        started = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError):
            async with r.client.stream(
                "POST", "/v1/completions", json=completion("stalls", stream=True)
            ) as response:
                async for _ in response.aiter_raw():
                    pass
        assert time.monotonic() - started < 30
        await wait_for_async(lambda: engine.aborted == 1, what="the engine to see the hang-up")
        assert r.router.pool.state(url).in_flight == 0


async def test_disconnect_propagates_under_a_server_without_the_disconnect_hook() -> None:
    """Stock uvicorn (no ``DISCONNECT_HOOK`` in the scope): the watcher task takes over."""
    async with fake_engines(1, chunks=100, chunk_delay_s=0.05) as [(engine, url)]:
        router = Router(pool=BackendPool(static=[url], config=FAST_POOL), policy=FirstPolicy())
        config = uvicorn.Config(
            build_app(router), host="127.0.0.1", port=0, http="httptools", log_config=None
        )
        async with serving(config) as base, httpx.AsyncClient(base_url=base) as client:
            async with client.stream(
                "POST", "/v1/completions", json=completion("x", stream=True)
            ) as response:
                async for _ in response.aiter_raw():
                    break  # read one chunk, then hang up
            await wait_for_async(lambda: engine.aborted == 1, what="the engine to see the hang-up")
            await wait_for_async(
                lambda: router.pool.state(url).in_flight == 0, what="no request in flight"
            )
            assert engine.completed_streams == 0
