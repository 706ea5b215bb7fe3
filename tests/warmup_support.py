"""A fake engine for warm-up tests: answers with ``usage`` like vLLM, can be slow or refuse."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


@dataclass
class UsageEngine:
    """``delay_s``: time before each completion answers. ``healthy``: /health status.
    ``refuse_containing``: prompts/messages containing this text answer 400.
    ``received``: (path, body) in arrival order. ``aborted``: requests whose client went away
    while they were delayed (vLLM aborts those)."""

    model: str = "fake-model"
    delay_s: float = 0.0
    healthy: bool = True
    refuse_containing: str | None = None
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    aborted: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/completions", self._completion, methods=["POST"]),
                Route("/v1/chat/completions", self._completion, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/health", self._health, methods=["GET"]),
            ]
        )

    async def _completion(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.received.append((request.url.path, body))
        # A slow engine (the condition the warm-up tests need): answer after delay_s, unless
        # the client goes away first.
        deadline = time.monotonic() + self.delay_s
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                self.aborted += 1
                return Response(status_code=499)
            await asyncio.sleep(0.05)
        text = json.dumps(body.get("messages") or body.get("prompt"))
        if self.refuse_containing and self.refuse_containing in text:
            return JSONResponse({"error": {"message": "refused", "code": 400}}, 400)
        tokens = len(text.split())
        return JSONResponse(
            {
                "choices": [{"text": "x"}],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens + 1},
            }
        )

    async def _models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.model}]})

    async def _health(self, _request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)
