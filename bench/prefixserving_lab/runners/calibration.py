"""Calibrate the replay's cost model (:class:`~prefixserving_lab.models.cost.CostModel`) on a
real vLLM engine.

Measurements, against an OpenAI-compatible engine taking token-id prompts (every prompt is
unique, so nothing hits the prefix cache):

- prefill: one request at a time, ``max_tokens=1``, prompt lengths ``PREFILL_LENGTHS``; the
  latency is one step of ``prefill_tokens = L`` (plus the HTTP round trip, which lands in
  ``base_s``);
- decode: ``B`` concurrent streamed requests (``DECODE_BATCHES``) with short prompts, and one
  request with a long prompt (``LONG_CONTEXT``); the mean gap between streamed tokens after
  the first is one step of ``decode_seqs = B`` and ``context_tokens = B * mean context``.

:func:`fit` solves the least-squares problem ``step_s = base_s + prefill_token_s * P +
decode_seq_s * D + context_token_s * C`` over all points in *relative* error (each row is
divided by its measured time, so a 100 s prefill does not drown a 40 ms decode step),
coefficients clamped at zero.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import numpy as np

from prefixserving_lab.models.cost import CostModel, StepShape

PREFILL_LENGTHS = (256, 1024, 2048, 4096)
DECODE_BATCHES = (1, 4, 16)
DECODE_PROMPT = 128
DECODE_TOKENS = 48
LONG_CONTEXT = 4096
REPEATS = 1
VOCAB = 32000


@dataclass(frozen=True, slots=True)
class Point:
    """One measured step: its shape and its duration in seconds."""

    kind: str
    shape: StepShape
    step_s: float


def fit(points: Sequence[Point], source: str) -> CostModel:
    """Least-squares fit of the four coefficients over ``points``, in relative error,
    clamped at zero (module docstring)."""
    rows = [
        [1.0, p.shape.prefill_tokens, p.shape.decode_seqs, p.shape.context_tokens] for p in points
    ]
    weights = np.asarray([1.0 / max(p.step_s, 1e-9) for p in points])
    target = np.ones(len(points))
    coef, *_ = np.linalg.lstsq(np.asarray(rows) * weights[:, None], target, rcond=None)
    base, prefill, decode, context = (max(0.0, float(c)) for c in coef)
    return CostModel(base, prefill, decode, context, source=source)


class _Client:
    def __init__(self, url: str, model: str) -> None:
        self.url = url.rstrip("/") + "/v1/completions"
        self.model = model
        self.rng = random.Random(1234)

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(1, VOCAB) for _ in range(n)]

    async def latency_s(self, client: httpx.AsyncClient, n: int) -> float:
        body = {"model": self.model, "prompt": self.prompt(n), "max_tokens": 1, "ignore_eos": True}
        start = time.perf_counter()
        response = await client.post(self.url, json=body)
        response.raise_for_status()
        return time.perf_counter() - start

    async def token_gaps_s(self, client: httpx.AsyncClient, n: int, tokens: int) -> list[float]:
        body = {
            "model": self.model,
            "prompt": self.prompt(n),
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
        stamps: list[float] = []
        async with client.stream("POST", self.url, json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    stamps.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(stamps[1:])]


async def _measure(url: str, model: str, log: Callable[[str], None]) -> list[Point]:
    c = _Client(url, model)
    points = _LoggedPoints(log)
    async with httpx.AsyncClient(timeout=600) as client:
        await c.latency_s(client, 64)  # warm-up
        for _ in range(REPEATS):
            for n in PREFILL_LENGTHS:
                points.append(
                    Point("prefill", StepShape(prefill_tokens=n), await c.latency_s(client, n))
                )
            for batch in DECODE_BATCHES:
                gaps_per_request = await asyncio.gather(
                    *(c.token_gaps_s(client, DECODE_PROMPT, DECODE_TOKENS) for _ in range(batch))
                )
                gaps = [g for per in gaps_per_request for g in per]
                context = batch * (DECODE_PROMPT + DECODE_TOKENS // 2)
                shape = StepShape(decode_seqs=batch, context_tokens=context)
                points.append(Point("decode", shape, float(np.median(gaps))))
            gaps = await c.token_gaps_s(client, LONG_CONTEXT, DECODE_TOKENS)
            shape = StepShape(decode_seqs=1, context_tokens=LONG_CONTEXT + DECODE_TOKENS // 2)
            points.append(Point("long-context decode", shape, float(np.median(gaps))))
    return list(points)


class _LoggedPoints(list[Point]):
    """A list of points that logs each one as it is measured (long runs show progress)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__()
        self.log = log

    def append(self, point: Point) -> None:
        super().append(point)
        self.log(f"{point.kind}: {point.shape} -> {point.step_s:.4f} s")


def points_from_json(raw: Sequence[dict[str, Any]]) -> list[Point]:
    """Points back from the ``points`` list a calibration wrote (to refit them)."""
    return [
        Point(
            str(r["kind"]),
            StepShape(int(r["prefill_tokens"]), int(r["decode_seqs"]), int(r["context_tokens"])),
            float(r["step_s"]),
        )
        for r in raw
    ]


def calibrate(
    url: str, model: str, source: str, log: Callable[[str], None] = print
) -> tuple[CostModel, list[dict[str, Any]]]:
    """Measure the engine at ``url`` and fit; return the model and the raw points."""
    points = asyncio.run(_measure(url, model, log))
    model_fit = fit(points, source)
    raw = [
        {
            "kind": p.kind,
            **asdict(p.shape),
            "step_s": round(p.step_s, 6),
            "fit_s": round(model_fit.step_s(p.shape), 6),
        }
        for p in points
    ]
    return model_fit, raw
