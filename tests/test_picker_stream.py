"""The endpoint picker driven as Envoy's ext_proc filter drives it (an in-process grpc.aio
server; picker_support says what this double leaves to e2e/test_gateway_e2e.py): the pick
equals the HTTP router's for the same requests and loads, the header and the metadata agree,
chunks flow in every mode, subset hints, 503 and 429, the served endpoint, cancellation,
bad requests, health, and the HTTP router's metrics and hot prefixes."""

from __future__ import annotations

import asyncio
import json
import time

import grpc
import httpx
import pytest
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker_support import Stream, chat_body, pick, picker_router, running_picker
from prefixserving import constants
from prefixserving.router.app import build_admin_app
from prefixserving.router.backends import PoolConfig
from prefixserving.router.picker import protocol
from prefixserving.router.picker.stream import PickerConfig
from prefixserving.router.policies.base import RoutingContext
from prefixserving.router.policies.registry import make_policy
from prefixserving.router.prefix_hashing import KeyConfig, chat_key
from prefixserving_lab.runners.gateway import (
    CHAT,
    chunks,
    modes,
    picked,
    request_body,
    request_headers,
    request_trailers,
    response_body,
    response_headers,
)
from prefixserving_lab.testing import wait_for_async
from router_support import fake_engines, metric_value, running_router

BACKENDS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]
DECISIONS = "prefixserving_router_decisions_total"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def conversation(i: int) -> bytes:
    """Requests that share system prompts (three of them) and differ after."""
    system = f"You are assistant number {i % 3}. " * 20
    return json.dumps(
        {
            "model": "fake-model",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"question {i} " * (5 + i % 7)},
            ],
            "max_tokens": 2,
        }
    ).encode()


ONE_SCRAPE = PoolConfig(scrape_interval_s=3600.0, scrape_timeout_s=30.0, dns_interval_s=3600.0)


def home_of(raw: bytes, urls: list[str], key_config: KeyConfig) -> str:
    """The engine prefix-affinity ranks first for ``raw`` (a fresh policy, equal loads)."""
    blocks = chat_key(json.loads(raw), key_config).blocks
    return make_policy("prefix-affinity").select(RoutingContext(blocks, tuple(urls))).backend


async def test_the_pick_is_the_http_routers_choice_for_the_same_requests_and_loads() -> None:
    """Both read the same engines' /metrics (unequal queues, so some prefixes spill) and see
    the same requests in the same order: every decision, fallbacks included, is the same.
    The longest queue is on the first conversation's home engine, so its requests spill
    whatever ports the engines got (the ranking hashes their URLs)."""
    async with fake_engines(3) as engines:
        urls = [url for _, url in engines]
        key_config = KeyConfig(base_model="fake-model")
        home = home_of(conversation(0), urls, key_config)
        others = iter([0.0, 12.0])
        queues = [40.0 if url == home else next(others) for url in urls]
        for (engine, _), waiting in zip(engines, queues, strict=True):
            engine.waiting = waiting
        # Each pool scrapes once, so both decide on the same snapshot however slow the machine
        # (a rescrape in the loop could see a request in flight, or time out and eject).
        picker_side = picker_router(urls, pool_config=ONE_SCRAPE)
        picker_side.key_config = key_config
        async with (
            running_router(
                urls,
                policy=make_policy("prefix-affinity"),
                key_config=key_config,
                pool_config=ONE_SCRAPE,
            ) as http,
            picker_side.lifespan(),
            running_picker(picker_side) as picker,
        ):
            for pool in (http.router.pool, picker_side.pool):
                await wait_for_async(
                    lambda pool=pool: [pool.state(u).waiting for u in urls] == queues,
                    what="both pools scraped the engines",
                )
            received = [len(engine.received) for engine, _ in engines]
            for i in range(60):
                raw = conversation(i)
                response = await http.client.post(CHAT, content=raw)
                assert response.status_code == 200
                now = [len(engine.received) for engine, _ in engines]
                (served,) = [u for u, a, b in zip(urls, received, now, strict=True) if b > a]
                received = now
                endpoints = await pick(picker, raw, chunk_bytes=97)
                assert endpoints.split(",")[0] == protocol.endpoint(served), f"request {i}"
            http_decisions = http.router.metrics.decisions.values
            assert picker_side.metrics.decisions.values == http_decisions
            assert any(reason != "affinity" for _, reason in http_decisions), http_decisions


async def test_header_and_metadata_name_the_decision_and_its_fallbacks_in_order() -> None:
    router = picker_router(BACKENDS)
    raw = chat_body("hello " * 50)
    blocks = chat_key(json.loads(raw), router.key_config).blocks
    expected = router.policy.select(RoutingContext(blocks, tuple(BACKENDS)))  # before counting
    async with running_picker(router) as picker:
        endpoints = await pick(picker, raw)  # pick() checks that header and metadata agree
    assert endpoints == protocol.destination(expected.candidates)
    assert sorted(endpoints.split(",")) == sorted(protocol.endpoint(b) for b in BACKENDS)


@pytest.mark.parametrize("with_trailers", [False, True])
async def test_held_chunks_come_back_after_the_pick_unchanged_and_in_order(
    with_trailers: bool,
) -> None:
    """Full duplex: nothing is answered before the body ends (the pick must come first), then
    the pick, then every chunk echoed; a body ended by trailers keeps end_of_stream off."""
    raw = chat_body("x" * 5000)
    parts = chunks(raw, 1000)
    async with running_picker(picker_router(BACKENDS)) as picker:
        stream = Stream(picker)
        await stream.send(request_headers())
        for number, part in enumerate(parts, start=1):
            await stream.send(request_body(part, not with_trailers and number == len(parts)))
        if with_trailers:
            await stream.send(request_trailers())
        answers = await stream.read(1 + len(parts) + with_trailers)
        assert answers[0].WhichOneof("response") == "request_headers"
        echoed = [a.request_body.response.body_mutation.streamed_response for a in answers[1:]]
        echoed = echoed[: len(parts)]
        assert b"".join(e.body for e in echoed) == raw
        assert [e.end_of_stream for e in echoed] == [False] * (len(parts) - 1) + [not with_trailers]
        if with_trailers:
            assert answers[-1].WhichOneof("response") == "request_trailers"
        await stream.send(response_headers(), response_body(b"data: 1\n\n", True))
        headers_answer, body_answer = await stream.read(2)
        assert headers_answer.WhichOneof("response") == "response_headers"
        assert body_answer.response_body.response.body_mutation.streamed_response.body == (
            b"data: 1\n\n"
        )
        assert await stream.close() == []


async def test_buffered_mode_passes_the_headers_and_picks_in_the_body_answer() -> None:
    config = modes(ProcessingMode.BUFFERED, ProcessingMode.NONE)
    async with running_picker(picker_router(BACKENDS)) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(config=config))
        (headers_answer,) = await stream.read()
        assert headers_answer.request_headers.response.header_mutation.set_headers == []
        await stream.send(request_body(chat_body("buffered"), end_of_stream=True))
        (body_answer,) = await stream.read()
        assert body_answer.WhichOneof("response") == "request_body"
        header, metadata = picked(body_answer)
        assert header == metadata and header.count(",") == len(BACKENDS) - 1
        assert not body_answer.request_body.response.HasField("body_mutation")
        await stream.close()


@pytest.mark.parametrize(
    ("config", "body_first"),
    [(ProcessingMode.STREAMED, False), (ProcessingMode.NONE, False)],
)
async def test_a_mode_that_sends_the_body_after_the_answer_is_picked_at_once_by_load(
    config: int, body_first: bool
) -> None:
    router = picker_router(BACKENDS)
    router.pool.state(BACKENDS[0]).waiting = 5
    router.pool.state(BACKENDS[1]).waiting = 5
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(config=modes(config, body_first=body_first)))
        (answer,) = await stream.read()
        assert picked(answer)[0].split(",")[0] == protocol.endpoint(BACKENDS[2])
        if config == ProcessingMode.STREAMED:
            await stream.send(request_body(b'{"model": "base"}', True))
            (passed,) = await stream.read()
            assert passed.request_body == type(passed.request_body)()  # continue, unchanged
        await stream.close()


async def test_streamed_mode_with_the_body_first_waits_for_the_body() -> None:
    config = modes(ProcessingMode.STREAMED, body_first=True)
    async with running_picker(picker_router(BACKENDS)) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(config=config), request_body(chat_body("a"), True))
        pick_answer, passed = await stream.read(2)
        assert pick_answer.WhichOneof("response") == "request_headers"
        assert picked(pick_answer)[0]
        assert not passed.request_body.response.HasField("body_mutation")
        await stream.close()


async def test_requests_without_a_key_are_picked_at_their_headers() -> None:
    async with running_picker(picker_router(BACKENDS)) as picker:
        stream = Stream(picker)
        await stream.send(request_headers("/v1/models", method="GET", end_of_stream=True))
        (answer,) = await stream.read()
        assert picked(answer)[0]
        await stream.close()


async def test_the_subset_hint_limits_the_pick_and_an_empty_one_is_503() -> None:
    router = picker_router(BACKENDS)
    allowed = [protocol.endpoint(BACKENDS[1]), "10.9.9.9:8000"]
    async with running_picker(router) as picker:
        for i in range(12):
            stream = Stream(picker)
            await stream.send(
                request_headers(subset=allowed), request_body(chat_body(f"q{i}" * 40), True)
            )
            answer, _ = await stream.read(2)
            assert picked(answer)[0] == protocol.endpoint(BACKENDS[1])
            await stream.close()
        for subset in ([], ["10.9.9.9:8000"]):
            stream = Stream(picker)
            await stream.send(request_headers(subset=subset), request_body(chat_body("x"), True))
            (answer,) = await stream.read()
            assert answer.immediate_response.status.code == 503
            assert b"subset hint" in answer.immediate_response.body
            assert await stream.close() == []


async def test_no_ready_engine_is_503_with_retry_after_and_not_ready() -> None:
    router = picker_router(BACKENDS)
    for url in BACKENDS:
        router.pool._eject(router.pool.state(url))
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(chat_body("x"), True))
        (answer,) = await stream.read()
        immediate = answer.immediate_response
        assert immediate.status.code == 503
        names = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
        assert names["retry-after"] == b"1" and names["content-type"] == b"application/json"
        assert json.loads(immediate.body)["error"]["code"] == 503
        health = health_pb2_grpc.HealthStub(picker.channel)
        for service in (protocol.READINESS, protocol.EXT_PROC_SERVICE):
            check = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert check.status == NOT_SERVING
        assert router.metrics.requests.values == {("", "no_backend"): 1}


async def test_when_every_engine_is_queued_past_the_limit_requests_are_shed_with_429() -> None:
    router = picker_router(BACKENDS)
    for url in BACKENDS:
        router.pool.state(url).waiting = 8
    async with running_picker(router, PickerConfig(shed_waiting_requests=8)) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(chat_body("x"), True))
        (answer,) = await stream.read()
        assert answer.immediate_response.status.code == 429
        router.pool.state(BACKENDS[0]).waiting = 7
        assert await pick(picker, chat_body("y")) != ""
    assert router.metrics.requests.values[("", "shed")] == 1


async def test_health_services_follow_the_engines() -> None:
    router = picker_router(BACKENDS)
    async with running_picker(router) as picker:
        health = health_pb2_grpc.HealthStub(picker.channel)

        async def status(service: str) -> int:
            return (await health.Check(health_pb2.HealthCheckRequest(service=service))).status

        for service in (protocol.LIVENESS, protocol.READINESS, protocol.EXT_PROC_SERVICE):
            assert await status(service) == SERVING
        for url in BACKENDS:
            router.pool._eject(router.pool.state(url))
        deadline = time.monotonic() + 10
        while await status(protocol.READINESS) != NOT_SERVING:  # re-checked every 50 ms
            assert time.monotonic() < deadline, "readiness did not turn NOT_SERVING"
            await asyncio.sleep(0.01)
        assert await status(protocol.EXT_PROC_SERVICE) == NOT_SERVING
        assert await status(protocol.LIVENESS) == SERVING
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await status("no-such-service")
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


BAD_REQUESTS = {
    "not JSON": ([request_headers()], [b'{"model": "base", "messages": [}'], 400, None),
    "no model": ([request_headers()], [b'{"messages": []}'], 400, "model"),
    "not UTF-8": ([request_headers()], [b'{"model": "\xff"}'], 400, None),
    "bad messages": ([request_headers()], [b'{"model": "b", "messages": "hi"}'], 400, "messages"),
    "declared too large": (
        [request_headers(headers=[("content-length", str(1 << 30))])],
        [],
        413,
        None,
    ),
    "streamed too large": ([request_headers()], [b" " * 700_000, b" " * 700_000], 413, None),
    "not JSON content": (
        [request_headers(headers=[("content-type", "text/plain")])],
        [],
        415,
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
async def test_bad_requests_get_an_immediate_answer_and_the_picker_keeps_serving(
    case: str,
) -> None:
    first, body_chunks, status, param = BAD_REQUESTS[case]
    router = picker_router(BACKENDS, max_body_bytes=1 << 20)
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(*first)
        for number, chunk in enumerate(body_chunks, start=1):
            try:
                await stream.send(request_body(chunk, number == len(body_chunks)))
            except grpc.aio.UsageError:
                break  # the picker already answered and ended the stream
        (answer,) = await stream.read()
        immediate = answer.immediate_response
        assert immediate.status.code == status
        error = json.loads(immediate.body)["error"]
        assert error["code"] == status and error["param"] == param and error["message"]
        assert await stream.close() == []
        assert router.metrics.requests.values == {("", "rejected"): 1}
        assert await pick(picker, chat_body("still serving"))  # the next stream is fine


async def test_the_served_endpoint_takes_the_in_flight_count_and_the_policys_memory() -> None:
    router = picker_router(BACKENDS[:2], policy=make_policy("two-choice"))
    pool = router.pool
    raw = chat_body("a conversation " * 30)
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(raw, True))
        answer, _ = await stream.read(2)
        first, fallback = picked(answer)[0].split(",")
        assert pool.state(protocol.backend(first)).in_flight == 1
        await stream.send(response_headers(200, served=fallback))
        await stream.read()
        assert pool.state(protocol.backend(first)).in_flight == 0
        assert pool.state(protocol.backend(fallback)).in_flight == 1
        await stream.send(response_body(b"done", True))
        await stream.read()
        await stream.close()
        assert pool.state(protocol.backend(fallback)).in_flight == 0
        # two-choice remembers where the key's cache is: the next request goes there
        assert (await pick(picker, raw)).split(",")[0] == fallback
    assert router.metrics.retries.values == {("gateway",): 1}
    assert router.metrics.requests.values[(protocol.backend(fallback), "ok")] == 1


async def test_a_cancelled_stream_releases_its_engine_and_counts_as_disconnected() -> None:
    router = picker_router(BACKENDS)
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(chat_body("x" * 300), True))
        answer, _ = await stream.read(2)
        chosen = protocol.backend(picked(answer)[0].split(",")[0])
        assert router.pool.state(chosen).in_flight == 1
        stream.call.cancel()
        await wait_for_async(
            lambda: router.pool.state(chosen).in_flight == 0, what="in-flight released"
        )
        await wait_for_async(
            lambda: router.metrics.requests.values.get((chosen, "disconnected")) == 1,
            what="disconnected counted",
        )
        stream = Stream(picker)  # cancelled in the middle of its body
        await stream.send(request_headers(), request_body(b'{"model": "base", "mess'))
        stream.call.cancel()
        await wait_for_async(
            lambda: router.metrics.requests.values.get(("", "disconnected")) == 1,
            what="disconnected before the pick counted",
        )
        assert await pick(picker, chat_body("next"))


async def test_admin_routes_serve_the_routers_metrics_and_the_hot_prefixes_for_warm_up() -> None:
    router = picker_router(BACKENDS[:2])
    system = "You are a careful reviewer of long documents. " * 20
    async with running_picker(router) as picker:
        for i in range(4):
            raw = json.dumps(
                {
                    "model": "base",
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": f"document {i}"},
                    ],
                }
            ).encode()
            stream = Stream(picker)
            await stream.send(request_headers(), request_body(raw, True))
            await stream.read(2)
            await stream.send(response_headers(200), response_body(b"ok", True))
            await stream.read(2)
            await stream.close()
    transport = httpx.ASGITransport(app=build_admin_app(router))
    async with httpx.AsyncClient(transport=transport, base_url="http://picker") as client:
        metrics = (await client.get("/metrics")).text
        for backend in BACKENDS[:2]:
            assert f'prefixserving_router_backend_in_flight{{backend="{backend}"}} 0.0' in metrics
        ok = sum(
            metric_value(metrics, "prefixserving_router_requests_total", backend=b, outcome="ok")
            for b in BACKENDS[:2]
        )
        assert ok == 4
        decided = sum(
            metric_value(metrics, DECISIONS, policy="prefix_affinity", decision=d)
            for d in ("affinity", "spilled", "fallback", "balance")
        )
        assert decided == 4
        assert metric_value(metrics, "prefixserving_router_added_latency_seconds_count") == 4
        member = "http://10.0.0.9:8000"
        hot = (
            await client.get(constants.ROUTER_HOT_PREFIXES_PATH, params={"member": member})
        ).json()
        assert hot["member"] == member and hot["backends"] == BACKENDS[:2]
        every = (await client.get(constants.ROUTER_HOT_PREFIXES_PATH)).json()["prefixes"]
        assert every and every[0]["body"]["messages"][0]["content"].startswith("You are")
        assert (await client.get("/v1/chat/completions")).status_code == 404  # nothing proxied
