"""HTTP endpoints of the warm-up sidecar (the engine pod's readiness comes from here).

- ``GET /readyz``: 503 until warm-up finished or timed out, then 200; the body is the progress
  summary (phase, planned, warmed, tokens, failures, duration) as JSON.
- ``GET /identity``: ``{"identity": "<id>"}``, this pod's routing identity (``warmup.handover``:
  the one of the pod it replaced, else its own name; null outside a pod), 200 once resolved
  (before warm-up asks the router for hot prefixes, or right after a warm-up that ended first),
  503 with ``{"identity": null}`` until then. A router started with ``--identity-port`` hashes
  it instead of the engine URL.
- ``GET /healthz``: always 200 while the process runs (the sidecar's liveness).
- ``GET /metrics``: the counters of :mod:`prefixserving.warmup.state`, Prometheus text format.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixserving import constants
from prefixserving.warmup.state import WarmupState


def build_app(state: WarmupState) -> Starlette:
    """The sidecar's app over one warm-up ``state``."""

    async def readyz(_request: Request) -> Response:
        return JSONResponse(state.summary(), status_code=200 if state.ready else 503)

    async def identity(_request: Request) -> Response:
        status = 200 if state.identity_resolved else 503
        return JSONResponse({"identity": state.identity}, status_code=status)

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/readyz", readyz, methods=["GET"]),
            Route(constants.WARMUP_IDENTITY_PATH, identity, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
