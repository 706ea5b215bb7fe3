"""Autoscaling runs in the cluster simulator: the HPA (:mod:`prefixserving_lab.models.scaling`)
on KV-cache, queue and backlog signals, with new replicas that join cold or warmed.

The bursty conversation workload of :mod:`prefixserving_lab.workloads.conversations` goes
through the setup's router policy to the fleet; :func:`compare` runs every signal set cold and
warmed, then without a scale-down stabilization window.

**Reported per run** (:class:`ScalingOutcome`):

- ``react_s``: from each burst's start to the first sync that scales up (mean over bursts);
  ``capacity_s``: to the first added replica taking traffic (includes load and warm-up);
- ``replica_minutes``: pod time of the run (loading, warming and draining pods included);
- TTFT p50/p99 over all requests and p99 over the requests of the bursts (plus 120 s);
- ``direction_changes``: scale-ups followed by scale-downs or back (flapping), also measured
  with no scale-down stabilization window;
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


@dataclass(frozen=True, slots=True)
class ScalingOutcome:
    signals: str
    warmup: bool
    scale_down_window_s: float
    react_s: float | None
    capacity_s: float | None
    replica_minutes: float
    ttft_p50_s: float
    ttft_p99_s: float
    burst_ttft_p99_s: float
    hit_rate: float
    fresh_ttft_p50_s: float
    fresh_ttft_p99_s: float
    fresh_hit_rate: float
    direction_changes: int
    scale_ups: int
    scale_downs: int
    peak_replicas: int
    curve: tuple[CurveBucket, ...]
    syncs: tuple[SyncRecord, ...]

    def summary(self) -> dict[str, object]:
        """Every figure except the sync series, rounded for reports."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "curve":
                out[name] = [b.summary() for b in self.curve]
            elif name != "syncs":
                out[name] = rounded(value)
        return out


def run_scaling(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signals: str,
    warmup: bool,
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> ScalingOutcome:
    """One simulated run with the HPA on ``signals`` and new replicas warmed or cold; the
    added replicas' warm-up curve over ``curve_spec``."""
    policy = make_policy(setup.policy)
    lifecycle = replace(setup.lifecycle, warmup=warmup)
    hot = HotPrefixWindow(requests, lifecycle.window_s, lifecycle.min_hits)
    fleet = Fleet(lifecycle, policy, setup.service, hot)
    hpa = setup.hpa(signals)
    loop = HpaLoop(Autoscaler(hpa), fleet, setup.sync_s)
    sim = ClusterSim(policy, ClusterConfig(service=setup.service), on_tick=loop)
    fleet.seed(sim, setup.min_replicas)
    result = sim.run(requests)
    window_s = hpa.behavior.scale_down.stabilization_window_s
    return _outcome(signals, warmup, window_s, setup, loop, fleet, result, curve_spec)


def compare(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signal_sets: Sequence[str] = tuple(SIGNAL_SETS),
    curve_spec: CurveSpec = DEFAULT_CURVE,
) -> list[ScalingOutcome]:
    """Every signal set, cold and warmed, on the same requests; then every signal set with cold
    replicas and no scale-down stabilization window (what the window does against flapping)."""
    no_window = replace(setup, scale_down_window_s=0)
    return [
        run_scaling(requests, setup, s, w, curve_spec) for s in signal_sets for w in (False, True)
    ] + [run_scaling(requests, no_window, s, False, curve_spec) for s in signal_sets]


def _outcome(
    signals: str,
    warmup: bool,
    window_s: float,
    setup: ScalingSetup,
    loop: HpaLoop,
    fleet: Fleet,
    result: ClusterResult,
    curve_spec: CurveSpec,
) -> ScalingOutcome:
    reacts, capacities = [], []
    for start_s, _end_s in setup.schedule.bursts:
        up = next((s for s in loop.syncs if s.time_s >= start_s and s.desired > s.current), None)
        if up is not None:
            reacts.append(up.time_s - start_s)
        before = next((r for t, r in loop.ready_series if t >= start_s), None)
        if before is not None:
            grown = next((t for t, r in loop.ready_series if t >= start_s and r > before), None)
            if grown is not None:
                capacities.append(grown - start_s)
    directions = [1 if s.desired > s.current else -1 for s in loop.syncs if s.desired != s.current]
    changes = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    burst = [
        o.ttft_s
        for o in result.outcomes
        if o.ttft_s is not None and setup.schedule.in_burst(o.arrival_s, BURST_TAIL_S)
    ]
    fresh = fresh_outcomes(result, fleet.started)
    return ScalingOutcome(
        signals=signals,
        warmup=warmup,
        scale_down_window_s=window_s,
        react_s=sum(reacts) / len(reacts) if reacts else None,
        capacity_s=sum(capacities) / len(capacities) if capacities else None,
        replica_minutes=fleet.pod_seconds / 60.0,
        ttft_p50_s=result.ttft_quantile(0.50),
        ttft_p99_s=result.ttft_quantile(0.99),
        burst_ttft_p99_s=quantile(burst, 0.99),
        hit_rate=result.hit_rate,
        fresh_ttft_p50_s=quantile([o.ttft_s for o in fresh if o.ttft_s is not None], 0.5),
        fresh_ttft_p99_s=quantile([o.ttft_s for o in fresh if o.ttft_s is not None], 0.99),
        fresh_hit_rate=hit_rate(fresh),
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
