"""TTFT during a rolling update (:mod:`prefixserving_lab.models.rollout`), with and without
warm-up of the new pods.

:func:`compare` runs the same traffic three times: ``steady`` (no rollout), ``cold`` and
``warmed`` new pods. **Reported** (:class:`RolloutOutcome`): rollout duration, TTFT p50/p99
and hit rate of the requests that arrived during the rollout, and the same window in the
steady run for reference; the warm-up curve of the whole fleet
(:mod:`prefixserving_lab.runners.curves`): TTFT p50/p99 and hit rate per interval of the
requests aged from the rollout's start (the same instant in the steady run).

Deterministic; cost: one cluster simulation per run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import ClusterConfig, ClusterResult, ClusterSim, hit_rate
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow
from prefixserving_lab.models.rollout import RollingUpdate, RolloutSetup
from prefixserving_lab.reports.files import rounded
from prefixserving_lab.runners.curves import (
    DEFAULT_CURVE,
    CurveBucket,
    CurveSpec,
    ages_since,
    curve,
)
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.traces import TraceRequest

MODES = ("steady", "cold", "warmed")


@dataclass(frozen=True, slots=True)
class RolloutOutcome:
    """``mode``: steady (no rollout), cold or warmed new pods; ``window_s``: the arrivals
    measured (the same for the three modes)."""

    mode: str
    window_s: tuple[float, float]
    rollout_s: float | None
    ttft_p50_s: float
    ttft_p99_s: float
    hit_rate: float
    requests: int
    curve: tuple[CurveBucket, ...]

    def summary(self) -> dict[str, object]:
        """Every figure rounded for reports, the curve as one dict per bucket."""
        out = {name: rounded(getattr(self, name)) for name in self.__dataclass_fields__}
        out["curve"] = [b.summary() for b in self.curve]
        return out


@dataclass(frozen=True, slots=True)
class RolloutRun:
    """One simulated run: rollout duration (None: no rollout or unfinished), the cluster
    result and the pods the rollout started."""

    duration_s: float | None
    result: ClusterResult
    new_pods: tuple[str, ...]


def run_rollout(requests: Sequence[TraceRequest], setup: RolloutSetup, mode: str) -> RolloutRun:
    """One run in ``mode`` (steady, cold or warmed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    policy = make_policy(setup.policy)
    lifecycle = replace(setup.lifecycle, warmup=mode == "warmed")
    hot = HotPrefixWindow(requests, lifecycle.window_s, lifecycle.min_hits)
    fleet = Fleet(lifecycle, policy, setup.service, hot)
    rollout = RollingUpdate(fleet, None if mode == "steady" else setup.start_s)
    sim = ClusterSim(policy, ClusterConfig(service=setup.service), on_tick=rollout)
    fleet.seed(sim, setup.replicas)
    result = sim.run(requests)
    duration = None if rollout.finished_s is None else rollout.finished_s - setup.start_s
    return RolloutRun(duration, result, tuple(fleet.started))


def compare(
    requests: Sequence[TraceRequest], setup: RolloutSetup, curve_spec: CurveSpec = DEFAULT_CURVE
) -> list[RolloutOutcome]:
    """Steady, cold and warmed runs, all measured over the same window: from the rollout's
    start to the end of the longer of the two rollouts; each with its curve over
    ``curve_spec`` from the rollout's start."""
    runs = {mode: run_rollout(requests, setup, mode) for mode in MODES}
    durations = [runs[mode].duration_s for mode in ("cold", "warmed")]
    if any(d is None for d in durations):
        raise ValueError("the rollout did not finish before the traffic ended: lower --start-s")
    window = (setup.start_s, setup.start_s + max(d for d in durations if d is not None))
    out = []
    for mode, run in runs.items():
        inside = [o for o in run.result.outcomes if window[0] <= o.arrival_s < window[1]]
        ttfts = [o.ttft_s for o in inside if o.ttft_s is not None]
        out.append(
            RolloutOutcome(
                mode,
                window,
                run.duration_s,
                quantile(ttfts, 0.5),
                quantile(ttfts, 0.99),
                hit_rate(inside),
                len(inside),
                curve(ages_since(run.result.outcomes, setup.start_s), curve_spec),
            )
        )
    return out
