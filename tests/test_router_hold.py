"""Scale from zero at the router: a request that finds no Ready engine is held until one
appears (then served) or until the hold time passes (then 503 with Retry-After), and the
held-request gauge that KEDA's activation reads counts it meanwhile.

The engine "appears" the way it does in Kubernetes: the engine Service's DNS name starts
resolving to it (a resolver the test controls), so the router's own discovery finds it.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

import pytest

from prefixserving import constants
from prefixserving.router.app import RouterConfig
from prefixserving.router.hold import ReadyHold
from prefixserving_lab.testing import wait_for_async
from router_support import Discovery, completion, fake_engines, metric_value, running_router

DNS_NAME = "chat-engine.llm.svc.cluster.local"


async def held(client) -> float:  # type: ignore[no-untyped-def]
    text = (await client.get("/metrics")).text
    return metric_value(text, constants.METRIC_ROUTER_HELD_REQUESTS)


async def test_a_request_is_held_until_an_engine_is_ready_then_served() -> None:
    discovery = Discovery()
    async with fake_engines(1) as [(_, url)]:
        address = urlsplit(url)
        dns = (DNS_NAME, address.port or 80)
        config = RouterConfig(no_engine_hold_s=60)
        async with running_router(dns=dns, resolver=discovery, config=config) as r:
            assert await held(r.client) == 0
            # Ready without an engine: the router must stay in its Service to be woken.
            assert (await r.client.get("/readyz")).status_code == 200
            request = asyncio.create_task(r.client.post("/v1/completions", json=completion("x")))
            models = asyncio.create_task(r.client.get("/v1/models"))

            deadline = time.monotonic() + 10
            while await held(r.client) != 2:
                assert time.monotonic() < deadline, "the requests were not held"
                assert not request.done(), (await request).text
                await asyncio.sleep(0.02)
            discovery.start_engine(str(address.hostname))
            response = await asyncio.wait_for(request, timeout=10)
            assert response.status_code == 200, response.text
            assert (await asyncio.wait_for(models, timeout=10)).status_code == 200
            assert await held(r.client) == 0


async def test_a_request_gets_503_with_retry_after_when_no_engine_comes() -> None:
    hold_s = 0.3
    config = RouterConfig(no_engine_hold_s=hold_s, retry_after_s=7)
    async with running_router(dns=(DNS_NAME, 8000), resolver=Discovery(), config=config) as r:
        started = time.monotonic()
        response = await r.client.post("/v1/completions", json=completion("x"))
        assert time.monotonic() - started >= hold_s
        assert response.status_code == 503
        assert response.headers["retry-after"] == "7"
        assert response.json()["error"]["type"] == "service_unavailable"
        assert await held(r.client) == 0


async def test_the_hold_wakes_on_the_pool_change_not_by_polling() -> None:
    """A waiter returns as soon as the pool reports a change, long before its deadline."""
    backends: tuple[str, ...] = ()
    hold = ReadyHold(lambda: backends, hold_s=600)
    waiter = asyncio.create_task(hold.backends())
    await wait_for_async(lambda: hold.held == 1, what="the waiter to be held")
    hold.healthy_changed()  # still none: the waiter keeps waiting
    await asyncio.sleep(0)
    assert not waiter.done()
    backends = ("http://10.0.0.1:8000",)
    hold.healthy_changed()
    assert await asyncio.wait_for(waiter, timeout=5) == backends
    assert hold.held == 0


def test_a_negative_hold_is_refused() -> None:
    with pytest.raises(ValueError, match="hold_s"):
        ReadyHold(lambda: (), hold_s=-1)
