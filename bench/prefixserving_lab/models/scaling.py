"""Autoscaling in the cluster simulator: the HPA algorithm on KV-cache and queue signals,
with new replicas that join cold or warmed.

**Setup** (:class:`ScalingSetup`): the bursty conversation workload of
:mod:`prefixserving_lab.workloads.conversations` goes through the router policy (prefix affinity by
default) to a fleet of simulated engines (:mod:`prefixserving_lab.models.fleet`). Every ``sync_s``
(15 s, the HPA controller's sync period) the HPA of :mod:`prefixserving.autoscaling.hpa`
reads, per engine pod that exports metrics, ``vllm:kv_cache_usage_perc`` (the replica's
pinned share of its KV blocks) and ``vllm:num_requests_waiting`` (its queue); pods still
loading have no metrics. It runs with the project's default targets and behaviour (what
``prefixserving render`` puts into the HPA/ScaledObject), on the signal set under test:
``kv`` (KV usage only), ``queue`` (queue only) or ``both`` (the larger proposal). Scrape and
Prometheus rate windows are not modelled: the HPA sees the values at the sync instant.

**Reported per run** (:class:`ScalingOutcome`):

- ``react_s``: from each burst's start to the first sync that scales up (mean over bursts);
  ``capacity_s``: to the first added replica taking traffic (includes load and warm-up);
- ``replica_minutes``: pod time of the run (loading, warming and draining pods included);
- TTFT p50/p99 over all requests and p99 over the requests of the bursts (plus 120 s);
- ``direction_changes``: scale-ups followed by scale-downs or back (flapping), also measured
  with no scale-down stabilization window;
- the cluster's prefix-cache hit rate;
- ``fresh_*``: TTFT p50/p99 and hit rate of the first ``FRESH_REQUESTS`` (100) requests each
  replica added during the run served: what warm-up is for.

Deterministic; cost: one cluster simulation per run (seconds for tens of thousands of requests).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from prefixserving.api.defaults import effective_autoscaling
from prefixserving.api.types import AutoscalingSpec
from prefixserving.autoscaling.hpa import SYNC_PERIOD_S, Autoscaler, HpaSpec, hpa_from_autoscaling
from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import ClusterConfig, ClusterResult, ClusterSim, Outcome, Tick
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow, PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.reports.files import hit_rate, quantile
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape
from prefixserving_lab.workloads.traces import TraceRequest

SIGNAL_SETS: dict[str, tuple[str, ...]] = {
    "kv": ("kvCacheUsage",),
    "queue": ("queueDepth",),
    "both": ("kvCacheUsage", "queueDepth"),
}
_METRICS = {"kvCacheUsage": "kv", "queueDepth": "queue"}
BURST_TAIL_S = 120.0
FRESH_REQUESTS = 100

# A replica with a small KV cache for its concurrency, so KV usage is a live signal:
# 640 blocks of 128 tokens (82k tokens), 64 sequences, about 15k prefill tokens/s.
DEFAULT_SERVICE = ServiceModel(cache_blocks=640, block_tokens=128, max_running=64)


@dataclass(frozen=True, slots=True)
class ScalingSetup:
    """Everything a run depends on besides the signals and warm-up."""

    schedule: BurstSchedule = field(default_factory=BurstSchedule)
    shape: ConversationShape = field(default_factory=ConversationShape)
    service: ServiceModel = DEFAULT_SERVICE
    lifecycle: PodLifecycle = field(default_factory=PodLifecycle)
    min_replicas: int = 2
    max_replicas: int = 16
    policy: str = "prefix-affinity"
    sync_s: float = SYNC_PERIOD_S
    scale_down_window_s: int | None = None  # None: the project's default

    def hpa(self, signals: str) -> HpaSpec:
        behavior = (
            {}
            if self.scale_down_window_s is None
            else {
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": self.scale_down_window_s}}
            }
        )
        spec = AutoscalingSpec.model_validate(
            {
                "enabled": True,
                "backend": "hpa",
                "minReplicas": self.min_replicas,
                "maxReplicas": self.max_replicas,
                "signals": list(SIGNAL_SETS[signals]),
                **behavior,
            }
        )
        return hpa_from_autoscaling(effective_autoscaling(spec), _METRICS)


@dataclass(frozen=True, slots=True)
class SyncRecord:
    time_s: float
    current: int
    desired: int
    ready: int


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
    syncs: tuple[SyncRecord, ...]

    def summary(self) -> dict[str, object]:
        """Every figure except the sync series, rounded for reports."""
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name != "syncs":
                out[name] = _round(value)
        return out


class _Loop:
    """The HPA controller's loop, called on every tick of the cluster simulation."""

    def __init__(self, hpa: Autoscaler, fleet: Fleet, sync_s: float) -> None:
        self.hpa = hpa
        self.fleet = fleet
        self.sync_s = sync_s
        self.next_sync_s = sync_s
        self.syncs: list[SyncRecord] = []
        self.ready_series: list[tuple[float, int]] = []

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.fleet.on_tick(sim, tick)
        live = [s for s in tick.replicas if not s.draining and s.name in self.fleet.pods]
        ready = sum(1 for s in live if s.ready)
        self.ready_series.append((tick.time_s, ready))
        if tick.time_s < self.next_sync_s:
            return
        self.next_sync_s += self.sync_s
        metrics = {"kv": [s.kv_usage for s in live], "queue": [float(s.waiting) for s in live]}
        current = self.fleet.size
        desired = self.hpa.sync(tick.time_s, current, metrics, self.fleet.loading())
        self.syncs.append(SyncRecord(tick.time_s, current, desired, ready))
        self.fleet.scale_to(sim, desired)


def run_scaling(
    requests: Sequence[TraceRequest], setup: ScalingSetup, signals: str, warmup: bool
) -> ScalingOutcome:
    """One simulated run with the HPA on ``signals`` and new replicas warmed or cold."""
    policy = make_policy(setup.policy)
    lifecycle = replace(setup.lifecycle, warmup=warmup)
    hot = HotPrefixWindow(requests, lifecycle.window_s, lifecycle.min_hits)
    fleet = Fleet(lifecycle, policy, setup.service, hot)
    hpa = setup.hpa(signals)
    loop = _Loop(Autoscaler(hpa), fleet, setup.sync_s)
    sim = ClusterSim(policy, ClusterConfig(service=setup.service), on_tick=loop)
    fleet.seed(sim, setup.min_replicas)
    result = sim.run(requests)
    window_s = hpa.behavior.scale_down.stabilization_window_s
    return _outcome(signals, warmup, window_s, setup, loop, fleet, result)


def compare(
    requests: Sequence[TraceRequest],
    setup: ScalingSetup,
    signal_sets: Sequence[str] = tuple(SIGNAL_SETS),
) -> list[ScalingOutcome]:
    """Every signal set, cold and warmed, on the same requests; then every signal set with cold
    replicas and no scale-down stabilization window (what the window does against flapping)."""
    no_window = replace(setup, scale_down_window_s=0)
    return [run_scaling(requests, setup, s, w) for s in signal_sets for w in (False, True)] + [
        run_scaling(requests, no_window, s, False) for s in signal_sets
    ]


def _outcome(
    signals: str,
    warmup: bool,
    window_s: float,
    setup: ScalingSetup,
    loop: _Loop,
    fleet: Fleet,
    result: ClusterResult,
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
        syncs=tuple(loop.syncs),
    )


def _round(value: object) -> object:
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 4)
    return value


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
