"""Faults in the cluster simulator: hit rate and TTFT over simulated time (issue 18).

Each scenario replays the same requests on the same fleet (``replicas`` engine pods behind
``routers`` router replicas, :mod:`prefixserving_lab.models.fleet` pods with warm-up as the
operator deploys them) and injects one fault at ``fault_s``:

- ``steady``: none (the reference).
- ``router-restart``: router replica 0 restarts with its policy state lost
  (:meth:`~prefixserving_lab.models.cluster.ClusterSim.restart_router`).
- ``engines-out``: ``engines_out`` pods are removed (the most recently started, as a
  ReplicaSet picks them; they drain) and ``out_for_s`` later the Deployment is scaled back:
  new pods start, load for ``load_s`` and warm up.
- ``rolling-update``: every pod is replaced, surge 1 and unavailable 0
  (:class:`~prefixserving_lab.models.rollout.RollingUpdate`), each new pod warming what the
  pod it replaces holds (the warm-up handover, on by default).
- ``rolling-update-no-handover``: the same with ``spec.warmup.handover: false``.

**Reported** per scenario (:class:`FaultSeries`): requests bucketed by arrival into
``bucket_s`` windows; per bucket the hit rate, its ratio to the steady run's hit rate in the
same bucket, and TTFT p99; after the fault, the extra prompt tokens computed against the
steady run and how many of them no Ready pod held. The goal: after the fault, no stretch of
consecutive buckets whose ratio is below ``DIP_RATIO`` (90%) lasting longer than
``DIP_LIMIT_S`` (60 s). A bucket's ratio is NaN (and ends no stretch nor starts one) when
either run has no prompt tokens there.

**Best placement** (:func:`best_placement_hit_rate`): the same ratio and dip had each request
gone to the Ready pod that held the most of its prompt when it was routed. It is a bound for
any router *from the moment of routing*, given what the fleet cached then; it says nothing of
what a different placement before the fault would have left on the surviving pods. When the
best placement's dip is itself over the limit, the miss is what the fault took away, not where
the router sent the requests after it.

Deterministic; cost: one cluster simulation per scenario.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefixserving_lab.models.cluster import (
    ClusterConfig,
    ClusterResult,
    ClusterSim,
    Outcome,
    Tick,
)
from prefixserving_lab.models.cluster import hit_rate as outcomes_hit_rate
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow, PodLifecycle
from prefixserving_lab.models.peer_routers import follows_kv_events, make_sim_policy
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.models.rollout import RollingUpdate
from prefixserving_lab.runners.cluster import Workload, auto_cache_blocks
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.blocks import scale_arrivals
from prefixserving_lab.workloads.traces import TraceRequest, load_mooncake

SCENARIOS = (
    "steady",
    "router-restart",
    "engines-out",
    "rolling-update",
    "rolling-update-no-handover",
)
DIP_RATIO = 0.9
DIP_LIMIT_S = 60.0


@dataclass(frozen=True, slots=True)
class FaultSetup:
    """The fleet, the routers and the fault's timing (module docstring)."""

    replicas: int = 8
    routers: int = 2
    policy: str = "prefix_affinity"
    fault_s: float = 300.0
    engines_out: int = 2
    out_for_s: float = 120.0
    bucket_s: float = 15.0
    lifecycle: PodLifecycle = field(default_factory=PodLifecycle)

    def __post_init__(self) -> None:
        if not 0 < self.engines_out < self.replicas:
            raise ValueError("engines_out must be between 1 and replicas - 1")
        if self.routers < 1 or self.bucket_s <= 0 or self.fault_s < 0 or self.out_for_s < 0:
            raise ValueError("routers >= 1, bucket_s > 0, fault_s >= 0 and out_for_s >= 0")


class _Fault:
    """``on_tick`` of one scenario: pod upkeep, then the fault's steps when they are due."""

    def __init__(self, scenario: str, setup: FaultSetup, fleet: Fleet) -> None:
        self.scenario, self.setup, self.fleet = scenario, setup, fleet
        rolling = scenario.startswith("rolling-update")
        rollout_start = setup.fault_s if rolling else None
        self.rollout = RollingUpdate(fleet, rollout_start, handover=scenario == "rolling-update")
        self._steps = self._plan()

    def _plan(self) -> list[tuple[float, str]]:
        s = self.setup
        if self.scenario == "router-restart":
            return [(s.fault_s, "restart")]
        if self.scenario == "engines-out":
            return [(s.fault_s, "remove"), (s.fault_s + s.out_for_s, "restore")]
        return []

    def __call__(self, sim: ClusterSim, tick: Tick) -> None:
        self.rollout(sim, tick)  # also the fleet's upkeep (RollingUpdate calls on_tick)
        while self._steps and self._steps[0][0] <= tick.time_s:
            _, step = self._steps.pop(0)
            if step == "restart":
                sim.restart_router(0, make_sim_policy(self.setup.policy))
            elif step == "remove":
                self.fleet.scale_to(sim, self.setup.replicas - self.setup.engines_out)
            else:
                self.fleet.scale_to(sim, self.setup.replicas)


def trace_inputs(
    trace: Path, replicas: int, time_scale: float
) -> tuple[list[TraceRequest], ServiceModel]:
    """The requests of a Mooncake-format ``trace`` at ``time_scale`` x its pace and the replica
    model, its cache sized for ``replicas`` (:func:`auto_cache_blocks`)."""
    workload = Workload(trace.stem, tuple(load_mooncake(trace)))
    service = replace(ServiceModel(), cache_blocks=auto_cache_blocks(workload, replicas))
    return scale_arrivals(workload.requests, time_scale), service


def rerun(meta: Mapping[str, Any], trace: Path, policy: str, scenario: str) -> FaultSeries:
    """One ``policy``'s ``scenario`` of a results file whose run wrote ``meta`` (the file's
    top level: its ``setup`` and ``time_scale``), replayed on ``trace``, against its steady
    run. Deterministic: equal to the file's series while the simulator, the policy and the
    trace are unchanged. Cost: two cluster simulations."""
    recorded = dict(meta["setup"])
    lifecycle = PodLifecycle(**recorded.pop("lifecycle"))
    setup = FaultSetup(**{**recorded, "policy": policy, "lifecycle": lifecycle})
    requests, service = trace_inputs(trace, setup.replicas, meta["time_scale"])
    steady = run_scenario(requests, setup, service, "steady")
    return series(scenario, run_scenario(requests, setup, service, scenario), steady, setup)


def run_scenario(
    requests: Sequence[TraceRequest], setup: FaultSetup, service: ServiceModel, scenario: str
) -> ClusterResult:
    """One scenario on ``requests`` (already at the pace to replay)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}")
    lifecycle = setup.lifecycle
    hot = HotPrefixWindow(requests, lifecycle.window_s, lifecycle.min_hits)
    fleet = Fleet(lifecycle, make_sim_policy(setup.policy), service, hot)
    routers = [make_sim_policy(setup.policy) for _ in range(setup.routers)]
    sim = ClusterSim(
        routers,
        ClusterConfig(service=service, kv_events=follows_kv_events(setup.policy)),
        on_tick=_Fault(scenario, setup, fleet),
    )
    fleet.seed(sim, setup.replicas)
    return sim.run(requests)


@dataclass(frozen=True, slots=True)
class Bucket:
    """Requests that arrived in ``[start_s, start_s + bucket_s)``: their hit rate, its ratio
    to the steady run's in the same bucket, the best placement's ratio
    (:func:`best_placement_hit_rate`) and TTFT p99."""

    start_s: float
    requests: int
    hit_rate: float
    of_steady: float
    best_of_steady: float
    ttft_p99_s: float


def best_placement_hit_rate(outcomes: Sequence[Outcome]) -> float:
    """Hit rate had each request gone to the Ready pod that held the most of its prompt when
    it was routed (``fleet_hit_tokens``), or what it did hit where that is more (its pod
    cached more of it while it queued); NaN for none. O(len(outcomes))."""
    total = sum(o.input_tokens for o in outcomes)
    best = sum(max(o.hit_tokens, o.fleet_hit_tokens) for o in outcomes)
    return best / total if total else math.nan


@dataclass(frozen=True, slots=True)
class Misses:
    """Where a fault's extra misses come from, over some requests.

    ``extra_uncached_tokens``: prompt tokens computed beyond what the steady run computed for
    the same requests. ``unheld_tokens``: the steady run's cache hits that no Ready pod held
    when the faulted run routed the request (gone with a removed pod, or evicted): no
    placement could have hit them. The rest of the extra went to a pod that did not hold what
    another one did.
    """

    extra_uncached_tokens: int = 0
    unheld_tokens: int = 0

    @classmethod
    def of(cls, outcomes: Sequence[Outcome], steady: Mapping[int, Outcome]) -> Misses:
        """``outcomes`` of the faulted run against ``steady``'s outcomes by request index."""
        extra = unheld = 0
        for o in outcomes:
            ref = steady.get(o.index)
            steady_hit = ref.hit_tokens if ref is not None else 0
            extra += steady_hit - o.hit_tokens
            unheld += max(steady_hit - o.fleet_hit_tokens, 0)
        return cls(extra, unheld)


@dataclass(frozen=True, slots=True)
class FaultSeries:
    """One scenario over time, and the goal (module docstring). ``best_placement_dip_s``: the
    longest dip of the best placement's ratio; ``misses_after``: the extra misses of every
    request after the fault; ``misses_in_dip``: of those that arrived during the longest dip
    (none when there is no dip)."""

    scenario: str
    hit_rate_after: float
    steady_hit_rate_after: float
    ttft_p99_after_s: float
    steady_ttft_p99_after_s: float
    lowest_of_steady: float
    longest_dip_s: float
    best_placement_dip_s: float
    buckets: tuple[Bucket, ...]
    misses_after: Misses = Misses()
    misses_in_dip: Misses = Misses()

    @property
    def met(self) -> bool:
        return self.longest_dip_s <= DIP_LIMIT_S


def _buckets(result: ClusterResult, bucket_s: float) -> dict[int, list]:
    out: dict[int, list] = {}
    for o in result.outcomes:
        out.setdefault(int(o.arrival_s // bucket_s), []).append(o)
    return out


def _ratio(rate: float, steady_rate: float) -> float:
    return rate / steady_rate if steady_rate and not math.isnan(rate) else math.nan


def _longest_dip(ratios: Sequence[tuple[float, float]], bucket_s: float) -> tuple[float, float]:
    """(length, end) in seconds of the longest run of consecutive buckets whose ratio is below
    ``DIP_RATIO``; ``ratios``: (bucket start, ratio) in time order, NaN ratios skipped. The
    end is NaN when there is no dip."""
    longest = current = 0.0
    end_s = math.nan
    for start_s, ratio in ratios:
        if math.isnan(ratio):
            continue
        current = current + bucket_s if ratio < DIP_RATIO else 0.0
        if current > longest:
            longest, end_s = current, start_s + bucket_s
    return longest, end_s


def series(
    scenario: str, result: ClusterResult, steady: ClusterResult, setup: FaultSetup
) -> FaultSeries:
    """Bucket ``result`` against ``steady`` and measure the dips after ``fault_s``."""
    mine, ref = _buckets(result, setup.bucket_s), _buckets(steady, setup.bucket_s)
    first = int(setup.fault_s // setup.bucket_s)
    buckets = []
    for index in sorted(mine):
        outcomes = mine[index]
        rate, steady_rate = outcomes_hit_rate(outcomes), outcomes_hit_rate(ref.get(index, []))
        ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
        buckets.append(
            Bucket(
                index * setup.bucket_s,
                len(outcomes),
                rate,
                _ratio(rate, steady_rate),
                _ratio(best_placement_hit_rate(outcomes), steady_rate),
                quantile(ttfts, 0.99),
            )
        )
    after = [b for b in buckets if b.start_s >= first * setup.bucket_s]
    longest, dip_end_s = _longest_dip([(b.start_s, b.of_steady) for b in after], setup.bucket_s)
    best_dip_s, _ = _longest_dip([(b.start_s, b.best_of_steady) for b in after], setup.bucket_s)
    ratios = [b.of_steady for b in after if not math.isnan(b.of_steady)]

    mine_after, steady_after = (
        [o for o in r.outcomes if o.arrival_s >= setup.fault_s] for r in (result, steady)
    )

    def p99(outcomes: list[Outcome]) -> float:
        return quantile((o.ttft_s for o in outcomes if o.ttft_s is not None), 0.99)

    by_index = {o.index: o for o in steady.outcomes}
    in_dip = [o for o in mine_after if dip_end_s - longest <= o.arrival_s < dip_end_s]
    return FaultSeries(
        scenario,
        outcomes_hit_rate(mine_after),
        outcomes_hit_rate(steady_after),
        p99(mine_after),
        p99(steady_after),
        min(ratios) if ratios else math.nan,
        longest,
        best_dip_s,
        tuple(buckets),
        Misses.of(mine_after, by_index),
        Misses.of(in_dip, by_index),
    )


def run_faults(
    requests: Sequence[TraceRequest],
    setup: FaultSetup,
    service: ServiceModel,
    scenarios: Sequence[str] = SCENARIOS[1:],
) -> list[FaultSeries]:
    """The steady reference, then each scenario against it."""
    steady = run_scenario(requests, setup, service, "steady")
    out = [series("steady", steady, steady, setup)]
    for scenario in scenarios:
        out.append(
            series(scenario, run_scenario(requests, setup, service, scenario), steady, setup)
        )
    return out
