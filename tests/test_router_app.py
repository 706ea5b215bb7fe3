"""The HTTP surface: bad input, limits, no backend, health, metrics, hot prefixes, hygiene."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from prefixserving import constants
from prefixserving.router.app import RouterConfig
from prefixserving.router.exposition import LatencyHistogram
from prefixserving.router.policies.base import RoutingContext, route
from prefixserving.router.policies.registry import make_policy
from prefixserving.router.prefix_hashing import completion_key
from prefixserving_lab.testing import wait_for_async
from router_support import completion, fake_engines, metric_value, running_router


def assert_openai_error(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"]
    assert error["param"] == param
    return error


@pytest.mark.parametrize(
    ("path", "content", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"\xff\xfe", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b'{"prompt": "hi"}', "model"),
        ("/v1/chat/completions", b'{"model": "", "messages": []}', "model"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/chat/completions", b'{"model": "m", "messages": "hi"}', "messages"),
        ("/v1/completions", '{"model": "m", "prompt": "hi"}'.encode("utf-16"), None),
        ("/v1/completions", b'{"model": "m", "prompt": "\xed\xa0\x80"}', None),  # CESU-8
        ("/v1/completions", b'"just a string"', None),
        ("/v1/completions", b"null", None),
        ("/v1/completions", b'{"model": "m", "prompt": ' + b"[" * 100_000 + b"]" * 100_000, None),
        ("/v1/completions", b'{"model": "m", "prompt": [' + b"9" * 5000 + b"]}", None),
        ("/v1/completions", b'{"model": "m", "prompt": [99999999999999999999]}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": [1, "2"]}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": [1.5]}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": {"text": "hi"}}', "prompt"),
        ("/v1/completions", b'{"model": "m", "prompt": "\\ud800 lone"}', "prompt"),
        ("/v1/completions", b'{"model": "\\udfff", "prompt": "hi"}', "model"),
        (
            "/v1/completions",
            b'{"model": "m", "prompt": "hi", "cache_salt": "\\ud800"}',
            "cache_salt",
        ),
        ("/v1/completions", b'{"model": 7, "prompt": "hi"}', "model"),
        ("/v1/chat/completions", b'{"model": "m", "messages": [1, 2]}', "messages"),
        (
            "/v1/chat/completions",
            b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "messages",
        ),
    ],
)
async def test_bad_bodies_answer_400_and_never_reach_an_engine(
    path: str, content: bytes, param: str | None
) -> None:
    async with fake_engines(1) as [(engine, url)], running_router([url]) as r:
        response = await r.client.post(
            path, content=content, headers={"content-type": "application/json"}
        )
        error = assert_openai_error(response, 400, param)
        assert error["type"] == "invalid_request_error"
        assert engine.received == []


async def test_bodies_the_hot_prefix_answer_cannot_carry_are_forwarded_and_left_out() -> None:
    """NaN, a lone surrogate or deep nesting in a field the key does not read: the engine
    judges the request, the hot-prefix and hygiene endpoints keep answering, and the next
    clean request with the prefix makes it hot again."""
    system = "You are a careful assistant. " * 10
    extras = [b"NaN", b'"\\ud800"', b"[" * 200 + b"]" * 200]
    async with fake_engines(1) as [(engine, url)], running_router([url]) as r:
        for extra in extras:
            raw = (
                b'{"model": "m", "messages": [{"role": "system", "content": "'
                + system.encode()
                + b'", "extra": '
                + extra
                + b"}]}"
            )
            for _ in range(2):  # twice: a prefix seen twice is hot
                response = await r.client.post(
                    "/v1/chat/completions",
                    content=raw,
                    headers={"content-type": "application/json"},
                )
                assert response.status_code == 200
        assert len(engine.received) == 2 * len(extras)
        hot = await r.client.get(constants.ROUTER_HOT_PREFIXES_PATH)
        assert hot.status_code == 200 and hot.json()["prefixes"] == []
        assert (await r.client.get(constants.ROUTER_HYGIENE_PATH)).status_code == 200
        # A clean request with the same prefix is recorded and served back.
        clean = {"model": "m", "messages": [{"role": "system", "content": system}]}
        for _ in range(2):
            assert (await r.client.post("/v1/chat/completions", json=clean)).status_code == 200
        (row,) = (await r.client.get(constants.ROUTER_HOT_PREFIXES_PATH)).json()["prefixes"]
        assert row["body"]["messages"][0]["content"] == system[: row["blocks"] * 128 - 11]


async def test_body_limits() -> None:
    config = RouterConfig(max_body_bytes=1000, body_timeout_s=0.3)
    async with fake_engines(1) as [(engine, url)], running_router([url], config=config) as r:
        big = completion("x" * 2000)
        assert_openai_error(await r.client.post("/v1/completions", json=big), 413)

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
            for _ in range(20):
                yield b" " * 100

        assert_openai_error(await r.client.post("/v1/completions", content=chunked()), 413)

        async def slow() -> AsyncIterator[bytes]:
            yield b'{"model": "m", '
            await asyncio.sleep(1.0)  # a client stalled past body_timeout_s: the condition tested
            yield b'"prompt": "x"}'

        assert_openai_error(await r.client.post("/v1/completions", content=slow()), 408)
        assert engine.received == []
        ok = await r.client.post("/v1/completions", json=completion("x" * 500))
        assert ok.status_code == 200


async def test_header_timeout_closes_a_slow_client() -> None:
    async with fake_engines(1) as [(_, url)], running_router([url], header_timeout_s=0.3) as r:
        host, port = r.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(), timeout=3)
        assert closed == b""  # the router hung up without an answer
        writer.close()
        # An idle kept-alive connection is not cut by the header deadline...
        reader, writer = await asyncio.open_connection(host, int(port))
        for _ in range(2):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            await reader.readexactly(len(b'{"status":"ok"}'))
            await asyncio.sleep(0.5)  # idle longer than the header deadline: the condition tested
        # ...but the next request on it must complete its headers in time.
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), timeout=3) == b""
        writer.close()
        assert (await r.client.get("/healthz")).status_code == 200


async def test_no_backend_answers_503_with_retry_after_and_not_ready() -> None:
    async def nothing(host: str, port: int) -> list[str]:
        raise LookupError(host)

    async with running_router(dns=("engines.test", 8000), resolver=nothing) as r:
        response = await r.client.post("/v1/completions", json=completion("x"))
        assert_openai_error(response, 503)
        assert response.headers["retry-after"] == "1"
        assert (await r.client.get("/v1/models")).status_code == 503
        assert (await r.client.get("/readyz")).status_code == 503
        assert (await r.client.get("/healthz")).status_code == 200


async def test_metrics_count_requests_decisions_and_latency() -> None:
    async with fake_engines(2) as engines, running_router([u for _, u in engines]) as r:
        for i in range(3):
            assert (
                await r.client.post("/v1/completions", json=completion(f"p{i}"))
            ).status_code == 200
        await r.client.post("/v1/completions", content=b"{")
        (first_url, second_url) = sorted(u for _, u in engines)
        engines_by_url = {u: e for e, u in engines}
        engines_by_url[first_url].waiting = 7
        engines_by_url[first_url].kv_usage = 0.5
        state = r.router.pool.state(first_url)
        await wait_for_async(
            lambda: state is not None and state.waiting == 7 and state.kv_usage == 0.5,
            what="the scraped load of the first engine",
        )
        text = (await r.client.get("/metrics")).text
        m = "prefixserving_router_"
        assert metric_value(text, m + "requests_total", backend=first_url, outcome="ok") == 3
        assert metric_value(text, m + "requests_total", backend="", outcome="rejected") == 1
        assert metric_value(text, m + "decisions_total", policy="first", decision="affinity") == 3
        assert metric_value(text, m + "added_latency_seconds_count") == 3
        assert metric_value(text, m + "backend_waiting", backend=first_url) == 7
        assert metric_value(text, m + "backend_kv_usage", backend=first_url) == 0.5
        assert metric_value(text, m + "backend_healthy", backend=second_url) == 1
        assert metric_value(text, m + "backend_in_flight", backend=first_url) == 0


async def test_hot_prefix_endpoint() -> None:
    system = "You are a meticulous legal assistant. Cite the statute. " * 8
    async with fake_engines(2) as engines, running_router([u for _, u in engines]) as r:
        for i in range(4):
            body = {
                "model": "fake-model",
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"case {i}: " + "details " * 40},
                ],
                "temperature": 0.2,
            }
            assert (await r.client.post("/v1/chat/completions", json=body)).status_code == 200
        path = constants.ROUTER_HOT_PREFIXES_PATH
        answer = (await r.client.get(path, params={"limit": 5})).json()
        assert answer["member"] is None and sorted(answer["backends"]) == sorted(
            u for _, u in engines
        )
        (row,) = answer["prefixes"]
        assert row["kind"] == "chat" and row["hits"] == 4
        # Cut at the last full 128-character block the requests share (inside the system text).
        shared_chars = (len("<|system|>\n") + len(system)) // 128 * 128
        assert row["blocks"] == shared_chars // 128
        assert row["body"]["messages"] == [
            {"role": "system", "content": system[: shared_chars - len("<|system|>\n")]}
        ]
        assert "temperature" not in row["body"]
        # FirstPolicy ranks by URL: a member that sorts first owns everything, a last one nothing.
        first = (await r.client.get(path, params={"member": "http://0.0.0.0:1/"})).json()
        assert first["member"] == "http://0.0.0.0:1" and len(first["prefixes"]) == 1
        last = (await r.client.get(path, params={"member": "http://9.9.9.9:1"})).json()
        assert last["prefixes"] == [] and last["replaces"] is None
        # A member sorting between the two engines owns nothing, unless it replaces the first.
        first_url = sorted(u for _, u in engines)[0]
        between = {"member": first_url + "0"}
        assert (await r.client.get(path, params=between)).json()["prefixes"] == []
        handed = (await r.client.get(path, params={**between, "replaces": first_url + "/"})).json()
        assert handed["replaces"] == first_url and len(handed["prefixes"]) == 1
        alone = {"replaces": first_url}
        assert_openai_error(await r.client.get(path, params=alone), 400, "replaces")
        assert_openai_error(await r.client.get(path, params={"limit": 0}), 400, "limit")
        assert_openai_error(await r.client.get(path, params={"limit": "x"}), 400, "limit")


async def test_routing_and_hot_prefixes_rank_by_the_pools_identities(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two engines that report each other's URL as their identity swap places in every
    rendezvous ranking: the request goes where a policy given those identities sends it, not
    where the URLs alone would, and the hot prefixes a member owns follow the same ranking."""
    policy = "prefix-affinity"
    async with (
        fake_engines(2) as engines,
        running_router([u for _, u in engines], policy=make_policy(policy)) as r,
    ):
        urls = tuple(sorted(u for _, u in engines))
        swapped = {urls[0]: urls[1], urls[1]: urls[0]}
        monkeypatch.setattr(r.router.pool, "identities", lambda: swapped)
        body = completion("A long shared instruction block. " * 20)
        blocks = completion_key(body, r.router.key_config).blocks
        loads = r.router.pool.loads()

        def chosen(identities: dict[str, str]) -> str:
            context = RoutingContext(blocks, urls, loads, {}, identities=identities)
            return route(make_policy(policy), context).backend

        expected, by_url = chosen(swapped), chosen({})
        assert expected != by_url
        name = {u: e.name for e, u in engines}
        answer = await r.client.post("/v1/completions", json=body)
        assert answer.json()["backend"] == name[expected]
        for _ in range(3):  # make the prefix hot
            assert (await r.client.post("/v1/completions", json=body)).status_code == 200
        path = constants.ROUTER_HOT_PREFIXES_PATH
        owners = [
            url
            for url in urls
            if (await r.client.get(path, params={"member": url})).json()["prefixes"]
        ]
        by_url_owners = [u for u in urls if r.router.hot.owned_by(u, urls, r.router.policy, 5)]
        assert len(owners) == 1 and by_url_owners == [swapped[owners[0]]]


async def test_hygiene_endpoint_and_metric_flag_a_leading_timestamp() -> None:
    start = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    async with fake_engines(1) as [(_, url)], running_router([url]) as r:
        for i in range(60):
            stamp = (start + timedelta(seconds=13 * i)).isoformat()
            prompt = f"[{stamp}] You are a helpful assistant. " + "Shared instructions. " * 20
            assert (
                await r.client.post("/v1/completions", json=completion(prompt))
            ).status_code == 200
        (report,) = (await r.client.get(constants.ROUTER_HYGIENE_PATH)).json()["models"]
        assert report["model"] == "fake-model" and report["requests"] == 60
        assert report["new_first_block_ratio"] == 1.0
        assert report["cause"] == "timestamp" and "timestamp" in report["hint"]
        text = (await r.client.get("/metrics")).text
        assert (
            metric_value(text, constants.METRIC_ROUTER_NEW_FIRST_BLOCK_RATIO, model="fake-model")
            == 1.0
        )
        assert (
            metric_value(
                text, constants.METRIC_ROUTER_HYGIENE_CAUSE, model="fake-model", cause="timestamp"
            )
            == 1
        )


async def test_unknown_path_and_wrong_method_answer_openai_errors() -> None:
    async with fake_engines(1) as [(engine, url)], running_router([url]) as r:
        assert_openai_error(await r.client.get("/v1/embeddings"), 404)
        wrong = await r.client.get("/v1/completions")
        assert_openai_error(wrong, 405)
        assert wrong.headers["allow"] == "POST"
        head = await r.client.head("/healthz")
        assert head.status_code == 200 and head.content == b""
        assert engine.received == []


def test_latency_histogram_buckets_are_cumulative_and_bounds_inclusive() -> None:
    histogram = LatencyHistogram("x_seconds", "doc", (0.001, 0.002))
    for seconds in (0.0005, 0.001, 0.0015, 0.5):
        histogram.observe(seconds)
    samples = {(s.name, s.labels.get("le")): s.value for s in histogram.family().samples}
    assert samples[("x_seconds_bucket", "0.001")] == 2  # 0.001 itself is within le="0.001"
    assert samples[("x_seconds_bucket", "0.002")] == 3
    assert samples[("x_seconds_bucket", "+Inf")] == 4
    assert samples[("x_seconds_count", None)] == 4
    assert samples[("x_seconds_sum", None)] == pytest.approx(0.503)
