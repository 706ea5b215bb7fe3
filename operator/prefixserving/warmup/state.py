"""Progress and metrics of one warm-up, served at ``/readyz`` and ``/metrics``, and this pod's
routing identity, served at ``/identity`` (``warmup.handover``).

==========================================================  ======================================
``prefixserving_warmup_ready``                              1 once warm-up finished or timed out
``prefixserving_warmup_prefixes_planned``                   prefixes collected (file + router)
``prefixserving_warmup_prefixes_warmed_total``              source (file, router): replayed, 200
``prefixserving_warmup_tokens_warmed_total``                prompt tokens of the warmed prefixes
                                                            (``usage.prompt_tokens``)
``prefixserving_warmup_failures_total``                     stage (prompts, router, replay)
``prefixserving_warmup_timeouts_total``                     1 when ``--timeout-s`` cut warm-up short
``prefixserving_warmup_duration_seconds``                   start to Ready (grows until then)
==========================================================  ======================================
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from prefixserving import constants


class Phase(enum.StrEnum):
    WAITING_FOR_ENGINE = "waiting_for_engine"
    COLLECTING = "collecting"
    WARMING = "warming"
    DONE = "done"
    TIMED_OUT = "timed_out"


class Stage(enum.StrEnum):
    """Where a failure happened (the ``stage`` label)."""

    PROMPTS = "prompts"  # the prompts file or one of its items
    ROUTER = "router"  # the hot-prefix endpoint
    REPLAY = "replay"  # the engine refused or failed one prefix


@dataclass
class WarmupState:
    """Counters of one warm-up and the Prometheus registry exporting them."""

    clock: Callable[[], float] = time.monotonic
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    phase: Phase = Phase.WAITING_FOR_ENGINE
    planned: int = 0
    warmed: int = 0
    tokens_warmed: int = 0
    failures: int = 0
    timed_out: bool = False
    identity: str | None = None
    identity_resolved: bool = False

    def __post_init__(self) -> None:
        self.started_s = self.clock()
        self.finished_s: float | None = None
        r = self.registry
        self._ready = Gauge(
            constants.METRIC_WARMUP_READY, "1 once warm-up finished or timed out.", registry=r
        )
        self._planned = Gauge(
            constants.METRIC_WARMUP_PREFIXES_PLANNED, "Prefixes collected for warm-up.", registry=r
        )
        # prometheus_client exposes a counter as NAME_total whether or not NAME ends with it.
        self._warmed = Counter(
            constants.METRIC_WARMUP_PREFIXES_WARMED,
            "Prefixes replayed successfully.",
            ["source"],
            registry=r,
        )
        self._tokens = Counter(
            constants.METRIC_WARMUP_TOKENS_WARMED,
            "Prompt tokens of the warmed prefixes.",
            registry=r,
        )
        self._failures = Counter(
            constants.METRIC_WARMUP_FAILURES, "Failed warm-up steps.", ["stage"], registry=r
        )
        self._timeouts = Counter(
            constants.METRIC_WARMUP_TIMEOUTS, "Warm-ups cut short by the timeout.", registry=r
        )
        duration = Gauge(constants.METRIC_WARMUP_DURATION, "Warm-up start to Ready.", registry=r)
        duration.set_function(self.duration_s)
        for source in ("file", "router"):
            self._warmed.labels(source)
        for stage in Stage:
            self._failures.labels(stage.value)

    @property
    def ready(self) -> bool:
        return self.finished_s is not None

    def duration_s(self) -> float:
        end = self.finished_s if self.finished_s is not None else self.clock()
        return end - self.started_s

    def plan(self, count: int) -> None:
        self.planned = count
        self._planned.set(count)

    def record_warmed(self, source: str, prompt_tokens: int) -> None:
        self.warmed += 1
        self.tokens_warmed += prompt_tokens
        self._warmed.labels(source).inc()
        self._tokens.inc(prompt_tokens)

    def record_failure(self, stage: Stage, count: int = 1) -> None:
        self.failures += count
        self._failures.labels(stage.value).inc(count)

    def set_identity(self, identity: str | None) -> None:
        """Record this pod's routing identity (None outside a pod); ``/identity`` answers 200."""
        self.identity = identity
        self.identity_resolved = True

    def finish(self, *, timed_out: bool) -> None:
        """Mark warm-up over (the pod may turn Ready); only the first call counts."""
        if self.finished_s is not None:
            return
        self.finished_s = self.clock()
        self.timed_out = timed_out
        self.phase = Phase.TIMED_OUT if timed_out else Phase.DONE
        if timed_out:
            self._timeouts.inc()
        self._ready.set(1)

    def summary(self) -> dict[str, object]:
        return {
            "phase": str(self.phase),
            "ready": self.ready,
            "planned": self.planned,
            "warmed": self.warmed,
            "tokens_warmed": self.tokens_warmed,
            "failures": self.failures,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s(), 3),
        }
