"""Calibrate the replay's cost model (:class:`~prefixserving_lab.models.cost.CostModel`) on a
real vLLM engine.

Measurements, against an OpenAI-compatible engine taking token-id prompts (every prompt is
unique, so nothing hits the prefix cache):

- prefill: one request at a time, ``max_tokens=1``, at each of the plan's prompt lengths
  (:class:`CalibrationPlan`); its latency is one step of ``prefill_tokens = L`` (plus the HTTP
  round trip, which lands in ``base_s``);
- decode: ``B`` concurrent streamed requests (each of the plan's batch sizes) with short
  prompts, and one request with a long prompt; the median gap between streamed tokens after
  the first is one step of ``decode_seqs = B`` and ``context_tokens = B * mean context``.

Requests go through the lab's streaming client (:mod:`prefixserving_lab.runners.client`).

:func:`fit` solves the least-squares problem ``step_s = base_s + prefill_token_s * P +
decode_seq_s * D + context_token_s * C`` over all points in *relative* error (each row is
divided by its measured time, so a 100 s prefill does not drown a 40 ms decode step),
coefficients clamped at zero.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import numpy as np

from prefixserving_lab.models.cost import CostModel, StepShape
from prefixserving_lab.runners.client import RequestResult, send_streaming
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.prompts import COMPLETIONS_PATH, TimedRequest, token_ids


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """What to measure: prefill at ``prefill_lengths``; decode of ``decode_tokens`` tokens at
    ``decode_batches`` concurrent requests with ``decode_prompt``-token prompts, and of one
    request with a ``long_context``-token prompt; ``repeats`` passes of all of it."""

    prefill_lengths: tuple[int, ...] = (256, 1024, 2048, 4096)
    decode_batches: tuple[int, ...] = (1, 4, 16)
    decode_prompt: int = 128
    decode_tokens: int = 48
    long_context: int = 4096
    repeats: int = 1


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


class _Engine:
    """Unique token-id prompts to one engine, through the lab's streaming client."""

    def __init__(self, client: httpx.AsyncClient, url: str, model: str) -> None:
        self.client = client
        self.url = url.rstrip("/")
        self.model = model
        self.rng = random.Random(1234)

    async def send(self, prompt_tokens: int, max_tokens: int) -> RequestResult:
        body = {
            "model": self.model,
            "prompt": token_ids(self.rng, prompt_tokens),
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        result = await send_streaming(
            self.client, self.url, TimedRequest(0.0, COMPLETIONS_PATH, body)
        )
        if not result.ok:
            raise RuntimeError(f"the engine failed a calibration request: {result.error}")
        return result


async def _measure(
    url: str, model: str, plan: CalibrationPlan, log: Callable[[str], None]
) -> list[Point]:
    points = _LoggedPoints(log)
    async with httpx.AsyncClient(timeout=600, trust_env=False) as client:
        engine = _Engine(client, url, model)
        await engine.send(64, 1)  # warm-up
        for _ in range(plan.repeats):
            for n in plan.prefill_lengths:
                result = await engine.send(n, 1)
                points.append(Point("prefill", StepShape(prefill_tokens=n), result.latency_s))
            for batch in plan.decode_batches:
                results = await asyncio.gather(
                    *(engine.send(plan.decode_prompt, plan.decode_tokens) for _ in range(batch))
                )
                gaps = [g for r in results for g in r.token_gaps_s()]
                context = batch * (plan.decode_prompt + plan.decode_tokens // 2)
                shape = StepShape(decode_seqs=batch, context_tokens=context)
                points.append(Point("decode", shape, quantile(gaps, 0.5)))
            result = await engine.send(plan.long_context, plan.decode_tokens)
            context = plan.long_context + plan.decode_tokens // 2
            shape = StepShape(decode_seqs=1, context_tokens=context)
            points.append(Point("long-context decode", shape, quantile(result.token_gaps_s(), 0.5)))
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
    url: str,
    model: str,
    source: str,
    plan: CalibrationPlan | None = None,
    log: Callable[[str], None] = print,
) -> tuple[CostModel, list[dict[str, Any]]]:
    """Measure the engine at ``url`` by ``plan`` (default: :class:`CalibrationPlan`) and fit;
    return the model and the raw points."""
    points = asyncio.run(_measure(url, model, plan or CalibrationPlan(), log))
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
