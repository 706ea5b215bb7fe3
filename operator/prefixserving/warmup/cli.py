"""``prefixserving warmup``: the warm-up sidecar of an engine pod."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

import click
import uvicorn

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.warmup.events import emit_timeout_event
from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.server import build_app
from prefixserving.warmup.state import WarmupState


@click.command()
@click.option(
    "--engine-url",
    default=f"http://127.0.0.1:{constants.ENGINE_PORT}",
    show_default=True,
    help="The engine in this pod.",
)
@click.option(
    "--prompts-file",
    type=click.Path(path_type=Path),
    default=None,
    help=f"JSON list of {{prompt}} / {{messages}} items (pod: {constants.WARMUP_PROMPTS_FILE}).",
)
@click.option(
    "--router-url",
    default=None,
    help="Router to ask for hot prefixes, e.g. http://pfx-router:8080.",
)
@click.option(
    "--hot-prefixes",
    type=click.IntRange(0, 4096),
    default=defaults.WARMUP_HOT_PREFIXES,
    show_default=True,
    help="Most hot prefixes taken from the router (0: none).",
)
@click.option(
    "--self-url",
    default=None,
    help="This engine as the router lists it, e.g. http://$(POD_IP):8000.",
)
@click.option(
    "--timeout-s",
    type=click.FloatRange(min=0, min_open=True),
    default=float(defaults.WARMUP_TIMEOUT_S),
    show_default=True,
    help="Report Ready after this even if warm-up has not finished.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Prefixes replayed at once.",
)
@click.option(
    "--handover-selector",
    default=None,
    help="Label selector of this Deployment's engine pods, e.g. app.kubernetes.io/instance=pfx,"
    "app.kubernetes.io/component=engine: in a rolling update, claim the old pod this one "
    "replaces and replay its cache (needs list and patch on pods).",
)
@click.option("--model", default=None, help="Served model name (default: the engine's /v1/models).")
@click.option(
    "--host",
    default="0.0.0.0",
    show_default=True,
    help="Address of /readyz, /identity and /metrics.",
)
@click.option("--port", type=int, default=constants.WARMUP_PORT, show_default=True)
def warmup(
    engine_url: str,
    prompts_file: Path | None,
    router_url: str | None,
    hot_prefixes: int,
    self_url: str | None,
    timeout_s: float,
    concurrency: int,
    handover_selector: str | None,
    model: str | None,
    host: str,
    port: int,
) -> None:
    """Prefill this replica's prefix cache, then report Ready on /readyz and keep serving it.

    Run as a native sidecar of the engine container; the pod's readiness probe reads
    http://POD:8090/readyz. Outside Kubernetes, next to an engine on port 8000:
    prefixserving warmup --prompts-file prompts.json --port 8090
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = WarmupConfig(
        engine_url=engine_url.rstrip("/"),
        prompts_file=prompts_file,
        router_url=router_url,
        hot_prefixes=hot_prefixes,
        self_url=self_url.rstrip("/") if self_url else None,
        timeout_s=timeout_s,
        concurrency=concurrency,
        model=model,
        handover_selector=handover_selector,
    )
    asyncio.run(_serve(config, host, port))


async def _serve(config: WarmupConfig, host: str, port: int) -> None:
    """Serve the endpoints until SIGTERM/SIGINT; warm up meanwhile (cancelled on shutdown)."""
    state = WarmupState()
    server = uvicorn.Server(
        uvicorn.Config(build_app(state), host=host, port=port, log_level="warning", lifespan="off")
    )
    warming = asyncio.create_task(run_warmup(config, state, on_timeout=_emit_in_background))
    try:
        await server.serve()
    finally:
        warming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await warming


def _emit_in_background(message: str) -> None:
    threading.Thread(target=emit_timeout_event, args=(message,), daemon=True).start()
