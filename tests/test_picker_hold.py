"""Scale from zero at the endpoint picker: a pick that finds no Ready engine is held until one
appears (then picked) or until the hold time passes (then 503 with Retry-After), counted
meanwhile by the held-request gauge that KEDA's activation reads, as in the HTTP router.

The engine "appears" as in Kubernetes: the engine Service's DNS name starts resolving to it
(a resolver the test controls) and the pool's discovery step (``refresh_members``, which the
admin app's lifespan runs every ``dns_interval_s``) finds it. picker_support says what the
in-process gateway double leaves to ``e2e/test_gateway_e2e.py`` (the gateway's own
``message_timeout`` above all).
"""

from __future__ import annotations

import asyncio
import json
import time

from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from picker_support import Stream, chat_body, running_picker
from prefixserving import constants
from prefixserving.router.app import Router, RouterConfig
from prefixserving.router.backends import BackendPool
from prefixserving.router.picker import protocol
from prefixserving.router.policies.registry import make_policy
from prefixserving.router.prefix_hashing import KeyConfig
from prefixserving_lab.runners.gateway import picked, request_body, request_headers
from prefixserving_lab.testing import wait_for_async
from router_support import Discovery, metric_value

DNS = ("chat-engine.llm.svc.cluster.local", 8000)
ENGINE_ADDRESS = "10.0.0.7"


def holding_router(discovery: Discovery, hold_s: float, retry_after_s: int = 1) -> Router:
    return Router(
        pool=BackendPool(dns=DNS, resolver=discovery),
        policy=make_policy("prefix-affinity"),
        key_config=KeyConfig(base_model="base"),
        config=RouterConfig(no_engine_hold_s=hold_s, retry_after_s=retry_after_s),
    )


def held_gauge(router: Router) -> float:
    """The held-request gauge as Prometheus scrapes it from the picker's /metrics."""
    text = generate_latest(router.metrics.registry).decode()
    return metric_value(text, constants.METRIC_ROUTER_HELD_REQUESTS)


async def test_a_pick_is_held_until_an_engine_is_ready_then_answered() -> None:
    discovery = Discovery()
    router = holding_router(discovery, hold_s=60)
    await router.pool.refresh_members()
    assert router.pool.healthy() == ()
    async with running_picker(router) as picker:
        # Serving without an engine: a gateway that health-checks the picker keeps calling it.
        health = health_pb2_grpc.HealthStub(picker.channel)
        for service in (protocol.READINESS, protocol.EXT_PROC_SERVICE):
            check = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert check.status == health_pb2.HealthCheckResponse.SERVING
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(chat_body("hello " * 40), True))
        answer = asyncio.create_task(stream.read(2))
        await wait_for_async(lambda: held_gauge(router) == 1, timeout_s=10, what="a held pick")
        assert not answer.done()

        discovery.start_engine(ENGINE_ADDRESS)
        await router.pool.refresh_members()
        pick, _body = await asyncio.wait_for(answer, timeout=10)
        assert picked(pick)[0] == f"{ENGINE_ADDRESS}:{DNS[1]}"
        assert held_gauge(router) == 0
        await stream.close()


async def test_a_held_pick_gets_503_with_retry_after_when_no_engine_comes() -> None:
    hold_s = 0.3
    router = holding_router(Discovery(), hold_s=hold_s, retry_after_s=7)
    async with running_picker(router) as picker:
        stream = Stream(picker)
        started = time.monotonic()
        await stream.send(request_headers(), request_body(chat_body("x"), True))
        (answer,) = await stream.read()
        assert time.monotonic() - started >= hold_s
        immediate = answer.immediate_response
        assert immediate.status.code == 503
        names = {h.header.key: h.header.raw_value for h in immediate.headers.set_headers}
        assert names["retry-after"] == b"7"
        assert json.loads(immediate.body)["error"]["code"] == 503
        assert await stream.close() == []
        assert held_gauge(router) == 0
    assert router.metrics.requests.values == {("", "no_backend"): 1}


async def test_a_gateway_that_gives_up_on_a_held_pick_releases_it() -> None:
    """The gateway's message timeout ends the stream first: the pick stops waiting, the gauge
    drops, and the request counts as disconnected."""
    router = holding_router(Discovery(), hold_s=600)
    async with running_picker(router) as picker:
        stream = Stream(picker)
        await stream.send(request_headers(), request_body(chat_body("x"), True))
        await wait_for_async(lambda: held_gauge(router) == 1, timeout_s=10, what="a held pick")
        stream.call.cancel()
        await wait_for_async(
            lambda: router.metrics.requests.values, timeout_s=10, what="the stream to end"
        )
        assert held_gauge(router) == 0
    assert router.metrics.requests.values == {("", "disconnected"): 1}
