"""The warm-up itself: wait for the engine, collect prefixes, replay them, then report Ready.

**Algorithm**

1. Poll the engine's ``/health`` every ``poll_interval_s`` until it answers 200.
2. Resolve the handover (``warmup.handover``): with ``handover_selector``, claim the old pod
   this one replaces in a rolling update (none outside one) and take its routing identity;
   without it, or with no claim, the identity is this pod's own (``POD_NAME``). From here
   ``/identity`` answers 200. Collect prefixes: the prompts file
   (``warmup.prompts`` or the ConfigMap), then the router's hot prefixes that this replica will
   own once it joins and the claimed pod leaves (``GET <router>/v1/prefixserving/
   hot-prefixes?member=<self_url>&replaces=<claimed>&limit=<hot_prefixes>``,
   ``router_attempts`` tries one second apart). Equal bodies are replayed once. The served
   model name comes from ``--model`` or the engine's ``/v1/models`` and fills bodies that
   carry none.
3. Replay every prefix through the engine's own OpenAI endpoint (chat through
   ``/v1/chat/completions`` with the same messages, so the engine's chat template renders it
   as it renders client traffic; completions through ``/v1/completions``) with
   ``max_tokens: 1``, at most ``concurrency`` at a time (warm-up must not starve the engine's
   start-up work or look like a load spike).
4. Mark the state finished: ``/readyz`` turns 200.

The whole of steps 1-3 runs under ``timeout_s``: when it expires, the requests in flight are
cancelled (vLLM aborts a request whose client went away), the timeout is counted and logged,
``on_timeout`` is called (a Kubernetes Event in a pod) and the state is finished anyway. A
failing step (bad prompts file, unreachable router, a prefix the engine refuses) is counted
and logged and warm-up goes on; an unexpected error ends warm-up early but still finishes the
state. Nothing here ever blocks Ready past ``timeout_s`` or touches the engine process. When
warm-up ends before step 2 (timeout, unexpected error), step 2 runs right after it, for the
claim and the identity only (the pod is Ready and an old pod goes next all the same).

Cost: one request per distinct prefix (engine time: their prefill), plus with the handover one
pod list and two patches (the claim, this pod's identity).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.warmup.handover import Handover, resolve_handover
from prefixserving.warmup.prompts import (
    WarmupRequest,
    load_prompts_file,
    parse_hot_prefixes,
    unique,
)
from prefixserving.warmup.state import Phase, Stage, WarmupState

log = logging.getLogger("prefixserving.warmup")


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """Parameters of one warm-up (the ``prefixserving warmup`` flags)."""

    engine_url: str
    prompts_file: Path | None = None
    router_url: str | None = None
    hot_prefixes: int = defaults.WARMUP_HOT_PREFIXES
    self_url: str | None = None
    timeout_s: float = float(defaults.WARMUP_TIMEOUT_S)
    concurrency: int = 2
    model: str | None = None
    request_timeout_s: float = 120.0
    poll_interval_s: float = 1.0
    router_attempts: int = 3
    handover_selector: str | None = None

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.concurrency < 1 or self.hot_prefixes < 0:
            raise ValueError("timeout_s must be > 0, concurrency >= 1, hot_prefixes >= 0")


async def run_warmup(
    config: WarmupConfig,
    state: WarmupState,
    *,
    client: httpx.AsyncClient | None = None,
    on_timeout: Callable[[str], None] | None = None,
) -> None:
    """Warm the engine up; always returns with ``state`` finished and its identity resolved
    (see the module docstring)."""
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            timeout = httpx.Timeout(config.request_timeout_s, connect=5.0)
            client = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout))
        try:
            await asyncio.wait_for(_warm(config, state, client), config.timeout_s)
        except TimeoutError:
            message = (
                f"warm-up timed out after {config.timeout_s:g} s in phase {state.phase}: "
                f"{state.warmed} of {state.planned} prefixes warmed, {state.failures} failures; "
                "the pod turns Ready now with a partly warm cache"
            )
            log.warning(message)
            state.finish(timed_out=True)
            if on_timeout is not None:
                on_timeout(message)
        except Exception:
            log.exception("warm-up stopped early on an unexpected error; turning Ready")
        if not state.ready:
            state.finish(timed_out=False)
            log.info("warm-up finished: %s", state.summary())
    if not state.identity_resolved:
        await _hand_over(config, state)


async def _warm(config: WarmupConfig, state: WarmupState, client: httpx.AsyncClient) -> None:
    state.phase = Phase.WAITING_FOR_ENGINE
    await _wait_healthy(client, config)
    state.phase = Phase.COLLECTING
    handover = await _hand_over(config, state)
    routed = await _from_router(client, config, state, handover.replaces)
    requests = unique([*_from_file(config, state), *routed])
    model = config.model or await _served_model(client, config.engine_url)
    state.plan(len(requests))
    state.phase = Phase.WARMING
    log.info("warming %d prefixes (model %s)", len(requests), model)
    slots = asyncio.Semaphore(config.concurrency)

    async def one(request: WarmupRequest) -> None:
        async with slots:
            await _replay(client, config.engine_url, request, model, state)

    await asyncio.gather(*(one(r) for r in requests))


async def _hand_over(config: WarmupConfig, state: WarmupState) -> Handover:
    """Step 2's claim and routing identity (``warmup.handover.resolve_handover``, in a thread:
    the Kubernetes client blocks); the identity is recorded on ``state``."""
    handover = await asyncio.to_thread(resolve_handover, os.environ, config.handover_selector)
    state.set_identity(handover.identity)
    return handover


async def _wait_healthy(client: httpx.AsyncClient, config: WarmupConfig) -> None:
    url = f"{config.engine_url}/health"
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(url, timeout=5.0)).status_code == 200:
                return
        await asyncio.sleep(config.poll_interval_s)


def _from_file(config: WarmupConfig, state: WarmupState) -> list[WarmupRequest]:
    if config.prompts_file is None:
        return []
    requests, problems = load_prompts_file(config.prompts_file)
    for problem in problems:
        log.warning("skipping warm-up prompt: %s", problem)
    if problems:
        state.record_failure(Stage.PROMPTS, len(problems))
    return requests


async def _from_router(
    client: httpx.AsyncClient, config: WarmupConfig, state: WarmupState, replaces: str | None
) -> list[WarmupRequest]:
    if not config.router_url or config.hot_prefixes == 0:
        return []
    if not config.self_url:
        log.warning("no --self-url: cannot ask the router which hot prefixes this replica owns")
        state.record_failure(Stage.ROUTER)
        return []
    url = f"{config.router_url.rstrip('/')}{constants.ROUTER_HOT_PREFIXES_PATH}"
    params = {"member": config.self_url, "limit": str(config.hot_prefixes)}
    if replaces:
        params["replaces"] = replaces
    error = ""
    for attempt in range(config.router_attempts):
        if attempt:
            await asyncio.sleep(1.0)
        try:
            response = await client.get(url, params=params, timeout=10.0)
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
            continue
        if response.status_code != 200:
            error = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        try:
            requests, problems = parse_hot_prefixes(response.json())
        except ValueError as exc:
            requests, problems = [], [f"router answer is not JSON: {exc}"]
        for problem in problems:
            log.warning("skipping hot prefix: %s", problem)
        if problems:
            state.record_failure(Stage.ROUTER, len(problems))
        log.info(
            "router %s: %d hot prefixes owned by %s (replacing %s)",
            url,
            len(requests),
            config.self_url,
            replaces or "none",
        )
        return requests
    log.warning("router %s unreachable after %d tries (%s)", url, config.router_attempts, error)
    state.record_failure(Stage.ROUTER)
    return []


async def _served_model(client: httpx.AsyncClient, engine_url: str) -> str | None:
    try:
        data = (await client.get(f"{engine_url}/v1/models", timeout=10.0)).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        log.warning("cannot read the served model from %s/v1/models", engine_url)
        return None


async def _replay(
    client: httpx.AsyncClient,
    engine_url: str,
    request: WarmupRequest,
    model: str | None,
    state: WarmupState,
) -> None:
    try:
        response = await client.post(f"{engine_url}{request.path}", json=request.payload(model))
    except httpx.HTTPError as exc:
        log.warning("warm-up %s prefix failed: %s: %s", request.kind, type(exc).__name__, exc)
        state.record_failure(Stage.REPLAY)
        return
    tokens = _prompt_tokens(response)
    if response.status_code != 200 or tokens is None:
        log.warning(
            "engine refused a warm-up %s prefix (HTTP %d): %s",
            request.kind,
            response.status_code,
            response.text[:200],
        )
        state.record_failure(Stage.REPLAY)
        return
    state.record_warmed(request.source, tokens)


def _prompt_tokens(response: httpx.Response) -> int | None:
    try:
        tokens = response.json()["usage"]["prompt_tokens"]
    except (ValueError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, int) else None
