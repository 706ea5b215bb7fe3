"""The simulator's KV cache events: what a router following them knows is each replica's
real cache state, ``kv_event_lag_s`` late; and the benchmark's engine-events row and goal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixserving.router.policies.base import Decision, RoutingContext
from prefixserving.router.policies.prefix_affinity import PrefixAffinityPolicy
from prefixserving_lab.cli.cluster import cluster
from prefixserving_lab.machine import machine
from prefixserving_lab.models.cluster import ClusterConfig, ClusterSim
from prefixserving_lab.models.kv_events import KvEventIndex
from prefixserving_lab.models.peer_routers import follows_kv_events, make_sim_policy
from prefixserving_lab.models.replica import BlockCache, ServiceModel
from prefixserving_lab.reports.cluster import render_markdown
from prefixserving_lab.runners.cluster import RunRow, events_verdicts, scaling_verdicts, verdicts
from prefixserving_lab.workloads.traces import TraceRequest

FAST = ServiceModel(
    prefill_s_per_token=0.001,
    prefill_overhead_s=0.0,
    decode_s_per_token=0.01,
    block_tokens=4,
    cache_blocks=64,
)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_event_reaches_the_index_after_the_lag() -> None:
    clock = _Clock()
    index = KvEventIndex(clock, lag_s=0.5)
    cache = BlockCache(2, index.listener("a"))
    index.listener("b")
    cache.pin((1, 2), 0)
    assert index.cached((1, 2, 3), ("a", "b")) == {"a": 0, "b": 0}
    clock.now = 0.5
    assert index.cached((1, 2, 3), ("a", "b")) == {"a": 2, "b": 0}
    cache.release((1, 2), 0)
    cache.pin((7,), 0)  # a full cache evicts its least recently used block: 1
    clock.now = 0.9
    assert index.cached((1, 2), ("a",)) == {"a": 2}  # the removal is still in transit
    clock.now = 1.0
    assert index.cached((1, 2), ("a",)) == {"a": 0}
    assert index.cached((2,), ("a",)) == {"a": 1}


def test_a_forgotten_replica_drops_its_events_in_transit() -> None:
    clock = _Clock()
    index = KvEventIndex(clock, lag_s=1.0)
    BlockCache(4, index.listener("a")).warm((1, 2))
    index.forget("a")
    clock.now = 2.0
    assert index.cached((1, 2), ("a",)) == {"a": 0}
    with pytest.raises(ValueError, match="lag_s"):
        KvEventIndex(clock, lag_s=-1.0)


class _Recording(PrefixAffinityPolicy):
    """prefix_affinity that checks, per request, ``cached`` against the replicas' caches."""

    def __init__(self) -> None:
        super().__init__()
        self.sim: ClusterSim | None = None
        self.seen: list[tuple[float, dict[str, int], dict[str, int]]] = []

    def select(self, ctx: RoutingContext) -> Decision:
        assert self.sim is not None
        truth = {b: self.sim.replicas[b].cache.hit_blocks(ctx.blocks) for b in ctx.backends}
        self.seen.append((self.sim.now, dict(ctx.cached), truth))
        return super().select(ctx)


def _run(lag_s: float, requests: list[TraceRequest]) -> _Recording:
    policy = _Recording()
    sim = ClusterSim(policy, ClusterConfig(service=FAST, kv_events=True, kv_event_lag_s=lag_s))
    policy.sim = sim
    for name in ("a", "b", "c"):
        sim.add_replica(name)
    sim.run(requests)
    return policy


def _conversations() -> list[TraceRequest]:
    """Three conversations of growing turns, interleaved, 0.3 s apart."""
    out = []
    for turn in range(1, 5):
        for c in range(3):
            ids = tuple(100 * c + i for i in range(2 * turn))
            out.append(TraceRequest(0.9 * turn + 0.3 * c, len(ids) * 4, 2, ids, 4))
    return out


def test_without_lag_the_router_sees_every_replica_cache_exactly() -> None:
    policy = _run(0.0, _conversations())
    assert len(policy.seen) == 12
    for _, cached, truth in policy.seen:
        assert cached == truth
    assert any(any(truth.values()) for _, _, truth in policy.seen)  # later turns hit


def test_with_lag_the_router_sees_the_caches_as_they_were() -> None:
    first = TraceRequest(0.0, 12, 1, (1, 2, 3), 4)
    soon = TraceRequest(0.05, 12, 1, (1, 2, 3), 4)
    late = TraceRequest(2.0, 12, 1, (1, 2, 3), 4)
    policy = _run(0.5, [first, soon, late])
    (_, at_first, _), (_, at_soon, truth_soon), (_, at_late, truth_late) = policy.seen
    assert not any(at_first.values())
    assert not any(at_soon.values()) and any(truth_soon.values())  # stored, not yet told
    assert at_late == truth_late and max(at_late.values()) == 3


def test_the_events_row_is_prefix_affinity_fed_with_cached() -> None:
    assert follows_kv_events("prefix-affinity-events")
    assert not follows_kv_events("prefix-affinity")
    assert isinstance(make_sim_policy("prefix-affinity-events"), PrefixAffinityPolicy)


def _row(policy: str, hit: float, routers: int, replicas: int = 4) -> RunRow:
    return RunRow(
        "w", replicas, routers, policy, 1.0, 10, 0.9, hit, hit / 0.9, 1.1, 1.1, 0.1, 1.0, {}
    )


def test_the_events_goal_compares_one_router_with_the_best_peer() -> None:
    rows = [
        _row("prefix_affinity", 0.600, 1),
        _row("prefix_affinity_events", 0.640, 1),
        _row("two_choice", 0.645, 1),  # the best peer: 0.640 / 0.645 = 99.2%, met
        _row("sglang_cache_aware", 0.630, 1),
        _row("round_robin", 0.700, 1),  # not a peer of the goal
        _row("prefix_affinity_events", 0.620, 4),  # 96.9% of its own 1 router
        _row("two_choice", 0.500, 4),
        _row("prefix_affinity_events", 0.600, 1, replicas=8),
        _row("two_choice", 0.700, 1, replicas=8),  # 85.7%: missed
    ]
    (four, eight) = events_verdicts(rows)
    assert (four.replicas, four.best_peer, four.met) == (4, "two_choice", True)
    assert four.of_best_peer == pytest.approx(0.640 / 0.645, abs=1e-4)
    assert (eight.replicas, eight.met) == (8, False)
    (scaling,) = scaling_verdicts(rows)
    assert (scaling.policy, scaling.routers, scaling.within_goal_met) == (
        "prefix_affinity_events",
        4,
        False,
    )
    meta = {"command": "c", "machine": machine(), "wall_s": 1.0, "service": "s", "utilization": 0.5}
    markdown = render_markdown(rows, verdicts(rows), meta)
    assert "| w | 4 | two_choice | 99.2% | met |" in markdown
    assert "| w | 8 | two_choice | 85.7% | missed |" in markdown
    assert "Met in 1 of 2 cases." in markdown
    assert "| w | 4 | 4 | prefix_affinity_events | 62.0% | 96.9% |" in markdown
    assert "- prefix_affinity_events: within 1.0% of one router in 0 of 1 cases" in markdown


def test_cli_runs_the_events_row(tmp_path: Path, shared_dir: Path) -> None:
    args = ["--trace", str(shared_dir / "traces" / "mooncake-synthetic.jsonl"), "--no-groups"]
    args += ["--limit", "120", "--replicas", "2", "--routers", "1", "--kv-event-lag", "0"]
    args += ["--policy", "prefix-affinity-events", "--policy", "two-choice"]
    result = CliRunner().invoke(cluster, [*args, "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "cluster.json").read_text())
    assert [r["policy"] for r in data["rows"]] == ["prefix_affinity_events", "two_choice"]
    assert data["events_verdicts"][0]["best_peer"] == "two_choice"
    assert "--kv-event-lag 0" in data["command"]
    markdown = (tmp_path / "cluster.md").read_text()
    assert "## Goal: engine events at one router" in markdown
    assert "reach every router replica 0 ms (simulated)" in markdown
