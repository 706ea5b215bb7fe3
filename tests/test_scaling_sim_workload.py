"""The bursty conversation workload and the fleet pieces the scaling simulation builds on."""

from __future__ import annotations

from prefixserving.router.hot import choose_prefixes
from prefixserving.router.policies.registry import make_policy
from prefixserving_lab.models.cluster import ClusterSim
from prefixserving_lab.models.fleet import Fleet, HotPrefixWindow, PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.workloads.blocks import chain_block_ids
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape, compress
from prefixserving_lab.workloads.traces import TraceRequest


def steady_trace(count: int, every_s: float = 1.0, tokens: int = 1000) -> list[TraceRequest]:
    return [TraceRequest(i * every_s, tokens, 50) for i in range(count)]


def test_compress_runs_bursts_faster_and_repeats_the_trace() -> None:
    schedule = BurstSchedule(
        duration_s=300.0, base_scale=1.0, burst_scale=4.0, bursts=((100.0, 150.0),)
    )
    out = compress(steady_trace(120), schedule)
    arrivals = [r.arrival_s for r in out]
    assert arrivals == sorted(arrivals) and arrivals[-1] < 300.0
    in_burst = sum(1 for t in arrivals if 100.0 <= t < 150.0)
    before = sum(1 for t in arrivals if 50.0 <= t < 100.0)
    assert before == 50 and abs(in_burst - 4 * before) <= 2
    assert len(out) > 120, "the trace repeats to fill the schedule"


def test_conversation_shape_shares_system_prompts_and_histories() -> None:
    shape = ConversationShape(apps=4, system_tokens=256, followup_p=0.5, block_tokens=128, seed=3)
    requests = [TraceRequest(float(i), 300 + 40 * (i % 30), 20) for i in range(400)]
    shaped = shape.apply(requests)
    assert shape.apply(requests) == shaped, "deterministic"
    assert all(len(r.block_ids) == -(-r.input_tokens // 128) for r in shaped)
    systems = {r.block_ids[:2] for r in shaped}
    assert len(systems) <= 4, "every request opens with one of the apps' system prompts"
    followups = [
        r for r in shaped if any(r.block_ids[:3] == o.block_ids[:3] and o is not r for o in shaped)
    ]
    assert followups, "follow-up turns resend an earlier turn's history"
    again = ConversationShape(apps=4, system_tokens=256, followup_p=0.0, seed=3).apply(requests)
    deeper = [r for r in again if len(r.block_ids) > 2]
    assert len({r.block_ids[2] for r in deeper}) == len(deeper), (
        "no follow-ups: nothing else shared"
    )


def test_hot_prefix_window_gives_shared_prefixes_hottest_first() -> None:
    hot_doc = (1, 2, 3)
    requests = [TraceRequest(float(i), 512, 10, (*hot_doc, 100 + i), 128) for i in range(5)]
    requests += [TraceRequest(5.0 + i, 512, 10, (1, 2, 9, 200 + i), 128) for i in range(2)]
    requests += [TraceRequest(8.0, 512, 10, (7, 7, 7, 7), 128)]
    window = HotPrefixWindow(requests, window_s=100.0, min_hits=2)
    hot = window.hot(10.0)
    # (1) and (1, 2) are in 7 requests, (1, 2, 3) in 5, (1, 2, 9) in 2; (7, ...) only once.
    expected = [(1,), (1, 2), hot_doc, (1, 2, 9)]
    assert hot == [chain_block_ids(ids) for ids in expected]
    # As the router's endpoint chooses: a deeper prefix replaces its ancestor in its slot.
    deepest = [chain_block_ids(hot_doc), chain_block_ids((1, 2, 9))]
    assert choose_prefixes(hot, lambda c: c, 10) == deepest
    assert choose_prefixes(hot, lambda c: c, 1) == deepest[:1]
    assert HotPrefixWindow(requests, window_s=2.0, min_hits=2).hot(10.0) == []


def test_fleet_removes_loading_pods_first_then_the_newest() -> None:
    service = ServiceModel(block_tokens=128, cache_blocks=64)
    policy = make_policy("prefix-affinity")
    fleet = Fleet(PodLifecycle(load_s=30.0, warmup=False), policy, service)
    sim = ClusterSim(policy)
    fleet.seed(sim, 2)
    sim.now = 10.0
    fleet.scale_to(sim, 4)
    assert fleet.size == 4 and fleet.loading() == 2
    fleet.scale_to(sim, 3)
    assert sorted(fleet.pods) == ["pod-0", "pod-1", "pod-2"], "the newest loading pod goes"
    fleet.scale_to(sim, 1)
    assert sorted(fleet.pods) == ["pod-0"], "loading pod-2 first, then the newer seeded pod-1"
