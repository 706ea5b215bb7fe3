"""Faults in the cluster simulator: a router restart loses that router's state only, engines
out and back, and the dip measurement of ``bench faults`` (its command runs in
``test_bench_smoke.py``)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from prefixserving_lab.models.cluster import ClusterConfig, ClusterResult, ClusterSim, Outcome
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.peer_routers import make_sim_policy
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.runners.faults import FaultSetup, Misses, run_scenario, series
from prefixserving_lab.workloads.traces import TraceRequest

FAST = ServiceModel(
    prefill_s_per_token=0.001, prefill_overhead_s=0.0, decode_s_per_token=0.01, block_tokens=4
)


def _req(t: float, ids: tuple[int, ...]) -> TraceRequest:
    return TraceRequest(t, len(ids) * 4, 1, ids, 4)


def _conversations(count: int, turns: int, gap_s: float) -> list[TraceRequest]:
    return [
        _req(gap_s * (turn * count + c), (c, 1000 + c, 2000 + c))
        for turn in range(turns)
        for c in range(count)
    ]


def _four_pods(**changes: Any) -> FaultSetup:
    """4 pods behind 2 routers, the fault at 5 s (2 pods out for engines-out), 1 s buckets."""
    return replace(
        FaultSetup(replicas=4, routers=2, fault_s=5.0, engines_out=2, bucket_s=1.0), **changes
    )


def test_restarted_router_forgets_only_its_own_state() -> None:
    """SGLang-style routers: after router 0 restarts, its first request of each conversation
    is placed without affinity (its trees are gone); router 1 keeps its affinity."""
    requests = _conversations(20, 6, 0.1)
    restart_s = 6.0  # after 3 turns
    sim = ClusterSim(
        [make_sim_policy("sglang_cache_aware") for _ in range(2)],
        ClusterConfig(service=FAST),
        on_tick=lambda s, tick: (
            s.restart_router(0, make_sim_policy("sglang_cache_aware"))
            if tick.time_s == restart_s
            else None
        ),
    )
    for i in range(4):
        sim.add_replica(f"r{i}")
    result = sim.run(requests)
    firsts: dict[tuple[int | None, int, bool], int] = {}
    for o in result.outcomes:
        restarted = o.router == 0 and o.arrival_s >= restart_s
        firsts.setdefault((o.router, requests[o.index].block_ids[0], restarted), o.index)
    cold = {o.index for o in result.outcomes if o.reason != "affinity"}
    assert cold == set(firsts.values())
    assert sum(restarted for _, _, restarted in firsts) > 0
    assert all(s.in_flight >= 0 for tick in result.ticks for s in tick.replicas)


def test_restart_router_rejects_an_unknown_index() -> None:
    sim = ClusterSim(make_sim_policy("round_robin"), ClusterConfig(service=FAST))
    with pytest.raises(ValueError, match="no router replica 3"):
        sim.restart_router(3, make_sim_policy("round_robin"))


def test_engines_out_take_no_traffic_until_new_pods_are_ready() -> None:
    """Two of four pods removed at the 5 s tick and the Deployment scaled back at 8 s: after
    5 s only the two remaining pods are routed to, until the new pods load (2 s) and turn
    Ready (requests arriving at 5 s itself come before that tick)."""
    requests = _conversations(40, 10, 0.05)
    setup = _four_pods(out_for_s=3.0, lifecycle=PodLifecycle(load_s=2.0, warmup=False))
    result = run_scenario(requests, setup, FAST, "engines-out")
    before = {o.backend for o in result.outcomes if o.arrival_s < 5.0}
    out = {o.backend for o in result.outcomes if 5.01 <= o.arrival_s < 10.0}
    back = {o.backend for o in result.outcomes if o.arrival_s >= 11.0}
    assert len(before) == 4 and len(out) == 2 and out < before
    assert len(back) == 4 and len(back - before) == 2  # two new pods, new names


def _outcomes(hits: list[float], bucket_s: float, fleet_hit: int = 100) -> ClusterResult:
    """Ten requests of 100 tokens per bucket, ``hits[i]`` of them cached in bucket i; the
    fleet held ``fleet_hit`` tokens of each when it was routed."""
    outcomes = []
    for b, hit in enumerate(hits):
        for k in range(10):
            index = len(outcomes)
            t = b * bucket_s + k * bucket_s / 10
            outcomes.append(
                Outcome(index, t, "r0", "affinity", 0.1, int(hit * 100), 100, 0, fleet_hit)
            )
    return ClusterResult(outcomes, {}, [], Counter(), 0.0)


def test_dip_is_the_longest_run_of_buckets_below_ninety_percent_of_steady() -> None:
    setup = FaultSetup(fault_s=30.0, bucket_s=15.0)
    steady = _outcomes([0.8] * 11, 15.0)
    # Before the fault (buckets 0-1) a dip does not count; after it 3 buckets below 90% of
    # steady, a good one, then 5 below (75 s, over the 60 s limit); the last bucket has no
    # steady requests, so it has no ratio.
    faulty = _outcomes([0.1, 0.1, 0.5, 0.6, 0.7, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5], 15.0)
    got = series("engines-out", faulty, steady, setup)
    assert got.longest_dip_s == 75.0 and not got.met
    assert got.lowest_of_steady == pytest.approx(0.5 / 0.8)
    assert math.isnan(got.buckets[-1].of_steady)  # no steady requests in that bucket
    short = _outcomes([0.8, 0.8, 0.7, 0.7, 0.7, 0.7, 0.8, 0.8, 0.8, 0.8, 0.8], 15.0)
    assert series("engines-out", short, steady, setup).met  # exactly 60 s


def test_extra_misses_split_into_what_no_pod_held_and_the_rest() -> None:
    """Steady hits 80 tokens of each request. After the fault (buckets 2-5, 10 requests
    each) the faulted run hits 50 in buckets 2-3 (the dip) and 75 in buckets 4-5 (within 90%
    of steady), and the fleet held 60 of each when routed: 20 of steady's 80 were held by no
    pod, and the rest of the extra went to a pod that did not hold what another one did."""
    setup = FaultSetup(fault_s=30.0, bucket_s=15.0)
    steady = _outcomes([0.8] * 6, 15.0)
    faulty = _outcomes([0.8, 0.8, 0.5, 0.5, 0.75, 0.75], 15.0, fleet_hit=60)
    got = series("engines-out", faulty, steady, setup)
    assert got.longest_dip_s == 30.0
    assert got.misses_in_dip == Misses(20 * (80 - 50), 20 * (80 - 60))
    assert got.misses_after == Misses(20 * 30 + 20 * 5, 40 * 20)
    same = series("steady", steady, steady, setup)
    assert same.misses_after == same.misses_in_dip == Misses(0, 0)


def test_best_placement_dips_only_where_no_ready_pod_held_what_steady_hit() -> None:
    """Steady hits 80 tokens of each request; after the fault the run hits 50 for two
    buckets. Where a Ready pod held all 100 tokens when each was routed, the best placement
    would not have dipped: the router's choice lost the hits. Where pods held only 60
    (75% of steady), no placement could have kept 90%: the fault took them."""
    setup = FaultSetup(fault_s=30.0, bucket_s=15.0)
    steady = _outcomes([0.8] * 6, 15.0)
    hits = [0.8, 0.8, 0.5, 0.5, 0.75, 0.75]
    routed_badly = series("engines-out", _outcomes(hits, 15.0, fleet_hit=100), steady, setup)
    assert routed_badly.longest_dip_s == 30.0 and routed_badly.best_placement_dip_s == 0.0
    assert routed_badly.buckets[2].best_of_steady == pytest.approx(100 / 80)
    taken = series("engines-out", _outcomes(hits, 15.0, fleet_hit=60), steady, setup)
    assert taken.longest_dip_s == taken.best_placement_dip_s == 30.0
    # A request that hit more than the fleet held when it was routed (its pod cached more of
    # it while it queued) counts what it hit.
    assert taken.buckets[4].best_of_steady == pytest.approx(75 / 80)


@pytest.mark.parametrize(
    ("scenario", "policy"),
    [("engines-out", "prefix_affinity"), ("router-restart", "sglang_cache_aware")],
)
def test_a_removed_pods_cache_is_unheld_a_restarted_routers_misses_are_not(
    scenario: str, policy: str
) -> None:
    """Conversations on 4 pods, nothing evicted: removing 2 pods takes what they held (their
    conversations' next turns find it nowhere); a restarted SGLang-style router sends
    conversations to pods that do not hold them while the pods that do are still there."""
    requests = _conversations(40, 10, 0.05)
    setup = _four_pods(
        policy=policy, out_for_s=100.0, lifecycle=PodLifecycle(load_s=2.0, warmup=False)
    )
    steady = run_scenario(requests, setup, FAST, "steady")
    got = series(scenario, run_scenario(requests, setup, FAST, scenario), steady, setup)
    assert got.misses_after.extra_uncached_tokens > 0
    if scenario == "engines-out":
        assert got.misses_after.unheld_tokens == got.misses_after.extra_uncached_tokens
    else:
        assert got.misses_after.unheld_tokens == 0


def test_restarted_router_counts_only_requests_it_routed_since() -> None:
    """A request with a 10 s decode is in flight when its router restarts: the new router
    counts nothing in flight, and the request's completion does not drive its count below 0."""
    long = TraceRequest(0.0, 4, 1000, (1,), 4)
    sim = ClusterSim(
        make_sim_policy("least_loaded"),
        ClusterConfig(service=FAST),
        on_tick=lambda s, tick: (
            s.restart_router(0, make_sim_policy("least_loaded")) if tick.time_s == 1.0 else None
        ),
    )
    sim.add_replica("r0")
    result = sim.run([long, _req(15.0, (2,))])
    in_flight = {tick.time_s: tick.replicas[0].in_flight for tick in result.ticks}
    assert in_flight[0.0] == in_flight[1.0] == 1  # a tick samples before its on_tick
    assert in_flight[2.0] == 0 and in_flight[12.0] == 0
    assert all(n >= 0 for n in in_flight.values())


def _rolling_update(policy: str, handover: bool) -> tuple[list[TraceRequest], ClusterResult]:
    """4 pods behind 2 routers, 40 conversations each asking every 2 s for 80 s, every pod
    replaced from 5 s (2 s load, warm-up on), with or without the handover."""
    requests = _conversations(40, 40, 0.05)
    setup = _four_pods(policy=policy, lifecycle=PodLifecycle(load_s=2.0, window_s=10.0))
    scenario = "rolling-update" if handover else "rolling-update-no-handover"
    return requests, run_scenario(requests, setup, FAST, scenario)


@pytest.mark.parametrize("handover", [True, False])
def test_with_events_a_replaced_pods_conversations_stay_warm_only_with_the_handover(
    handover: bool,
) -> None:
    """Rolling update with engine events: the conversations the first replaced pod served
    reach its successor with their prefix cached when the successor warmed what that pod held
    (the handover), and recompute it without."""
    requests, result = _rolling_update("prefix_affinity_events", handover)
    victim = "pod-0"  # the first old pod replaced (RollingUpdate takes them in name order)
    served = {requests[o.index].block_ids[0] for o in result.outcomes if o.backend == victim}
    gone = max(o.arrival_s for o in result.outcomes if o.backend == victim)
    firsts: dict[int, Outcome] = {}
    for o in sorted(result.outcomes, key=lambda o: o.arrival_s):
        conversation = requests[o.index].block_ids[0]
        if o.arrival_s > gone + 0.5 and conversation in served:
            firsts.setdefault(conversation, o)
    assert len(firsts) == len(served) > 0
    warm = [o for o in firsts.values() if o.hit_tokens == o.input_tokens]
    if handover:
        assert len(warm) == len(firsts), "every one found its prefix on the successor"
    else:
        assert len(warm) < len(firsts), "some were recomputed where the ranking sent them"


@pytest.mark.parametrize("handover", [True, False])
def test_without_events_a_successor_takes_its_predecessors_place_only_with_the_handover(
    handover: bool,
) -> None:
    """Rolling update, prefix_affinity without engine events: with the handover each new pod
    inherits the routing identity of the pod it replaced, so once the rollout is over every
    conversation is on its old pod's successor (old pods are replaced in name order, new
    pods named in start order); without it, an old pod's conversations are spread."""
    requests, result = _rolling_update("prefix_affinity", handover)

    def placement(start_s: float, end_s: float) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for o in result.outcomes:
            if start_s <= o.arrival_s < end_s and o.reason == "affinity":
                out.setdefault(requests[o.index].block_ids[0], set()).add(str(o.backend))
        return out

    before, after = placement(0.0, 5.0), placement(40.0, 80.0)
    assert set(before) == set(after) and all(
        len(b) == 1 for b in (*before.values(), *after.values())
    )
    successor = {f"pod-{i}": f"pod-{i + 4}" for i in range(4)}
    kept = [successor[next(iter(before[c]))] == next(iter(after[c])) for c in before]
    if handover:
        assert all(kept)
    else:
        assert not all(kept)
