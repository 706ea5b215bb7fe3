"""The cluster routing benchmark: every policy on the same workloads and fleet sizes.

For each workload, replica count N and router replica count R, each policy gets a fresh
:class:`ClusterSim` with N identical replicas behind R router replicas (one policy instance
each, sharing nothing) and replays the same requests. Reported per run: cluster hit rate (share of
prompt tokens served from cache) and its ratio to one unbounded cache's (the ideal), max/mean
load (requests routed per replica, and prefill busy time per replica), TTFT p50/p99, and the
policy's decisions by reason.

Fleet sizing, derived from the workload so any trace gets a comparable setting:

- ``cache_blocks`` (per replica): explicit, or ``ceil(load_bound * footprint / N)`` where the
  footprint is the workload's distinct blocks: together the fleet can hold the whole working
  set once, with room for a replica at the load bound. Routing then decides the hit rate.
- ``time_scale``: explicit, or chosen so the prefill servers would be ``utilization`` busy if
  the fleet reached the ideal hit rate (the replay is time-compressed by that factor). A
  policy that reuses less does more prefill work and queues more.

The goal of the router issue, judged per (workload, N, R) for ``prefix_affinity``: hit rate at
least 95% of the ideal; max/mean requests at most 1.25; and a hit rate at least that of every
other policy that is balanced as well: whose max/mean is at most 1.25 or at most ours (a
policy that buys hit rate with worse balance than both is not a like-for-like rival).

The router-replica goal (issue 18), judged per (workload, N, R) when the run has R = 1, for
ours with and without engine events (``OUR_POLICIES``): the hit rate at R router replicas at
least ``1 - SCALING_TOLERANCE`` (99%) of the same policy's at R = 1, and, from
``LEAD_FROM_ROUTERS`` (4) router replicas, above every peer's (``PEERS``) at the same R. With
engine events (``OURS_EVENTS``), also judged per (workload, N) at R = 1: a hit rate at least
``1 - SCALING_TOLERANCE`` of the best peer's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from prefixserving import constants
from prefixserving_lab.models.cluster import (
    KV_EVENT_LAG_S,
    ClusterConfig,
    ClusterResult,
    ClusterSim,
)
from prefixserving_lab.models.peer_routers import (
    PREFIX_AFFINITY_EVENTS,
    follows_kv_events,
    make_sim_policy,
    sim_policy_key,
)
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.workloads.blocks import chain_block_ids, ideal_hit_rate, scale_arrivals
from prefixserving_lab.workloads.traces import TraceRequest

OURS = "prefix_affinity"
OURS_EVENTS = PREFIX_AFFINITY_EVENTS
OUR_POLICIES = (OURS, OURS_EVENTS)
CHALLENGER = "two_choice"
HIT_GOAL = 0.95
# The goal's balance is the router's own load bound: max/mean at most that.
BALANCE_GOAL = constants.ROUTER_LOAD_BOUND
BALANCE_TOLERANCE = 0.02
PEERS = ("two_choice", "kubeai_chwbl", "sglang_cache_aware")
SCALING_TOLERANCE = 0.01
LEAD_FROM_ROUTERS = 4


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests at their original pace, with what the fleet sizing needs."""

    name: str
    requests: tuple[TraceRequest, ...]

    @property
    def footprint_blocks(self) -> int:
        return len({b for r in self.requests for b in chain_block_ids(r.block_ids)})

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class RunRow:
    """One policy on one workload and fleet size."""

    workload: str
    replicas: int
    routers: int
    policy: str
    time_scale: float
    cache_blocks: int
    ideal_hit_rate: float
    hit_rate: float
    hit_vs_ideal: float
    max_mean_requests: float
    max_mean_prefill: float
    ttft_p50_s: float
    ttft_p99_s: float
    decisions: dict[str, int]


def ideal_prefill_s(requests: Sequence[TraceRequest], model: ServiceModel) -> float:
    """Prefill seconds one unbounded cache would need for ``requests``."""
    seen: set[int] = set()
    total = 0.0
    for r in requests:
        blocks = chain_block_ids(r.block_ids)
        hits = 0
        while hits < len(blocks) and blocks[hits] in seen:
            hits += 1
        seen.update(blocks)
        total += model.prefill_s(r.input_tokens - min(hits * r.block_tokens, r.input_tokens))
    return total


def auto_time_scale(workload: Workload, replicas: int, model: ServiceModel, util: float) -> float:
    """Compression that makes ideal prefill work fill ``util`` of ``replicas`` servers."""
    work_s = ideal_prefill_s(workload.requests, model)
    if work_s <= 0 or workload.duration_s <= 0:
        return 1.0
    return util * replicas * workload.duration_s / work_s


def auto_cache_blocks(workload: Workload, replicas: int) -> int:
    return max(1, math.ceil(BALANCE_GOAL * workload.footprint_blocks / replicas))


def run_one(
    workload: Workload,
    replicas: int,
    routers: int,
    policy: str,
    model: ServiceModel,
    time_scale: float,
    kv_event_lag_s: float = KV_EVENT_LAG_S,
) -> ClusterResult:
    """One policy: ``replicas`` cold replicas behind ``routers`` router replicas; a policy
    run with engine events sees each cache change ``kv_event_lag_s`` after it."""
    config = ClusterConfig(
        service=model, kv_events=follows_kv_events(policy), kv_event_lag_s=kv_event_lag_s
    )
    sim = ClusterSim([make_sim_policy(policy) for _ in range(routers)], config)
    width = len(str(replicas - 1))
    for i in range(replicas):
        sim.add_replica(f"replica-{i:0{width}d}")
    return sim.run(scale_arrivals(workload.requests, time_scale))


def run_bench(
    workloads: Sequence[Workload],
    replica_counts: Sequence[int],
    router_counts: Sequence[int],
    policies: Sequence[str],
    *,
    service: ServiceModel,
    cache_blocks: int | None,
    time_scale: float | None,
    utilization: float,
    kv_event_lag_s: float = KV_EVENT_LAG_S,
) -> list[RunRow]:
    """Every policy on every (workload, replica count, router count); rows in that order."""
    rows = []
    for workload in workloads:
        ideal = ideal_hit_rate(workload.requests)
        for n in replica_counts:
            blocks = cache_blocks or auto_cache_blocks(workload, n)
            model = ServiceModel(**{**asdict(service), "cache_blocks": blocks})
            scale = time_scale or auto_time_scale(workload, n, model, utilization)
            for routers in router_counts:
                for policy in policies:
                    result = run_one(workload, n, routers, policy, model, scale, kv_event_lag_s)
                    rows.append(
                        _row(workload.name, n, routers, policy, scale, model, ideal, result)
                    )
    return rows


def _row(
    workload: str,
    replicas: int,
    routers: int,
    policy: str,
    scale: float,
    model: ServiceModel,
    ideal: float,
    result: ClusterResult,
) -> RunRow:
    return RunRow(
        workload,
        replicas,
        routers,
        sim_policy_key(policy),
        round(scale, 3),
        model.cache_blocks,
        round(ideal, 4),
        round(result.hit_rate, 4),
        round(result.hit_rate / ideal, 4) if ideal else 0.0,
        round(result.max_mean("routed"), 3),
        round(result.max_mean("prefill_busy_s"), 3),
        round(result.ttft_quantile(0.5), 3),
        round(result.ttft_quantile(0.99), 3),
        dict(sorted(result.decisions.items())),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """The router issue's goal for one (workload, N, R), and the two-choice comparison."""

    workload: str
    replicas: int
    routers: int
    hit_goal_met: bool
    balance_goal_met: bool
    ahead_of_all: bool
    behind: tuple[str, ...]
    two_choice_wins: bool | None

    @property
    def met(self) -> bool:
        return self.hit_goal_met and self.balance_goal_met and self.ahead_of_all


def verdicts(rows: Sequence[RunRow]) -> list[Verdict]:
    out = []
    cases = dict.fromkeys((r.workload, r.replicas, r.routers) for r in rows)
    for workload, n, routers in cases:
        case = {
            r.policy: r
            for r in rows
            if (r.workload, r.replicas, r.routers) == (workload, n, routers)
        }
        ours = case.get(OURS)
        if ours is None:
            continue
        behind = tuple(
            name
            for name, other in case.items()
            if name != OURS and other.hit_rate > ours.hit_rate and _comparable(ours, other)
        )
        challenger = case.get(CHALLENGER)
        wins = None
        if challenger is not None:
            wins = (
                challenger.hit_rate > ours.hit_rate
                and challenger.max_mean_requests <= ours.max_mean_requests + BALANCE_TOLERANCE
            )
        out.append(
            Verdict(
                workload,
                n,
                routers,
                ours.hit_vs_ideal >= HIT_GOAL,
                ours.max_mean_requests <= BALANCE_GOAL,
                not behind,
                behind,
                wins,
            )
        )
    return out


def _comparable(ours: RunRow, other: RunRow) -> bool:
    """Whether ``other`` is balanced well enough to be compared with ours on hit rate."""
    return other.max_mean_requests <= max(ours.max_mean_requests + BALANCE_TOLERANCE, BALANCE_GOAL)


@dataclass(frozen=True, slots=True)
class ScalingVerdict:
    """Issue 18's router-replica goal for one of ``OUR_POLICIES`` on one (workload, N, R); see
    the module docstring. ``of_one_router``: its hit rate at R over its own at R = 1;
    ``behind``: the peers with a higher hit rate at R (judged only from
    ``LEAD_FROM_ROUTERS``, else empty)."""

    workload: str
    replicas: int
    routers: int
    of_one_router: float
    within_goal_met: bool
    lead_judged: bool
    behind: tuple[str, ...]
    policy: str = OURS

    @property
    def met(self) -> bool:
        return self.within_goal_met and not self.behind


def scaling_verdicts(rows: Sequence[RunRow]) -> list[ScalingVerdict]:
    """One verdict per policy of ``OUR_POLICIES`` and (workload, N, R > 1) that has its row
    and its row at R = 1; per policy in ``OUR_POLICIES`` order."""
    out = []
    for policy in OUR_POLICIES:
        ours = {(r.workload, r.replicas, r.routers): r for r in rows if r.policy == policy}
        for (workload, n, routers), row in ours.items():
            single = ours.get((workload, n, 1))
            if routers == 1 or single is None or not single.hit_rate:
                continue
            ratio = row.hit_rate / single.hit_rate
            judged = routers >= LEAD_FROM_ROUTERS
            behind = tuple(
                r.policy
                for r in rows
                if judged
                and (r.workload, r.replicas, r.routers) == (workload, n, routers)
                and r.policy in PEERS
                and r.hit_rate >= row.hit_rate
            )
            out.append(
                ScalingVerdict(
                    workload,
                    n,
                    routers,
                    round(ratio, 4),
                    ratio >= 1 - SCALING_TOLERANCE,
                    judged,
                    behind,
                    policy,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class EventsVerdict:
    """Issue 18's engine-events goal for one (workload, N) at one router: ``of_best_peer``,
    ``OURS_EVENTS``' hit rate over the best peer's (``best_peer``)."""

    workload: str
    replicas: int
    best_peer: str
    of_best_peer: float

    @property
    def met(self) -> bool:
        return self.of_best_peer >= 1 - SCALING_TOLERANCE


def events_verdicts(rows: Sequence[RunRow]) -> list[EventsVerdict]:
    """One verdict per (workload, N) with an ``OURS_EVENTS`` row and a peer row at R = 1."""
    out = []
    for row in rows:
        if row.policy != OURS_EVENTS or row.routers != 1:
            continue
        peers = [
            r
            for r in rows
            if (r.workload, r.replicas, r.routers) == (row.workload, row.replicas, 1)
            and r.policy in PEERS
        ]
        if not peers:
            continue
        best = max(peers, key=lambda r: r.hit_rate)
        ratio = row.hit_rate / best.hit_rate if best.hit_rate else 1.0
        out.append(EventsVerdict(row.workload, row.replicas, best.policy, round(ratio, 4)))
    return out
