"""Autoscaling runs in the cluster simulator: the HPA (:mod:`prefixserving_lab.models.scaling`)
on KV-cache, queue and backlog signals, held siblings counted or not, with new replicas that
join cold or warmed.

A workload (the bursty conversations of :mod:`prefixserving_lab.workloads.conversations`, the
shared-prefix bursts of :mod:`prefixserving_lab.workloads.prefix_bursts`) goes through the
setup's router policy to the fleet. :func:`matrix` runs every signal set with held siblings not
counted (honest) and counted (the stock gauges; ``kv`` once, held siblings pin no KV blocks);
:func:`warmup_pair` runs one signal set cold and warmed; :func:`without_window` every signal set
without a scale-down stabilization window.

**Reported per run** (:class:`ScalingOutcome`):

- ``react_s``: from each burst's start to the first sync within the burst (plus
  ``BURST_TAIL_S``) that scales up, mean over the bursts that scaled; ``react_by_kind``: the
  same per burst kind, ``None`` for a kind none of whose bursts scaled out; ``capacity_s``: to
  the first added replica taking traffic within the same span (includes load and warm-up);
- ``replica_minutes``: pod time of the run (loading, warming and draining pods included);
- TTFT p50/p99 over all requests and p99 over the requests of the bursts (plus 120 s);
- ``flaps``: scale-downs undone (followed by a scale-up) within ``FLAP_S`` (10 minutes);
  ``direction_changes``: scale-ups followed by scale-downs or back;
- the cluster's prefix-cache hit rate;
- ``fresh_*``: TTFT p50/p99 and hit rate of the first ``FRESH_REQUESTS`` (100) requests each
  replica added during the run served: what warm-up is for;
- ``curve``: the warm-up curve of the added replicas (:mod:`prefixserving_lab.runners.curves`):
  TTFT p50/p99 and hit rate per interval, each replica's requests aged from its own first
  request.

Deterministic; cost: one cluster simulation per run (seconds for tens of thousands of requests).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from prefixserving.autoscaling.hpa import Autoscaler
from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import (
    ClusterConfig,
    ClusterResult,
    ClusterSim,
    Outcome,
    hit_rate,
)
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow
from prefixserving_lab.models.scaling import SIGNAL_SETS, HpaLoop, ScalingSetup, SyncRecord
from prefixserving_lab.reports.files import rounded
from prefixserving_lab.runners.curves import (
    DEFAULT_CURVE,
    CurveBucket,
    CurveSpec,
    ages_since_first_request,
    curve,
)
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.traces import TraceRequest

BURST_TAIL_S = 120.0
FRESH_REQUESTS = 100
FLAP_S = 600.0


@dataclass(frozen=True, slots=True)
class ScalingOutcome:
    signals: str
    held_counted: bool
    backlog_target_s: float | None
    warmup: bool
    scale_down_window_s: float
    react_s: float | None
    react_by_kind: dict[str, float | None]
    capacity_s: float | None
    replica_minutes: float
    ttft_p50_s: float
    ttft_p99_s: float
    burst_ttft_p99_s: float
    hit_rate: float
    fresh_ttft_p50_s: float
    fresh_ttft_p99_s: float
    fresh_hit_rate: float
    flaps: int
    direction_changes: int
    scale_ups: int
    scale_downs: int
    peak_replicas: int
    curve: tuple[CurveBucket, ...]
    syncs: tuple[SyncRecord, ...]

    @property
    def label(self) -> str:
        """The signal set, ``+held`` where held siblings were counted, the backlog target where
        it is not the project's default."""
        label = f"{self.signals}+held" if self.held_counted else self.signals
        if self.backlog_target_s is not None:
            label += f" (backlog target {self.backlog_target_s:g} s)"
        return label

    def summary(self) -> dict[str, object]:
        """Every figure except the sync series, rounded for reports."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "curve":
                out[name] = [b.summary() for b in self.curve]
            elif name == "react_by_kind":
                out[name] = {k: rounded(v) for k, v in self.react_by_kind.items()}
            elif name != "syncs":
                out[name] = rounded(value)
        return out


@dataclass(frozen=True, slots=True)
class WorkloadRuns:
    """The runs of one workload: its name, a one-sentence description (markdown), the setup
    (bursts and replica bounds included) and request count."""

    name: str
    description: str
    setup: ScalingSetup
    requests: int
    outcomes: tuple[ScalingOutcome, ...]


def run_scaling(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signals: str,
    warmup: bool,
    curve_spec: CurveSpec = DEFAULT_CURVE,
    held_counted: bool = False,
) -> ScalingOutcome:
    """One simulated run with the HPA on ``signals`` (held siblings counted or not) and new
    replicas warmed or cold; the added replicas' warm-up curve over ``curve_spec``."""
    policy = make_policy(setup.policy)
    lifecycle = replace(setup.lifecycle, warmup=warmup)
    hot = HotPrefixWindow(requests, lifecycle.window_s, lifecycle.min_hits)
    fleet = Fleet(lifecycle, policy, setup.service, hot)
    hpa = setup.hpa(signals)
    loop = HpaLoop(Autoscaler(hpa), fleet, setup.sync_s, held_counted)
    sim = ClusterSim(policy, ClusterConfig(service=setup.service), on_tick=loop)
    fleet.seed(sim, setup.min_replicas)
    result = sim.run(requests)
    window_s = hpa.behavior.scale_down.stabilization_window_s
    return _outcome(signals, held_counted, warmup, window_s, setup, loop, fleet, result, curve_spec)


def matrix(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signal_sets: Sequence[str] = tuple(SIGNAL_SETS),
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> list[ScalingOutcome]:
    """Every signal set with warmed new replicas (the project's default), held siblings not
    counted and counted; a signal set without queue or backlog (``kv``) once."""
    return [
        run_scaling(requests, setup, s, True, curve_spec, held)
        for s in signal_sets
        for held in ((False, True) if set(SIGNAL_SETS[s]) - {"kvCacheUsage"} else (False,))
    ]


def warmup_pair(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signals: str,
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> list[ScalingOutcome]:
    """``signals`` (held siblings not counted) with cold and with warmed new replicas."""
    return [run_scaling(requests, setup, signals, w, curve_spec) for w in (False, True)]


def target_sweep(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    backlog_targets_s: Sequence[float],
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> list[ScalingOutcome]:
    """``backlog`` alone (warmed, held siblings not counted) at each of ``backlog_targets_s``."""
    return [
        run_scaling(requests, replace(setup, backlog_target_s=t), "backlog", True, curve_spec)
        for t in backlog_targets_s
    ]


def without_window(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signal_sets: Sequence[str] = tuple(SIGNAL_SETS),
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> list[ScalingOutcome]:
    """Every signal set (warmed, held siblings not counted) with no scale-down stabilization
    window: what the window does against flapping."""
    no_window = replace(setup, scale_down_window_s=0)
    return [run_scaling(requests, no_window, s, True, curve_spec) for s in signal_sets]


def _outcome(
    signals: str,
    held_counted: bool,
    warmup: bool,
    window_s: float,
    setup: ScalingSetup,
    loop: HpaLoop,
    fleet: Fleet,
    result: ClusterResult,
    curve_spec: CurveSpec,
) -> ScalingOutcome:
    reacts, capacities = [], []
    by_kind: dict[str, list[float]] = {}
    for burst in setup.burst_windows():
        start_s = burst.start_s
        up = next(
            (
                s
                for s in loop.syncs
                if start_s <= s.time_s < burst.end_s + BURST_TAIL_S and s.desired > s.current
            ),
            None,
        )
        by_kind.setdefault(burst.kind, [])
        if up is not None:
            reacts.append(up.time_s - start_s)
            by_kind[burst.kind].append(up.time_s - start_s)
        before = next((r for t, r in loop.ready_series if t >= start_s), None)
        if before is not None:
            grown = next(
                (
                    t
                    for t, r in loop.ready_series
                    if start_s <= t < burst.end_s + BURST_TAIL_S and r > before
                ),
                None,
            )
            if grown is not None:
                capacities.append(grown - start_s)
    directions = [1 if s.desired > s.current else -1 for s in loop.syncs if s.desired != s.current]
    changes = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    burst = [
        o.ttft_s
        for o in result.outcomes
        if o.ttft_s is not None and setup.in_burst(o.arrival_s, BURST_TAIL_S)
    ]
    fresh = fresh_outcomes(result, fleet.started)
    return ScalingOutcome(
        signals=signals,
        held_counted=held_counted,
        backlog_target_s=setup.backlog_target_s,
        warmup=warmup,
        scale_down_window_s=window_s,
        react_s=_mean(reacts),
        react_by_kind={k: _mean(v) for k, v in by_kind.items()},
        capacity_s=sum(capacities) / len(capacities) if capacities else None,
        replica_minutes=fleet.pod_seconds / 60.0,
        ttft_p50_s=result.ttft_quantile(0.50),
        ttft_p99_s=result.ttft_quantile(0.99),
        burst_ttft_p99_s=quantile(burst, 0.99),
        hit_rate=result.hit_rate,
        fresh_ttft_p50_s=quantile([o.ttft_s for o in fresh if o.ttft_s is not None], 0.5),
        fresh_ttft_p99_s=quantile([o.ttft_s for o in fresh if o.ttft_s is not None], 0.99),
        fresh_hit_rate=hit_rate(fresh),
        flaps=flaps(loop.syncs),
        direction_changes=changes,
        scale_ups=directions.count(1),
        scale_downs=directions.count(-1),
        peak_replicas=max((s.desired for s in loop.syncs), default=setup.min_replicas),
        curve=curve(ages_since_first_request(result.outcomes, fleet.started), curve_spec),
        syncs=tuple(loop.syncs),
    )


def fresh_outcomes(
    result: ClusterResult, replicas: Sequence[str], first: int = FRESH_REQUESTS
) -> list[Outcome]:
    """The first ``first`` requests (by arrival) each of ``replicas`` served."""
    wanted = set(replicas)
    taken: Counter[str] = Counter()
    out = []
    for outcome in sorted(result.outcomes, key=lambda o: (o.arrival_s, o.index)):
        if outcome.backend in wanted and taken[outcome.backend] < first:
            taken[outcome.backend] += 1
            out.append(outcome)
    return out


def flaps(syncs: Sequence[SyncRecord], within_s: float = FLAP_S) -> int:
    """Scale-downs followed by a scale-up within ``within_s``."""
    ups = [s.time_s for s in syncs if s.desired > s.current]
    return sum(
        1
        for s in syncs
        if s.desired < s.current and any(s.time_s < t <= s.time_s + within_s for t in ups)
    )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
