"""The cluster simulator: invariants on the Mooncake trace, exact timings on tiny traces,
membership changes, router replicas and the on_tick hook."""

from __future__ import annotations

from collections import Counter

import pytest

from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import ClusterConfig, ClusterResult, ClusterSim, Tick
from prefixserving_lab.models.peer_routers import SglangCacheAwarePolicy, make_sim_policy
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.workloads.blocks import (
    SharedPrefixGroups,
    chain_block_ids,
    ideal_hit_rate,
    scale_arrivals,
)
from prefixserving_lab.workloads.traces import TraceRequest, load_mooncake

FAST = ServiceModel(
    prefill_s_per_token=0.001, prefill_overhead_s=0.0, decode_s_per_token=0.01, block_tokens=4
)


def _sim(policy: str = "prefix_affinity", model: ServiceModel = FAST, **kw: object) -> ClusterSim:
    return ClusterSim(make_policy(policy), ClusterConfig(service=model), **kw)  # type: ignore[arg-type]


def _req(t: float, ids: tuple[int, ...], output: int = 1) -> TraceRequest:
    return TraceRequest(t, len(ids) * 4, output, ids, 4)


def test_one_unbounded_replica_reaches_the_ideal_hit_rate_on_mooncake(shared_dir) -> None:
    requests = load_mooncake(shared_dir / "traces" / "mooncake-synthetic.jsonl")
    ideal = ideal_hit_rate(requests)
    assert ideal == pytest.approx(0.651, abs=0.0005)  # the trace README's figure
    sim = _sim(model=ServiceModel(cache_blocks=1 << 17))
    sim.add_replica("only")
    result = sim.run(scale_arrivals(requests, 0.5))
    assert result.hit_rate == pytest.approx(ideal, abs=1e-9)
    assert all(o.ttft_s is not None and o.ttft_s > 0 for o in result.outcomes)


def test_exact_ttft_for_a_pioneer_and_a_sibling() -> None:
    sim = _sim()
    sim.add_replica("r0")
    result = sim.run([_req(0.0, (1, 2, 3)), _req(10.0, (1, 2, 4))])
    first, second = result.outcomes
    assert first.ttft_s == pytest.approx(12 * 0.001)
    assert second.hit_tokens == 8
    assert second.ttft_s == pytest.approx(4 * 0.001)
    assert result.hit_rate == pytest.approx(8 / 24)


def test_simultaneous_requests_queue_behind_one_prefill() -> None:
    sim = _sim()
    sim.add_replica("r0")
    result = sim.run([_req(0.0, (1, 2)), _req(0.0, (3, 4))])
    assert [o.ttft_s for o in result.outcomes] == pytest.approx([0.008, 0.016])


def test_same_inputs_same_result() -> None:
    requests = SharedPrefixGroups(requests=300, rate_per_s=50.0).generate()

    def run() -> list:
        sim = _sim(model=ServiceModel(cache_blocks=200))
        for i in range(4):
            sim.add_replica(f"r{i}")
        return sim.run(requests).outcomes

    assert run() == run()


def test_replica_joins_after_its_ready_delay_and_leaves_after_draining() -> None:
    sim = _sim("round_robin")
    sim.add_replica("a")
    sim.add_replica("b", at_s=5.0, ready_delay_s=5.0)
    sim.remove_replica("a", at_s=20.0)
    requests = [_req(float(t), (100 + t,)) for t in range(30)]
    result = sim.run(requests)
    by_time = {o.arrival_s: o.backend for o in result.outcomes}
    assert all(by_time[float(t)] == "a" for t in range(10))
    assert {by_time[float(t)] for t in range(10, 20)} == {"a", "b"}
    assert all(by_time[float(t)] == "b" for t in range(20, 30))
    assert all(o.ttft_s is not None for o in result.outcomes)
    assert set(result.replicas) == {"a", "b"}


def test_warm_replica_hits_on_its_first_request() -> None:
    sim = _sim()
    sim.add_replica("warm", warm=[chain_block_ids((7, 8))])
    result = sim.run([_req(0.0, (7, 8, 9))])
    assert result.outcomes[0].hit_tokens == 8


def test_requests_wait_at_the_router_until_a_replica_is_ready() -> None:
    sim = _sim()
    sim.add_replica("late", at_s=0.0, ready_delay_s=3.0)
    result = sim.run([_req(0.5, (1,))])
    assert result.outcomes[0].ttft_s == pytest.approx(2.5 + 0.004)


def test_run_stops_when_no_replica_can_ever_serve() -> None:
    result = _sim().run([_req(0.0, (1,))])
    assert result.outcomes[0].ttft_s is None


def test_on_tick_sees_signals_and_can_add_replicas() -> None:
    seen: list[Tick] = []

    def autoscale(sim: ClusterSim, tick: Tick) -> None:
        seen.append(tick)
        if tick.time_s == 2.0:
            sim.add_replica("extra")

    sim = _sim("least_loaded", on_tick=autoscale)
    sim.add_replica("base")
    requests = [_req(0.1 * i, (i,), output=300) for i in range(60)]
    result = sim.run(requests)
    assert seen[0].time_s == 0.0 and seen[1].time_s == 1.0
    busy = next(t for t in seen if t.time_s == 2.0)
    assert busy.replicas[0].in_flight > 0 and busy.replicas[0].kv_usage > 0
    assert "extra" in {o.backend for o in result.outcomes}
    assert any(len(t.replicas) == 2 for t in seen)


def affinity_routers(routers: int, requests: list, cache_blocks: int) -> ClusterResult:
    """``requests`` through ``routers`` prefix-affinity routers in front of 4 replicas."""
    sim = ClusterSim(
        [make_policy("prefix_affinity") for _ in range(routers)],
        ClusterConfig(service=ServiceModel(cache_blocks=cache_blocks)),
    )
    for i in range(4):
        sim.add_replica(f"r{i}")
    return sim.run(requests)


def test_router_replicas_agree_without_talking() -> None:
    """Two prefix-affinity routers, each seeing half of the traffic, place at least 95% of the
    requests where one router would (they can differ only while their traffic counts warm up
    and on documents whose share sits at the hot threshold) and reach the same hit rate."""
    requests = scale_arrivals(SharedPrefixGroups(requests=600).generate(), 0.05)
    one, two = (affinity_routers(n, requests, cache_blocks=4096) for n in (1, 2))
    same = sum(a.backend == b.backend for a, b in zip(one.outcomes, two.outcomes, strict=True))
    assert same >= 0.95 * len(requests)
    assert two.hit_rate == pytest.approx(one.hit_rate, abs=0.01)


def test_policy_choosing_a_non_ready_backend_is_an_error() -> None:
    class Rogue(type(make_policy("round_robin"))):  # type: ignore[misc]
        name = "rogue"

        def select(self, ctx):  # type: ignore[no-untyped-def]
            return type(super().select(ctx))("nowhere", super().select(ctx).reason)

    sim = ClusterSim(Rogue(), ClusterConfig(service=FAST))
    sim.add_replica("r0")
    with pytest.raises(ValueError, match="not a Ready replica"):
        sim.run([_req(0.0, (1,))])


def test_router_replicas_agree_under_load_on_mooncake(shared_dir) -> None:
    """Under load (Mooncake, compressed so queues form), two prefix-affinity routers place
    nearly every request where one router would: the bound compares the engines' own request
    counts, which every router scrapes alike, rather than each router's partial in-flight
    count; and both keep the hit rate near one unbounded cache's."""
    requests = scale_arrivals(
        load_mooncake(shared_dir / "traces" / "mooncake-synthetic.jsonl"), 1.42
    )
    ideal = ideal_hit_rate(requests)
    one, two = (affinity_routers(n, requests, cache_blocks=13727) for n in (1, 2))
    assert one.decisions["spilled"] > 0  # the load bound was exercised
    same = sum(a.backend == b.backend for a, b in zip(one.outcomes, two.outcomes, strict=True))
    assert same >= 0.97 * len(requests)
    assert min(one.hit_rate, two.hit_rate) >= 0.95 * ideal


def test_requests_spread_evenly_over_router_replicas() -> None:
    """Each request goes to one router replica, uniformly: with 4 routers and 4,000 requests
    each router gets 25% +- 2.5 points, and the outcome names the router the sim chose."""
    requests = [_req(0.01 * i, (i,)) for i in range(4000)]
    sim = ClusterSim([make_policy("round_robin") for _ in range(4)], ClusterConfig(service=FAST))
    sim.add_replica("r0")
    result = sim.run(requests)
    shares = Counter(o.router for o in result.outcomes)
    assert set(shares) == {0, 1, 2, 3}
    assert all(abs(n / len(requests) - 0.25) <= 0.025 for n in shares.values())
    assert all(o.router == sim.router_of(o.index) for o in result.outcomes)


def test_sglang_router_replica_knows_only_the_prefixes_it_routed() -> None:
    """With 3 SGLang-style routers, the union of router k's trees is exactly the blocks of
    the requests router k routed: the others' traffic leaves no trace in its state."""
    requests = scale_arrivals(SharedPrefixGroups(requests=300).generate(), 0.05)
    policies = [SglangCacheAwarePolicy() for _ in range(3)]
    sim = ClusterSim(policies, ClusterConfig(service=ServiceModel(cache_blocks=4096)))
    for i in range(4):
        sim.add_replica(f"r{i}")
    result = sim.run(requests)
    backends = sim.ready_backends()
    for k, policy in enumerate(policies):
        routed = {
            b
            for o in result.outcomes
            if o.router == k
            for b in chain_block_ids(requests[o.index].block_ids)
        }
        known = set().union(*(policy.tree(b) for b in backends))
        assert routed and known == routed


@pytest.mark.parametrize("policy", ["two_choice", "sglang_cache_aware"])
def test_per_router_memory_starts_cold_on_each_router_replica(policy: str) -> None:
    """40 conversations, each asked 8 times, spread over R routers: a router that remembers
    placements (two-choice's last choice, SGLang-style trees) places its own first request of
    a conversation without affinity, because the other routers' placements are not its state;
    every later request of it at that router is an affinity hit. So the cold decisions are
    exactly the first (router, conversation) pairs: 40 with one router, more with four."""
    conversations = 40
    requests = [
        _req(0.05 * (turn * conversations + c), (c, 1000 + c, 2000 + c))
        for turn in range(8)
        for c in range(conversations)
    ]
    cold_counts = []
    for routers in (1, 4):
        sim = ClusterSim(
            [make_sim_policy(policy) for _ in range(routers)], ClusterConfig(service=FAST)
        )
        for i in range(4):
            sim.add_replica(f"r{i}")
        result = sim.run(requests)
        firsts: dict[tuple[int | None, int], int] = {}
        for o in result.outcomes:
            firsts.setdefault((o.router, requests[o.index].block_ids[0]), o.index)
        cold = {o.index for o in result.outcomes if o.reason != "affinity"}
        assert cold == set(firsts.values())
        cold_counts.append(len(cold))
    assert cold_counts[0] == conversations < cold_counts[1]
