"""HTTP endpoints of the warm-up sidecar (the engine pod's readiness comes from here).

- ``GET /readyz``: 503 until warm-up finished or timed out, then 200; the body is the progress
  summary (phase, planned, warmed, tokens, failures, duration) as JSON.
- ``GET /healthz``: always 200 while the process runs (the sidecar's liveness).
- ``GET /metrics``: the counters of :mod:`prefixserving.warmup.state`, Prometheus text format.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prefixserving.warmup.state import WarmupState


def build_app(state: WarmupState) -> Starlette:
    """The sidecar's app over one warm-up ``state``."""

    async def readyz(_request: Request) -> Response:
        return JSONResponse(state.summary(), status_code=200 if state.ready else 503)

    async def healthz(_request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(_request: Request) -> Response:
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/readyz", readyz, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
