"""Peer baselines, fleet sizing, goal verdicts and the ``bench cluster`` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixserving.router.policies.base import BackendLoad, DecisionReason, RoutingContext
from prefixserving_lab.cli.cluster import cluster
from prefixserving_lab.machine import machine
from prefixserving_lab.models.peer_routers import (
    KubeaiChwblPolicy,
    SglangCacheAwarePolicy,
    make_sim_policy,
)
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.reports.cluster import render_markdown
from prefixserving_lab.runners.cluster import (
    RunRow,
    Workload,
    auto_cache_blocks,
    auto_time_scale,
    run_one,
    scaling_verdicts,
    verdicts,
)
from prefixserving_lab.workloads.blocks import SharedPrefixGroups, scale_arrivals

BACKENDS = ("a", "b", "c", "d")


def test_kubeai_hashes_only_the_first_block() -> None:
    policy = KubeaiChwblPolicy()
    chosen = {policy.select(RoutingContext((42, tail), BACKENDS)).backend for tail in range(50)}
    assert len(chosen) == 1
    spread = {policy.select(RoutingContext((head, 1), BACKENDS)).backend for head in range(200)}
    assert spread == set(BACKENDS)


def test_kubeai_walks_the_ring_past_a_loaded_backend() -> None:
    policy = KubeaiChwblPolicy()
    first = policy.select(RoutingContext((42,), BACKENDS)).backend
    loads = {b: BackendLoad(in_flight=1) for b in BACKENDS}
    loads[first] = BackendLoad(in_flight=4)  # 4 + 1 > 1.25 * 8 / 4
    decision = policy.select(RoutingContext((42,), BACKENDS, loads))
    assert decision.backend != first
    assert decision.reason is DecisionReason.SPILLED


def test_sglang_follows_the_longest_match_then_the_smallest_tree() -> None:
    policy = SglangCacheAwarePolicy()
    first = policy.select(RoutingContext((1, 2, 3, 4), BACKENDS))
    assert first.reason is DecisionReason.BALANCE
    again = policy.select(RoutingContext((1, 2, 3, 9), BACKENDS))
    assert again[:2] == (first.backend, DecisionReason.AFFINITY)  # 3 of 4 blocks match > 0.5
    other = policy.select(RoutingContext((1, 7, 8, 9), BACKENDS))  # 1 of 4: smallest tree
    assert other.backend != first.backend and other.reason is DecisionReason.BALANCE


def test_sglang_rebalances_only_past_both_thresholds() -> None:
    policy = SglangCacheAwarePolicy()
    home = policy.select(RoutingContext((1, 2), BACKENDS)).backend
    loads = {b: BackendLoad(in_flight=10) for b in BACKENDS}
    loads[home] = BackendLoad(in_flight=40)  # gap 30 <= 32: keep the match
    assert policy.select(RoutingContext((1, 2), BACKENDS, loads)).backend == home
    loads[home] = BackendLoad(in_flight=43)  # gap 33 > 32 and 43 > 1.1 * 10
    decision = policy.select(RoutingContext((1, 2), BACKENDS, loads))
    assert decision.backend != home and decision.reason is DecisionReason.FALLBACK


def test_bench_names_cover_router_policies_and_baselines() -> None:
    assert make_sim_policy("prefix-affinity").name == "prefix_affinity"
    assert make_sim_policy("sglang-cache-aware").name == "sglang_cache_aware"
    with pytest.raises(ValueError, match="unknown routing policy"):
        make_sim_policy("nope")


def test_auto_time_scale_gives_the_target_prefill_utilization() -> None:
    workload = Workload("g", tuple(SharedPrefixGroups(requests=400).generate()))
    model = ServiceModel(cache_blocks=1 << 16)
    scale = auto_time_scale(workload, 1, model, 0.5)
    result = run_one(workload, 1, 1, "round_robin", model, scale)
    duration = scale_arrivals(workload.requests, scale)[-1].arrival_s
    assert result.replicas["replica-0"].prefill_busy_s / duration == pytest.approx(0.5, rel=0.02)


def test_auto_cache_blocks_splits_the_footprint_with_room_for_the_bound() -> None:
    workload = Workload("g", tuple(SharedPrefixGroups(requests=100).generate()))
    assert auto_cache_blocks(workload, 4) == -(-5 * workload.footprint_blocks // 16)


def _row(policy: str, hit: float, balance: float, routers: int = 1) -> RunRow:
    return RunRow(
        "w", 4, routers, policy, 1.0, 100, 0.6, hit, hit / 0.6, balance, balance, 1, 2, {}
    )


def test_verdict_requires_hit_balance_and_the_lead() -> None:
    rows = [
        _row("prefix_affinity", 0.59, 1.10),
        _row("two_choice", 0.58, 1.05),
        _row("round_robin", 0.30, 1.00),
    ]
    (verdict,) = verdicts(rows)
    assert verdict.met and verdict.two_choice_wins is False
    rows.append(_row("sglang_cache_aware", 0.60, 1.40))  # better hit, worse balance: ignored
    assert verdicts(rows)[0].met
    rows.append(_row("least_loaded", 0.595, 1.20))  # better hit, balance within 1.25: counts
    (verdict,) = verdicts(rows)
    assert not verdict.met and verdict.behind == ("least_loaded",)
    (verdict,) = verdicts([_row("prefix_affinity", 0.50, 1.30), _row("two_choice", 0.55, 1.30)])
    assert not verdict.hit_goal_met and not verdict.balance_goal_met
    assert verdict.two_choice_wins


def test_default_verdict_follows_the_deployed_router_count() -> None:
    rows = [
        _row("prefix_affinity", 0.50, 1.10, routers=1),
        _row("two_choice", 0.58, 1.05, routers=1),
        _row("prefix_affinity", 0.57, 1.10, routers=2),
        _row("two_choice", 0.52, 1.05, routers=2),
    ]
    meta = {"command": "c", "machine": machine(), "wall_s": 1.0, "service": "s", "utilization": 0.5}
    deployed_two = render_markdown(rows, verdicts(rows), {**meta, "deployed_routers": 2})
    assert "| 1 | 1 of 1 |" in deployed_two and "| 2 | 0 of 1 |" in deployed_two
    assert "default should be **prefix-affinity**" in deployed_two
    deployed_one = render_markdown(rows, verdicts(rows), {**meta, "deployed_routers": 1})
    assert "default should be **two-choice**" in deployed_one


def test_cli_writes_json_and_markdown(tmp_path: Path, shared_dir: Path) -> None:
    result = CliRunner().invoke(
        cluster,
        [
            "--trace",
            str(shared_dir / "traces" / "mooncake-synthetic.jsonl"),
            "--limit",
            "200",
            "--replicas",
            "2",
            "--routers",
            "1",
            "--policy",
            "prefix-affinity",
            "--policy",
            "round-robin",
            "--out-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "cluster.json").read_text())
    assert {(r["workload"], r["policy"]) for r in data["rows"]} == {
        (w, p)
        for w in ("mooncake-synthetic", "shared-prefix-groups")
        for p in ("prefix_affinity", "round_robin")
    }
    assert all(0 <= r["hit_rate"] <= r["ideal_hit_rate"] + 1e-9 for r in data["rows"])
    markdown = (tmp_path / "cluster.md").read_text()
    assert "| 2 | 1 | **prefix_affinity** |" in markdown
    assert "--limit 200" in markdown and "Goal met in" in markdown


def test_cli_rejects_an_unknown_policy(tmp_path: Path) -> None:
    result = CliRunner().invoke(cluster, ["--policy", "random", "--out-dir", str(tmp_path)])
    assert result.exit_code != 0
    assert "kubeai-chwbl" in result.output


def test_scaling_verdict_compares_with_one_router_and_the_peers_from_four() -> None:
    rows = [
        _row("prefix_affinity", 0.600, 1.10, routers=1),
        _row("two_choice", 0.610, 1.05, routers=1),  # ahead at 1 router: not judged there
        _row("prefix_affinity", 0.595, 1.10, routers=2),  # 99.2% of one router: met
        _row("two_choice", 0.600, 1.05, routers=2),  # ahead at 2 routers: not judged yet
        _row("prefix_affinity", 0.590, 1.10, routers=4),  # 98.3%: missed
        _row("sglang_cache_aware", 0.500, 1.05, routers=4),
        _row("prefix_affinity", 0.597, 1.10, routers=8),
        _row("kubeai_chwbl", 0.598, 1.05, routers=8),  # ahead at 8 routers: missed
        _row("round_robin", 0.650, 1.00, routers=8),  # not a peer of the goal
    ]
    by_routers = {v.routers: v for v in scaling_verdicts(rows)}
    assert set(by_routers) == {2, 4, 8}
    assert by_routers[2].met and not by_routers[2].lead_judged
    assert by_routers[2].of_one_router == pytest.approx(0.595 / 0.6, abs=1e-4)
    four = by_routers[4]
    assert not four.within_goal_met and four.lead_judged and four.behind == ()
    eight = by_routers[8]
    assert eight.within_goal_met and eight.behind == ("kubeai_chwbl",) and not eight.met
    meta = {"command": "c", "machine": machine(), "wall_s": 1.0, "service": "s", "utilization": 0.5}
    markdown = render_markdown(rows, verdicts(rows), meta)
    assert "## Goal: router replicas" in markdown
    row = "| w | 4 | 4 | prefix_affinity | 59.0% | 98.3% | - | - | 50.0% | missed (< 99.0% of 1"
    assert row in markdown
    assert (
        "- prefix_affinity: within 1.0% of one router in 2 of 3 cases; ahead of every peer"
        " from 4 routers in 1 of 2 cases." in markdown
    )
    assert "engine events at one router" not in markdown  # no such rows in this run
    assert "Goal: router replicas" not in render_markdown(rows[:2], verdicts(rows[:2]), meta)


def test_cli_name_sets_the_results_files(tmp_path: Path, shared_dir: Path) -> None:
    args = ["--trace", str(shared_dir / "traces" / "mooncake-synthetic.jsonl"), "--no-groups"]
    args += ["--limit", "100", "--replicas", "2", "--routers", "1", "--routers", "4"]
    args += ["--policy", "prefix-affinity", "--policy", "sglang-cache-aware"]
    result = CliRunner().invoke(
        cluster, [*args, "--out-dir", str(tmp_path), "--name", "cluster-routers"]
    )
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cluster-routers.json",
        "cluster-routers.md",
    ]
    data = json.loads((tmp_path / "cluster-routers.json").read_text())
    assert [(v["routers"], v["lead_judged"]) for v in data["scaling_verdicts"]] == [(4, True)]
    bad = CliRunner().invoke(cluster, [*args, "--out-dir", str(tmp_path), "--name", "../x"])
    assert bad.exit_code != 0 and "--name" in bad.output
