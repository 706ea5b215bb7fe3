"""A rolling update in the cluster simulator: TTFT while every engine pod is replaced, with and
without warm-up of the new pods.

**Rollout** (a Deployment with ``maxSurge: 1``, ``maxUnavailable: 0``, as the operator
renders it): at ``start_s`` one new pod starts; when it is Ready one old pod is removed (it
drains what it holds) and, the terminating pod no longer counting, the next new pod starts at
once; this repeats until no old pod is left. A new pod is Ready after ``load_s`` without
warm-up, or after ``load_s`` plus its warm-up with it (:mod:`prefixserving_lab.models.fleet`:
the hot prefixes it owns among the Ready pods at that moment). Routing uses the Ready pods
only, so a warming pod takes no traffic.

**Traffic**: the conversation workload of :mod:`prefixserving_lab.workloads.conversations`
at a steady compression (no bursts), through the router policy, to ``replicas`` pods.

**Reported** (:class:`RolloutOutcome`): rollout duration, TTFT p50/p99 and hit rate of the
requests that arrived during the rollout, and the same window in a run with no rollout
(``steady``) for reference.

Deterministic; cost: one cluster simulation per run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import ClusterConfig, ClusterResult, ClusterSim, Tick
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow, PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.models.scaling import DEFAULT_SERVICE
from prefixserving_lab.reports.files import hit_rate, quantile
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape
from prefixserving_lab.workloads.traces import TraceRequest

MODES = ("steady", "cold", "warmed")


@dataclass(frozen=True, slots=True)
class RolloutSetup:
    schedule: BurstSchedule = field(
        default_factory=lambda: BurstSchedule(duration_s=1800.0, base_scale=4.0, bursts=())
    )
    shape: ConversationShape = field(default_factory=ConversationShape)
    service: ServiceModel = DEFAULT_SERVICE
    lifecycle: PodLifecycle = field(default_factory=PodLifecycle)
    replicas: int = 4
    start_s: float = 600.0
    policy: str = "prefix-affinity"


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

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, float):
                value = None if math.isnan(value) else round(value, 4)
            out[name] = value
        return out


class _Rollout:
    """Replaces the seeded pods one at a time from ``start_s`` (surge 1, unavailable 0)."""

    def __init__(self, fleet: Fleet, start_s: float | None) -> None:
        self.fleet = fleet
        self.start_s = start_s
        self.old: list[str] = []
        self.current: str | None = None
        self.finished_s: float | None = None

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.fleet.on_tick(sim, tick)
        if self.start_s is None or tick.time_s < self.start_s or self.finished_s is not None:
            return
        if self.current is None:
            self.old = sorted(self.fleet.pods)
            self.current = self.fleet.start(tick.time_s)
            return
        ready = {s.name for s in tick.replicas if s.ready and not s.draining}
        if self.current not in ready:
            return
        self.fleet.remove(sim, self.old.pop(0))
        if self.old:
            self.current = self.fleet.start(tick.time_s)
        else:
            self.finished_s = tick.time_s


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
    rollout = _Rollout(fleet, None if mode == "steady" else setup.start_s)
    sim = ClusterSim(policy, ClusterConfig(service=setup.service), on_tick=rollout)
    fleet.seed(sim, setup.replicas)
    result = sim.run(requests)
    duration = None if rollout.finished_s is None else rollout.finished_s - setup.start_s
    return RolloutRun(duration, result, tuple(fleet.started))


def compare(requests: Sequence[TraceRequest], setup: RolloutSetup) -> list[RolloutOutcome]:
    """Steady, cold and warmed runs, all measured over the same window: from the rollout's
    start to the end of the longer of the two rollouts."""
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
            )
        )
    return out
