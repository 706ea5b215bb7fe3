"""Shared pieces of the router tests: fake engines and routers on loopback, in the test's loop."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass

import httpx
import uvicorn

from prefixserving.router.app import Router, RouterConfig, build_app
from prefixserving.router.backends import BackendPool, PoolConfig, Resolver
from prefixserving.router.cli import RouterSettings, router
from prefixserving.router.policies.base import (
    Decision,
    DecisionReason,
    RoutingContext,
    RoutingPolicy,
)
from prefixserving.router.prefix_hashing import KeyConfig
from prefixserving.router.server import uvicorn_config
from prefixserving_lab.runners.fake_engine import FakeEngine, fake_engine_config, serving
from prefixserving_lab.runners.stack.processes import free_port
from prefixserving_lab.testing import wait_for

FAST_POOL = PoolConfig(scrape_interval_s=0.05, scrape_timeout_s=0.5, dns_interval_s=0.05)


class FirstPolicy(RoutingPolicy):
    """Always the first backend in sorted order, the others in sorted order as fallbacks
    (tests only)."""

    name = "first"
    affinity = True

    def select(self, ctx: RoutingContext) -> Decision:
        first, *rest = sorted(ctx.backends)
        return Decision(first, DecisionReason.AFFINITY, tuple(rest))


@dataclass
class RunningRouter:
    url: str
    router: Router
    client: httpx.AsyncClient


@contextlib.asynccontextmanager
async def fake_engines(
    count: int, **behaviour: object
) -> AsyncIterator[list[tuple[FakeEngine, str]]]:
    """``count`` fake engines named e0, e1, ... with their URLs."""
    async with contextlib.AsyncExitStack() as stack:
        out = []
        for i in range(count):
            engine = FakeEngine(name=f"e{i}", **behaviour)  # type: ignore[arg-type]
            url = await stack.enter_async_context(serving(fake_engine_config(engine)))
            out.append((engine, url))
        yield out


@contextlib.asynccontextmanager
async def running_router(
    backends: Sequence[str] = (),
    *,
    policy: RoutingPolicy | None = None,
    dns: tuple[str, int] | None = None,
    resolver: Resolver | None = None,
    pool_config: PoolConfig = FAST_POOL,
    config: RouterConfig | None = None,
    key_config: KeyConfig | None = None,
    header_timeout_s: float = 10.0,
) -> AsyncIterator[RunningRouter]:
    """A router on a free loopback port in this event loop, with an HTTP client for it."""
    extra = {"resolver": resolver} if resolver is not None else {}
    pool = BackendPool(static=backends, dns=dns, config=pool_config, **extra)  # type: ignore[arg-type]
    router = Router(
        pool=pool,
        policy=policy or FirstPolicy(),
        key_config=key_config,
        config=config,
    )
    app_config = uvicorn_config(
        build_app(router), host="127.0.0.1", port=0, header_timeout_s=header_timeout_s
    )
    async with (
        serving(app_config) as url,
        httpx.AsyncClient(base_url=url, timeout=10, trust_env=False) as client,
    ):
        yield RunningRouter(url, router, client)


def completion(prompt: str | list[int], **extra: object) -> dict[str, object]:
    return {"model": "fake-model", "prompt": prompt, "max_tokens": 4, **extra}


class Discovery:
    """A DNS resolver (``BackendPool(resolver=...)``) that knows no engine until
    :meth:`start_engine` is called: the engine Service's name starts resolving, as when a pod
    turns Ready."""

    def __init__(self) -> None:
        self.addresses: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        if not self.addresses:
            raise LookupError(host)
        return self.addresses

    def start_engine(self, address: str) -> None:
        self.addresses = [address]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


@contextlib.contextmanager
def engine_in_thread(engine: FakeEngine) -> Iterator[str]:
    """A fake engine served by uvicorn in a background thread (the router is a subprocess)."""
    port = free_port()
    server = uvicorn.Server(fake_engine_config(engine, port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:

        def started() -> bool:
            assert thread.is_alive(), "the fake engine did not start"
            return server.started

        wait_for(started, what="the fake engine")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def router_settings(args: Sequence[str]) -> RouterSettings:
    """The settings ``prefixserving router ARGS`` runs with (the router's own parser)."""
    context = router.make_context("router", list(args))
    options = {k: v for k, v in context.params.items() if k in RouterSettings.__dataclass_fields__}
    return RouterSettings(**options)
