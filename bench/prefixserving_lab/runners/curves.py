"""Warm-up curves: TTFT and hit rate per interval over the first minutes after an event.

**Algorithm** (:func:`curve`): every request gets an age, its arrival minus the time of the
event it follows; requests aged ``[0, span_s)`` go into ``bucket_s`` buckets by age (bucket
``k`` holds ``[k * bucket_s, (k + 1) * bucket_s)``, the last one cut at ``span_s``); per bucket
the request count, TTFT p50 and p99 of the served ones (:func:`prefixserving_lab.stats.quantile`)
and the prefix-cache hit rate (:func:`prefixserving_lab.models.cluster.hit_rate`). Empty
buckets stay in the series, with NaN figures, so every curve of one spec has the same rows.

Two ways to age requests:

- :func:`ages_since_first_request`, for a scale-out: each new replica's requests from that
  replica's own first request (a warmed replica takes its first request later, after its
  warm-up, so this compares cold and warmed replicas at the same age of serving; a scale-up
  decision time would charge the warm-up to the warmed curve as an empty start);
- :func:`ages_since`, for a rolling update: every request of the fleet from one instant (the
  rollout's start).

Cost: O(n log n) for n outcomes (the quantiles' sorts).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixserving_lab.models.cluster import Outcome, hit_rate
from prefixserving_lab.reports.files import rounded
from prefixserving_lab.stats import quantile

DEFAULT_SPAN_S = 600.0
DEFAULT_BUCKET_S = 30.0


@dataclass(frozen=True, slots=True)
class CurveSpec:
    """The curve's length (``span_s``) and its interval (``bucket_s``), in seconds."""

    span_s: float = DEFAULT_SPAN_S
    bucket_s: float = DEFAULT_BUCKET_S

    def __post_init__(self) -> None:
        if not 0 < self.bucket_s <= self.span_s:
            raise ValueError(
                f"need 0 < bucket_s <= span_s, got bucket_s={self.bucket_s}, span_s={self.span_s}"
            )

    @property
    def buckets(self) -> int:
        return math.ceil(self.span_s / self.bucket_s)


@dataclass(frozen=True, slots=True)
class CurveBucket:
    """The requests aged ``[start_s, end_s)`` after the event."""

    start_s: float
    end_s: float
    requests: int
    ttft_p50_s: float
    ttft_p99_s: float
    hit_rate: float

    def summary(self) -> dict[str, object]:
        """The figures rounded for the JSON (NaN as None)."""
        return {name: rounded(getattr(self, name)) for name in self.__dataclass_fields__}

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> CurveBucket:
        """A bucket read back from :meth:`summary` (None as NaN)."""
        return cls(**{k: math.nan if v is None else v for k, v in summary.items()})


DEFAULT_CURVE = CurveSpec()


def curve(aged: Iterable[tuple[float, Outcome]], spec: CurveSpec) -> tuple[CurveBucket, ...]:
    """``aged`` (age in seconds, outcome) bucketed by age (module docstring)."""
    grouped: list[list[Outcome]] = [[] for _ in range(spec.buckets)]
    for age_s, outcome in aged:
        if 0 <= age_s < spec.span_s:
            grouped[int(age_s // spec.bucket_s)].append(outcome)
    out = []
    for index, outcomes in enumerate(grouped):
        ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
        out.append(
            CurveBucket(
                start_s=index * spec.bucket_s,
                end_s=min((index + 1) * spec.bucket_s, spec.span_s),
                requests=len(outcomes),
                ttft_p50_s=quantile(ttfts, 0.5),
                ttft_p99_s=quantile(ttfts, 0.99),
                hit_rate=hit_rate(outcomes),
            )
        )
    return tuple(out)


def ages_since(outcomes: Iterable[Outcome], event_s: float) -> list[tuple[float, Outcome]]:
    """Every outcome aged from ``event_s``."""
    return [(o.arrival_s - event_s, o) for o in outcomes]


def ages_since_first_request(
    outcomes: Iterable[Outcome], replicas: Sequence[str]
) -> list[tuple[float, Outcome]]:
    """The outcomes routed to ``replicas``, each aged from its replica's first arrival."""
    wanted = set(replicas)
    mine = sorted((o for o in outcomes if o.backend in wanted), key=lambda o: o.arrival_s)
    first: dict[str | None, float] = {}
    return [(o.arrival_s - first.setdefault(o.backend, o.arrival_s), o) for o in mine]
