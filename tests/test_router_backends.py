"""Backends: load parsing, passive ejection and probing back in, DNS discovery, routing
identities."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from prefixserving import constants
from prefixserving.router.backends import (
    BackendPool,
    PoolConfig,
    backend_url,
    parse_load,
    system_resolver,
)
from prefixserving_lab.runners.fake_engine import FakeEngine, fake_engine_config, serving
from prefixserving_lab.runners.stack.processes import free_port
from prefixserving_lab.testing import wait_for_async
from router_support import completion, fake_engines, metric_value, running_router


def test_parse_load_reads_only_the_three_vllm_series() -> None:
    text = (
        "# HELP vllm:num_requests_waiting x\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting{engine="1",model_name="m"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 50.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75\n'
        "vllm:num_requests_running 9\n"
    )
    assert parse_load(text) == (5.0, 0.75, 9.0)
    assert parse_load("") == (0.0, 0.0, 0.0)


def test_backend_url_brackets_ipv6() -> None:
    assert backend_url("10.0.0.7", 8000) == "http://10.0.0.7:8000"
    assert backend_url("fd00::7", 8000) == "http://[fd00::7]:8000"


def test_ejection_backoff_doubles_and_traffic_success_resets_it() -> None:
    now = [0.0]
    ejected: list[str] = []
    pool = BackendPool(
        static=["http://a:1", "http://b:1"],
        config=PoolConfig(eject_after_failures=2, eject_base_s=1.0, eject_max_s=3.0),
        clock=lambda: now[0],
        on_eject=ejected.append,
    )
    pool.record_failure("http://a:1")
    assert pool.healthy() == ("http://a:1", "http://b:1")
    pool.record_failure("http://a:1")
    assert pool.healthy() == ("http://b:1",) and ejected == ["http://a:1"]
    assert set(pool.loads()) == {"http://b:1"}
    state = pool.state("http://a:1")
    assert state is not None and state.ejected_until == 1.0
    pool._eject(state)  # a failed probe
    assert state.ejected_until == 2.0  # 1 s doubled
    pool._eject(state)
    assert state.ejected_until == 3.0  # capped at 3 s
    with pytest.raises(ValueError, match="either"):
        BackendPool(static=["http://a:1"], dns=("x", 1))
    for bad in ("https://a:1", "a:1", "http://a:1/v1"):
        with pytest.raises(ValueError, match=r"http://HOST:PORT"):
            BackendPool(static=[bad])


async def test_failing_engine_is_ejected_then_probed_back_in() -> None:
    pool_config = PoolConfig(
        scrape_interval_s=0.05, eject_after_failures=2, eject_base_s=0.2, eject_max_s=0.4
    )
    async with fake_engines(2) as engines:
        (sick, sick_url), (well, _) = sorted(engines, key=lambda e: e[1])  # FirstPolicy order
        async with running_router([u for _, u in engines], pool_config=pool_config) as r:
            sick.fail_next = 1000
            sick.healthy = False
            for i in range(2):  # each fails on the sick one, then succeeds on the retry
                response = await r.client.post("/v1/completions", json=completion(f"p{i}"))
                assert response.json()["backend"] == well.name
            assert sick_url not in r.router.pool.healthy()
            received = len(sick.received)
            for i in range(5):  # ejected: no more traffic to it
                response = await r.client.post("/v1/completions", json=completion(f"q{i}"))
                assert response.json()["backend"] == well.name
            assert len(sick.received) == received
            state = r.router.pool.state(sick_url)
            await wait_for_async(
                lambda: state is not None and state.ejections >= 2,
                what="two ejections (a failed probe)",
            )
            assert sick_url not in r.router.pool.healthy()
            text = (await r.client.get("/metrics")).text
            assert metric_value(text, "prefixserving_router_ejections_total", backend=sick_url) >= 2
            assert metric_value(text, "prefixserving_router_backend_healthy", backend=sick_url) == 0
            sick.healthy = True
            sick.fail_next = 0
            await wait_for_async(
                lambda: sick_url in r.router.pool.healthy(), what="the sick engine back in the pool"
            )
            response = await r.client.post("/v1/completions", json=completion("back"))
            assert response.json()["backend"] == sick.name


async def test_with_no_healthy_backend_an_ejected_one_is_probed_before_its_backoff_ends() -> None:
    """Scale from zero behind a fixed URL: the only backend was ejected for a long backoff; it
    comes up and the next scrape finds it. With another backend healthy, it waits its turn, and
    an early probe that fails does not lengthen the backoff."""
    now = [0.0]
    config = PoolConfig(eject_after_failures=1, eject_base_s=60.0, eject_max_s=60.0)
    first, second = FakeEngine(name="a"), FakeEngine(name="b")
    async with (
        serving(fake_engine_config(first)) as url_a,
        serving(fake_engine_config(second)) as url_b,
        aiohttp.ClientSession() as session,
    ):
        pair = BackendPool(static=[url_a, url_b], config=config, clock=lambda: now[0])
        first.healthy = False
        pair.record_failure(url_a)
        await pair.scrape_once(session)
        assert pair.healthy() == (url_b,)  # b is healthy: a waits out its backoff
        first.healthy = True
        await pair.scrape_once(session)
        assert pair.healthy() == (url_b,)

        alone = BackendPool(static=[url_a], config=config, clock=lambda: now[0])
        first.healthy = False
        alone.record_failure(url_a)
        state = alone.state(url_a)
        assert state is not None and state.ejected_until == 60.0
        await alone.scrape_once(session)  # early probe fails: backoff unchanged
        assert alone.healthy() == () and state.ejected_until == 60.0
        assert state.ejections == 1
        first.healthy = True
        now[0] = 1.0
        await alone.scrape_once(session)
        assert alone.healthy() == (url_a,)


async def test_dns_discovery_follows_the_records() -> None:
    # Two fake engines on the same port at two loopback addresses, like pods behind a
    # headless Service.
    first = FakeEngine(name="pod-a")
    second = FakeEngine(name="pod-b")
    async with serving(fake_engine_config(first, host="127.0.0.2")) as url_a:
        port = int(url_a.rsplit(":", 1)[1])
        async with serving(fake_engine_config(second, host="127.0.0.3", port=port)) as url_b:
            records = {"engines.test": ["127.0.0.2"]}
            asked: list[tuple[str, int]] = []

            async def resolver(host: str, asked_port: int) -> list[str]:
                asked.append((host, asked_port))
                if host not in records:
                    raise LookupError(host)
                if records[host] == ["boom"]:
                    raise OSError("resolver timed out")
                return records[host]

            async with running_router(dns=("engines.test", port), resolver=resolver) as r:
                assert r.router.pool.healthy() == (url_a,)
                assert (await r.client.post("/v1/completions", json=completion("x"))).json()[
                    "backend"
                ] == "pod-a"
                records["engines.test"] = ["127.0.0.3", "127.0.0.2"]
                await wait_for_async(
                    lambda: r.router.pool.healthy() == (url_a, url_b), what="both engines healthy"
                )
                records["engines.test"] = ["boom"]  # resolver trouble: keep the last list
                asked_before = len(asked)
                await wait_for_async(
                    lambda: len(asked) >= asked_before + 3, what="three more DNS lookups"
                )
                assert r.router.pool.healthy() == (url_a, url_b)
                records["engines.test"] = ["127.0.0.3"]  # pod-a is no longer Ready
                await wait_for_async(
                    lambda: r.router.pool.healthy() == (url_b,), what="only engine b in the pool"
                )
                del records["engines.test"]  # no Ready pod at all
                await wait_for_async(lambda: r.router.pool.healthy() == (), what="an empty pool")
                assert (await r.client.get("/readyz")).status_code == 503
            assert asked[0] == ("engines.test", port)


async def test_system_resolver_and_missing_names() -> None:
    assert "127.0.0.1" in await system_resolver("localhost", 80)
    with pytest.raises(LookupError):
        await system_resolver("no-such-name.invalid", 80)


# Routing identities ---------------------------------------------------------------------------


HANG = (0, "")
"""A sidecar that does not answer until the test ends: the pool's timeout fires first."""


def says(identity: str | None) -> tuple[int, str]:
    """A sidecar's ``200`` answer carrying ``identity``."""
    return 200, json.dumps({"identity": identity})


def engine_at(host: str) -> str:
    """The backend URL of an engine at ``host`` (its port is never asked here)."""
    return backend_url(host, 1)


class Sidecars:
    """Warm-up sidecars answering ``GET /identity`` on one port at several loopback addresses:
    ``answers[host]`` is ``(status, body)`` (:data:`HANG`: no answer until ``release`` is
    set), changeable while they serve; ``asked[host]`` counts the requests each received."""

    def __init__(self, answers: dict[str, tuple[int, str]]) -> None:
        self.answers = answers
        self.asked: Counter[str] = Counter()
        self.port = free_port()
        self.release = asyncio.Event()

    async def identity(self, request: web.Request) -> web.Response:
        host = request.url.host or ""
        self.asked[host] += 1
        status, body = self.answers[host]
        if (status, body) == HANG:
            await self.release.wait()
            status = 503
        return web.Response(status=status, text=body, content_type="application/json")


@contextlib.asynccontextmanager
async def sidecars(answers: dict[str, tuple[int, str]]) -> AsyncIterator[Sidecars]:
    """:class:`Sidecars` serving at every host of ``answers`` in this event loop."""
    served = Sidecars(answers)
    app = web.Application()
    app.router.add_get(constants.WARMUP_IDENTITY_PATH, served.identity)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        for host in answers:
            await web.TCPSite(runner, host, served.port).start()
        yield served
    finally:
        served.release.set()
        await runner.cleanup()


async def test_identities_are_learned_once_and_asked_again_until_answered() -> None:
    answers = {
        "127.0.0.2": says("pod-a"),
        "127.0.0.3": (503, ""),  # not resolved yet
        "127.0.0.4": says(None),
        "127.0.0.5": says(""),
        "127.0.0.6": (200, "not json"),
        "127.0.0.7": (200, '["pod-g"]'),
        "127.0.0.8": (404, ""),
        "127.0.0.9": HANG,
    }
    refused = "127.0.0.10"  # no sidecar listens there
    async with sidecars(answers) as side, aiohttp.ClientSession() as session:
        config = PoolConfig(identity_port=side.port, scrape_timeout_s=1.0)
        pool = BackendPool(static=[engine_at(h) for h in [*answers, refused]], config=config)
        assert pool.identities() == {}
        await pool.refresh(session)
        assert pool.identities() == {engine_at("127.0.0.2"): "pod-a"}
        await pool.refresh(session)
        assert pool.identities() == {engine_at("127.0.0.2"): "pod-a"}
        assert side.asked == {host: 1 if host == "127.0.0.2" else 2 for host in answers}
        answers["127.0.0.3"] = says("pod-old")  # its sidecar resolved it
        await pool.refresh(session)
        assert pool.identities() == {
            engine_at("127.0.0.2"): "pod-a",
            engine_at("127.0.0.3"): "pod-old",
        }
        # An engine is never ejected for its sidecar's answers.
        assert pool.healthy() == tuple(sorted(engine_at(h) for h in [*answers, refused]))


async def test_an_identity_is_forgotten_when_its_url_leaves() -> None:
    records = ["127.0.0.2"]

    async def resolver(host: str, port: int) -> list[str]:
        return records

    answers = {"127.0.0.2": says("pod-a"), "127.0.0.3": says("pod-b")}
    async with sidecars(answers) as side, aiohttp.ClientSession() as session:
        pool = BackendPool(
            dns=("engines.test", 1), resolver=resolver, config=PoolConfig(identity_port=side.port)
        )
        await pool.refresh(session)
        before = pool.identities()
        assert before == {engine_at("127.0.0.2"): "pod-a"}
        records[:] = ["127.0.0.3"]  # pod-a is gone
        await pool.refresh(session)
        assert pool.identities() == {engine_at("127.0.0.3"): "pod-b"}
        assert before == {engine_at("127.0.0.2"): "pod-a"}  # replaced, not changed
        answers["127.0.0.2"] = says("pod-c")  # a later pod got pod-a's address
        records[:] = ["127.0.0.2", "127.0.0.3"]
        await pool.refresh(session)
        assert pool.identities() == {
            engine_at("127.0.0.2"): "pod-c",
            engine_at("127.0.0.3"): "pod-b",
        }
        assert side.asked == {"127.0.0.2": 2, "127.0.0.3": 1}


async def test_the_refresh_loop_asks_a_static_list_too() -> None:
    answers = {"127.0.0.2": (503, "")}
    async with sidecars(answers) as side, aiohttp.ClientSession() as session:
        config = PoolConfig(scrape_interval_s=0.02, dns_interval_s=0.05, identity_port=side.port)
        pool = BackendPool(static=[engine_at("127.0.0.2")], config=config)
        loop = asyncio.create_task(pool.run(session))
        try:
            await wait_for_async(lambda: side.asked["127.0.0.2"] >= 2, what="two questions")
            answers["127.0.0.2"] = says("pod-a")
            await wait_for_async(
                lambda: pool.identities() == {engine_at("127.0.0.2"): "pod-a"},
                what="the identity learned",
            )
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop


async def test_without_an_identity_port_nothing_is_asked() -> None:
    async with sidecars({"127.0.0.2": says("pod-a")}) as side, aiohttp.ClientSession() as session:
        pool = BackendPool(static=[engine_at("127.0.0.2")])
        await pool.refresh(session)
        await pool.refresh_identities(session)
        assert pool.identities() == {} and not side.asked
