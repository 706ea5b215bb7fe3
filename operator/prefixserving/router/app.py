"""The router's HTTP app (a bare ASGI app, served by uvicorn) and its lifecycle.

Routes (exact paths, one dict lookup; ``GET`` routes also answer ``HEAD``):

- ``POST /v1/completions``, ``POST /v1/chat/completions``: read the body (at most
  ``max_body_bytes``, within ``body_timeout_s``), hash its prefix blocks
  (``router.prefix_hashing``), record it for prefix hygiene and hot prefixes, let the policy
  decide (``policies.base.route``: the backend and its fallbacks) and forward to them in turn
  (``router.proxy``). Answers ``400`` for a body that is not a UTF-8 JSON object, a missing
  ``model``, a bad prompt or messages (each names the field), ``413`` for a body over the
  limit, ``408`` for a body too slow to arrive, ``503`` with ``Retry-After`` when no backend
  is available (after holding the request up to ``no_engine_hold_s`` for one to become Ready,
  ``router.hold``), all with OpenAI-style error bodies.
- ``GET /v1/models``: forwarded to a healthy backend (rotating; the next ones are the
  fallbacks), with the same retry.
- ``GET /healthz``: the process is up. ``GET /readyz``: at least one backend takes traffic,
  or the router holds requests while none does (``no_engine_hold_s`` above 0).
- ``GET /metrics``: Prometheus exposition (``router.exposition``).
- ``GET /v1/prefixserving/hot-prefixes``: see ``router.hot``.
- ``GET /v1/prefixserving/hygiene``: per-model new-first-block ratio, cause and hint.

The lifespan runs one discovery refresh (the members and, with an identity port, their routing
identities: ``router.backends``) before the app takes requests, starts the pool's discovery and
scrape loop and closes the HTTP clients at the end.

No web framework sits on the request path: a routed request is read straight from the ASGI
``receive`` and answered by a :class:`~prefixserving.router.proxy.Exchange`. starlette's
routing, middleware stack and ``Request`` objects cost about a sixth of the router's CPU per
request (``bench/router_overhead.py``); its response classes still build the small answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import aiohttp
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from prefixserving import constants
from prefixserving.router import prefix_hashing
from prefixserving.router.backends import BackendPool
from prefixserving.router.errors import error_response
from prefixserving.router.exposition import RouterMetrics
from prefixserving.router.hold import ReadyHold
from prefixserving.router.hot import DEFAULT_LIMIT, MAX_LIMIT, HotPrefixes
from prefixserving.router.hygiene import PrefixHygiene
from prefixserving.router.policies.base import Decision, RoutingContext, RoutingPolicy, route
from prefixserving.router.proxy import Exchange, Proxy, UpstreamRequest
from prefixserving.router.upstream import UpstreamPool

if TYPE_CHECKING:  # the KV event mode's dependencies are an extra: prefixserving[kv-events]
    from prefixserving.router.kv_events.lookup import CachedBlocks
    from prefixserving.router.kv_events.subscriber import KvEventSubscriptions

KeyFunction = Callable[[Mapping[str, Any], prefix_hashing.KeyConfig], prefix_hashing.PrefixKey]
Handler = Callable[[Scope, Receive], Awaitable[ASGIApp | None]]
Backends = tuple[str, ...]
# The answer when no engine takes traffic (503, with Retry-After).
NO_ENGINE_MESSAGE = (
    "no engine replica is ready; retry shortly (check: kubectl get pods -l "
    f"{constants.LABEL_COMPONENT}={constants.COMPONENT_ENGINE})"
)
# The request paths keyed by prefix, and how.
KEYED_PATHS: dict[str, KeyFunction] = {
    "/v1/completions": prefix_hashing.completion_key,
    "/v1/chat/completions": prefix_hashing.chat_key,
}


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Limits and upstream timeouts.

    ``max_body_bytes``: largest request body accepted (16 MiB). ``body_timeout_s``: time
    allowed to receive the body (30 s). ``retry_after_s``: ``Retry-After`` of a 503 (1 s).
    ``connect_timeout_s`` (2 s) and ``read_timeout_s`` (600 s: the longest wait for an answer
    to start, which covers queueing plus prefill of a non-streamed answer, and the longest
    silence of a streamed one, see ``router.proxy``) bound upstream calls.
    ``max_idle_connections``: idle upstream connections kept per backend (256).
    ``no_engine_hold_s``: how long a request waits for a Ready engine when there is none
    (``router.hold``; 0: answer 503 at once).
    """

    max_body_bytes: int = 16 * 1024 * 1024
    body_timeout_s: float = 30.0
    retry_after_s: int = 1
    connect_timeout_s: float = 2.0
    read_timeout_s: float = 600.0
    max_idle_connections: int = 256
    no_engine_hold_s: float = 0.0


class _BadBody(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _ClientGone(Exception):
    """The client disconnected before its request body was complete."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of request header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def _query(scope: Scope) -> dict[str, str]:
    """The query parameters of a request, first value of each."""
    raw = scope["query_string"].decode("latin-1")
    return {name: values[0] for name, values in parse_qs(raw).items()}


class Router:
    """State of one router instance: pool, policy, key config, hygiene, hot prefixes, metrics."""

    def __init__(
        self,
        *,
        pool: BackendPool,
        policy: RoutingPolicy,
        key_config: prefix_hashing.KeyConfig | None = None,
        config: RouterConfig | None = None,
        hygiene: PrefixHygiene | None = None,
        hot: HotPrefixes | None = None,
        kv_events: tuple[KvEventSubscriptions, CachedBlocks] | None = None,
    ) -> None:
        """``kv_events``: the engines' KV cache event subscriptions and the lookup that fills
        ``RoutingContext.cached`` from them (None: the router does not follow the events)."""
        self.pool = pool
        self.policy = policy
        self.key_config = key_config or prefix_hashing.KeyConfig()
        self.config = config or RouterConfig()
        self.hygiene = hygiene or PrefixHygiene()
        self.hot = hot or HotPrefixes(self.key_config)
        self.hold = ReadyHold(pool.healthy, self.config.no_engine_hold_s)
        pool.on_healthy_change = self.hold.healthy_changed
        self.kv_subscriptions, self.cached_blocks = kv_events or (None, None)
        self.metrics = RouterMetrics(pool, self.hygiene, self.hold, self.kv_subscriptions)
        pool.on_eject = lambda url: self.metrics.ejections.inc(url)
        self._rotation = itertools.count()
        self.upstream = UpstreamPool(
            connect_timeout_s=self.config.connect_timeout_s,
            max_idle_per_backend=self.config.max_idle_connections,
        )
        self.proxy = Proxy(self.upstream, pool, self.metrics, self.config.read_timeout_s)

    # Lifecycle ------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Discovery and scraping run for the app's lifetime (on aiohttp: off the request
        path); upstream connections are closed at the end."""
        scrape_session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout_s),
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        await self.pool.refresh(scrape_session)
        if self.kv_subscriptions is not None:
            self.kv_subscriptions.follow(self.pool.members)
            self.pool.on_members_change = self.kv_subscriptions.follow
        task = asyncio.create_task(self.pool.run(scrape_session))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if self.kv_subscriptions is not None:
                self.pool.on_members_change = None
                await self.kv_subscriptions.close()
            await scrape_session.close()
            self.upstream.close()

    # Request handling -----------------------------------------------------------------------

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _BadBody(413, f"request body is over the limit of {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise _BadBody(413, f"request body is over the limit of {limit} bytes")
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError as error:
            raise _BadBody(408, "request body not received in time") from error
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def decide(
        self, key: prefix_hashing.PrefixKey | None, body: Mapping[str, Any], backends: Backends
    ) -> Decision | None:
        """The routing step of one request, shared by the HTTP router and the endpoint picker:
        record ``key`` (None: a request without one) for prefix hygiene and hot prefixes, then
        let the policy decide among ``backends`` with the scraped loads (and, when the router
        follows the engines' KV cache events, their cached depth for ``body``) and count the
        decision. The policy ranks each backend by its routing identity where the pool knows
        one (``router.backends``). None when ``backends`` is empty. Cost: one
        ``policies.base.route`` (plus one ``kv_events.lookup`` when following events)."""
        engine_keys = () if self.cached_blocks is None else self.cached_blocks.keys(body)
        if key is not None:
            self.hygiene.observe(key)
            self.hot.observe(key, body, engine_keys)
        if not backends:
            return None
        blocks = key.blocks if key is not None else ()
        cached = (
            {} if self.cached_blocks is None else self.cached_blocks.depths(engine_keys, backends)
        )
        context = RoutingContext(
            blocks, backends, self.pool.loads(), cached, identities=self.pool.identities()
        )
        decision = route(self.policy, context)
        self.metrics.decisions.inc(self.policy.name, decision.reason.value)
        return decision

    def _no_backend(self) -> Response:
        self.metrics.requests.inc("", "no_backend")
        return error_response(
            503, NO_ENGINE_MESSAGE, headers={"Retry-After": str(self.config.retry_after_s)}
        )

    def _reject(self, status: int, message: str, param: str | None = None) -> Response:
        self.metrics.requests.inc("", "rejected")
        return error_response(status, message, param=param)

    def routed_endpoint(self, key_function: KeyFunction) -> Handler:
        async def endpoint(scope: Scope, receive: Receive) -> ASGIApp | None:
            try:
                raw = await self._read_body(scope, receive)
            except _BadBody as error:
                return self._reject(error.status, str(error))
            except _ClientGone:
                return None
            received_at = time.perf_counter()
            try:
                body = prefix_hashing.parse_body(raw)
                key = key_function(body, self.key_config)
            except prefix_hashing.RequestError as error:
                return self._reject(400, str(error), error.param)
            decision = self.decide(key, body, await self.hold.backends())
            if decision is None:
                return self._no_backend()
            request = UpstreamRequest.of(scope, raw)
            return Exchange(self.proxy, request, decision.candidates, received_at)

        return endpoint

    async def models(self, scope: Scope, _receive: Receive) -> ASGIApp:
        backends = await self.hold.backends()
        if not backends:
            return self._no_backend()
        start = next(self._rotation) % len(backends)
        order = backends[start:] + backends[:start]
        return Exchange(self.proxy, UpstreamRequest.of(scope, b""), order, time.perf_counter())

    async def healthz(self, _scope: Scope, _receive: Receive) -> Response:
        return JSONResponse({"status": "ok"})

    def takes_requests(self) -> bool:
        """A backend takes traffic, or requests are held while none does (scale from zero: the
        router, and the endpoint picker, must stay reachable to receive the request that wakes
        the engines). ``/readyz`` and the picker's gRPC readiness both answer this."""
        return bool(self.pool.healthy()) or self.hold.hold_s > 0

    async def readyz(self, _scope: Scope, _receive: Receive) -> Response:
        """200 when :meth:`takes_requests`, else 503; the body counts the backends."""
        healthy = len(self.pool.healthy())
        body = {"healthy_backends": healthy, "backends": len(self.pool), "held": self.hold.held}
        return JSONResponse(body, status_code=200 if self.takes_requests() else 503)

    async def prometheus(self, _scope: Scope, _receive: Receive) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def hot_prefixes(self, scope: Scope, _receive: Receive) -> Response:
        query = _query(scope)
        raw_limit = query.get("limit", str(DEFAULT_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
            return error_response(400, f"limit must be 1..{MAX_LIMIT}", param="limit")
        limit = int(raw_limit)
        member = query.get("member", "").rstrip("/") or None
        replaces = query.get("replaces", "").rstrip("/") or None
        if replaces is not None and member is None:
            return error_response(
                400, "replaces needs member: add member=http://NEW_IP:PORT", param="replaces"
            )
        backends = list(self.pool.healthy())
        if member is not None:
            depths = None if self.cached_blocks is None else self.cached_blocks.depths
            rows = self.hot.owned_by(
                member,
                backends,
                self.policy,
                limit,
                replaces=replaces,
                cached=depths,
                identities=self.pool.identities(),
            )
        else:
            rows = self.hot.top(limit)
        body = {
            "member": member,
            "replaces": replaces,
            "backends": backends,
            "prefixes": [row.to_json() for row in rows],
        }
        return JSONResponse(body)

    async def hygiene_report(self, _scope: Scope, _receive: Receive) -> Response:
        models = [
            {
                "model": r.model,
                "requests": r.requests,
                "new_first_block_ratio": r.new_ratio,
                "cause": r.cause.value,
                "offset": r.offset,
                "hint": r.hint,
            }
            for r in self.hygiene.report()
        ]
        return JSONResponse({"models": models})


class RouterApp:
    """The ASGI app of a :class:`Router`: exact-path dispatch plus the ASGI lifespan.

    ``routes`` maps a path to its method and handler; a handler returns the ASGI app that
    answers (None when the client already went away). An unknown path answers 404, a wrong
    method 405, both with OpenAI-style error bodies.
    """

    def __init__(self, router: Router, routes: Mapping[str, tuple[str, Handler]]) -> None:
        self.router = router
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"])
        if route is None:
            answer: ASGIApp | None = error_response(404, f"no route {scope['path']}")
        elif scope["method"] != route[0] and not (route[0] == "GET" and scope["method"] == "HEAD"):
            answer = error_response(
                405, f"{scope['path']} takes {route[0]}", headers={"Allow": route[0]}
            )
        else:
            answer = await route[1](scope, receive)
        if answer is not None:
            await answer(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["type"] == "lifespan.startup"
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.router.lifespan())
            except Exception as error:
                await send({"type": "lifespan.startup.failed", "message": repr(error)})
                raise
            await send({"type": "lifespan.startup.complete"})
            message = await receive()
            assert message["type"] == "lifespan.shutdown"
        await send({"type": "lifespan.shutdown.complete"})


def admin_routes(router: Router) -> dict[str, tuple[str, Handler]]:
    """The routes that are not proxied: health, metrics, hot prefixes, hygiene."""
    return {
        "/healthz": ("GET", router.healthz),
        "/readyz": ("GET", router.readyz),
        "/metrics": ("GET", router.prometheus),
        constants.ROUTER_HOT_PREFIXES_PATH: ("GET", router.hot_prefixes),
        constants.ROUTER_HYGIENE_PATH: ("GET", router.hygiene_report),
    }


def build_app(router: Router) -> RouterApp:
    """The ASGI app of ``router``; run it with ``router.server.uvicorn_config``."""
    proxied: dict[str, tuple[str, Handler]] = {
        path: ("POST", router.routed_endpoint(key)) for path, key in KEYED_PATHS.items()
    }
    proxied["/v1/models"] = ("GET", router.models)
    return RouterApp(router, proxied | admin_routes(router))


def build_admin_app(router: Router) -> RouterApp:
    """The HTTP app of the endpoint picker (``router.picker``): the admin routes only; the
    gateway forwards the requests themselves."""
    return RouterApp(router, admin_routes(router))
