"""The goals ``scaling.md`` states, met or missed, read off real simulator runs on a fan-out
that one replica absorbs and on a few cold documents."""

from __future__ import annotations

from dataclasses import replace

from prefixserving_lab.machine import machine
from prefixserving_lab.models.scaling import Burst, ScalingSetup
from prefixserving_lab.reports.scaling import (
    COLD,
    FANOUT,
    best_run,
    goal_lines,
    scaling_markdown,
)
from prefixserving_lab.runners.scaling import WorkloadRuns, matrix, run_scaling
from prefixserving_lab.workloads.traces import TraceRequest
from test_scaling_sim_backlog import BURST_AT_S as COLD_AT_S
from test_scaling_sim_backlog import SETUP as COLD_SETUP
from test_scaling_sim_backlog import cold_documents
from test_scaling_sim_held import BURST_AT_S, SETUP, fanout


def _workload(
    name: str, kind: str, requests: list[TraceRequest], setup: ScalingSetup
) -> WorkloadRuns:
    at = BURST_AT_S if kind == FANOUT else COLD_AT_S
    setup = replace(setup, bursts=(Burst(kind, at, at + 5),))
    outcomes = matrix(requests, setup, ("queue", "backlog", "all"))
    outcomes.append(run_scaling(requests, setup, "all", False))
    return WorkloadRuns(name, f"{name} (test)", setup, len(requests), tuple(outcomes))


def test_goals_are_met_where_the_runs_meet_them_and_the_report_renders() -> None:
    fan = _workload("fan-out", FANOUT, fanout(), SETUP)
    cold = _workload("cold documents", COLD, cold_documents(), COLD_SETUP)
    lines = goal_lines([fan, cold])
    absorbs = next(line for line in lines if "same-prefix burst" in line)
    assert "**met** (peak 1)" in absorbs, absorbs
    assert "`backlog+held`) peak" in absorbs
    reacts = next(line for line in lines if "cold-document burst" in line)
    assert "**met**, first scale-up 0.5 s after" in reacts, reacts
    # On the fan-out the stock queue scales out and backlog does not, at the same TTFT p99.
    versus_stock = next(line for line in lines if "than `queue+held`" in line and "fan-out" in line)
    assert "**met**" in versus_stock, versus_stock
    # The honest queue does not scale out either: backlog saves nothing against it.
    versus_honest = next(line for line in lines if "than `queue` at" in line and "fan-out" in line)
    assert "**missed**" in versus_honest, versus_honest
    assert best_run(fan).peak_replicas == SETUP.min_replicas
    text = scaling_markdown([fan, cold], machine())
    assert text.count("| queue+held | warmed |") == 2
    assert "react s (fan-out)" in text and "react s (cold)" in text
