"""The committed benchmark results are the shipped code's: parts of the result files, run
again with the options each file records, give the committed figures exactly. The three
benchmarks checked here are deterministic simulations (only CPU and wall times depend on the
machine).

- ``bench replay``: one row of each file, PEEK, its setting variants where the file has them,
  and FCFS. The row is the cheapest one where PEEK reorders (admits from its cache lane) and
  holds siblings, so the check covers what PEEK adds at the least cost. A change to one of the
  other baselines alone is not caught: that needs their rows re-run too (about 30 s a row).
- ``bench faults``: prefix-affinity in every scenario.
- ``bench cluster --name cluster-routers``: prefix-affinity with and without engine events on
  the Mooncake trace, 8 engines, every router count.

A change to a scheduler or router policy, to a simulator or its workloads, or to vLLM that
moves a committed figure fails here until the file is re-run with its command (docs/benchmarks.md,
"Reproduce").
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from prefixserving_lab.models.schedulers.registry import BASELINE, PEEK_POLICIES

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RERUN = "Re-run the file with its command (docs/benchmarks.md, Reproduce)."
# PEEK, its setting variants (lab: models/schedulers/peek_variants.py) and the baseline.
REPLAY_POLICIES = (*PEEK_POLICIES, BASELINE)


def _row(data: dict[str, Any]) -> str | None:
    """The sharing row with the least PEEK wall time among those where PEEK admitted from its
    cache lane and held a sibling; None when there is none (the overhead file)."""
    rows = []
    for workload in data.get("workloads", []):
        peek = workload["runs"].get("peek")
        if workload.get("role") != "sharing" or peek is None:
            continue
        stats = peek["policy_stats"]
        if stats.get("admitted", {}).get("cache", 0) and stats.get("sibling_holds", 0):
            rows.append((peek["wall_s"], workload["name"]))
    return min(rows)[1] if rows else None


def _checked_files() -> list[Path]:
    return [
        path
        for path in sorted(RESULTS.glob("replay-*.json"))
        if _row(json.loads(path.read_text())) is not None
    ]


def _replay_cases() -> list[tuple[Path, str]]:
    """(file, policy) for every policy of ``REPLAY_POLICIES`` that the file's row ran."""
    cases = []
    for path in _checked_files():
        data = json.loads(path.read_text())
        row = _row(data)
        (ran,) = [w["runs"] for w in data["workloads"] if w["name"] == row]
        cases += [(path, policy) for policy in REPLAY_POLICIES if policy in ran]
    return cases


def test_every_sweep_and_comparison_file_is_checked() -> None:
    """The sweeps (scale 0.125 and full size, each also on the held-out seed 1) and the
    comparisons of PEEK's variants each have a row to re-run."""
    names = {path.stem for path in _checked_files()}
    assert {
        "replay-sweep-default",
        "replay-sweep-default-headers",
        "replay-sweep-default-headers-seed1",
        "replay-sweep-gpu",
        "replay-sweep-gpu-headers",
        "replay-sweep-gpu-headers-seed1",
        "replay-response-ratio",
        "replay-response-ratio-gpu",
        "replay-sweep-full-default",
        "replay-sweep-full-gpu",
        "replay-sweep-full-default-seed1",
        "replay-sweep-full-gpu-seed1",
        "replay-decode-headroom",
        "replay-decode-headroom-gpu",
        "replay-cache-share",
        "replay-cache-share-headers",
        "replay-cache-share-gpu",
        "replay-cache-share-gpu-headers",
        "replay-overtakes",
        "replay-overtakes-gpu",
        "replay-overtakes-seed1",
        "replay-overtakes-gpu-seed1",
        "replay-opt-ins",
        "replay-opt-ins-gpu",
        "replay-opt-ins-seed1",
        "replay-opt-ins-gpu-seed1",
        "replay-opt-ins-headers",
        "replay-opt-ins-gpu-headers",
        "replay-opt-ins-headers-seed1",
        "replay-opt-ins-gpu-headers-seed1",
    } <= names


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "policy"), _replay_cases(), ids=lambda case: getattr(case, "stem", case)
)
def test_a_committed_row_replays_to_the_same_figures(path: Path, policy: str) -> None:
    from prefixserving_lab.runners.replay_bench import rerun
    from prefixserving_lab.runners.replay_metrics import MACHINE_METRICS

    data = json.loads(path.read_text())
    row = _row(data)
    assert row is not None
    (committed,) = [w["runs"][policy] for w in data["workloads"] if w["name"] == row]
    got = rerun(data["settings"]["options"], row, policy)

    def simulated(metrics: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in metrics.items() if k not in MACHINE_METRICS}

    assert simulated(got) == simulated(committed), (
        f"{path.relative_to(ROOT)} is stale: {policy} on {row} no longer gives its figures. {RERUN}"
    )


@pytest.mark.slow
def test_rerun_refuses_rows_it_cannot_rebuild() -> None:
    from prefixserving_lab.runners.replay_bench import rerun

    with pytest.raises(ValueError, match="standard workloads with a named cost model"):
        rerun({"trace": "/tmp/trace.jsonl"}, "trace-x@1", "peek")
    with pytest.raises(ValueError, match="standard workloads with a named cost model"):
        rerun({"cost": "0.01,0.00004,0.0005,0"}, "docs@1", "peek")


FAULTS = RESULTS / "faults.json"


@pytest.mark.parametrize(
    "scenario", ["router-restart", "engines-out", "rolling-update", "rolling-update-no-handover"]
)
def test_the_committed_fault_series_of_prefix_affinity_replay_exactly(
    scenario: str, shared_dir: Path
) -> None:
    from prefixserving_lab.cli.cluster import DEFAULT_TRACE
    from prefixserving_lab.runners.cluster import OURS
    from prefixserving_lab.runners.faults import rerun

    data = json.loads(FAULTS.read_text())
    assert data["workload"] == DEFAULT_TRACE.stem
    (committed,) = [s for s in data["runs"][OURS] if s["scenario"] == scenario]
    got = rerun(data, DEFAULT_TRACE, OURS, scenario)
    # JSON text, so that NaN ratios (buckets without steady requests) compare equal.
    assert json.dumps({**asdict(got), "met": got.met}, sort_keys=True) == json.dumps(
        committed, sort_keys=True
    ), f"{FAULTS.relative_to(ROOT)} is stale: {OURS} {scenario} moved. {RERUN}"


CLUSTER_ROUTERS = RESULTS / "cluster-routers.json"
# The file's command in docs/benchmarks.md: default trace, sizes and time scale, so its rows can be
# rebuilt from the defaults.
CLUSTER_ROUTERS_COMMAND = (
    "prefixserving bench cluster --replicas 8 --replicas 16 --routers 1 --routers 2 --routers 4"
    " --routers 8 --policy prefix-affinity --policy prefix-affinity-events --policy two-choice"
    " --policy kubeai-chwbl --policy sglang-cache-aware --name cluster-routers"
)


def test_the_committed_router_replica_rows_of_prefix_affinity_replay_exactly(
    shared_dir: Path,
) -> None:
    from prefixserving_lab.cli.cluster import DEFAULT_TRACE
    from prefixserving_lab.models.replica import ServiceModel
    from prefixserving_lab.runners.cluster import OURS, Workload, run_bench
    from prefixserving_lab.workloads.traces import load_mooncake

    data = json.loads(CLUSTER_ROUTERS.read_text())
    assert data["command"] == CLUSTER_ROUTERS_COMMAND
    workload = Workload(DEFAULT_TRACE.stem, tuple(load_mooncake(DEFAULT_TRACE)))
    policies = [OURS, f"{OURS}_events"]
    routers = sorted({r["routers"] for r in data["rows"]})
    got = run_bench(
        [workload],
        [8],
        routers,
        policies,
        service=ServiceModel(),
        cache_blocks=None,
        time_scale=None,
        utilization=data["utilization"],
        kv_event_lag_s=data["kv_event_lag_s"],
    )
    committed = [
        r
        for r in data["rows"]
        if r["workload"] == workload.name and r["replicas"] == 8 and r["policy"] in policies
    ]
    key = ("routers", "policy")
    assert sorted((asdict(r) for r in got), key=lambda r: [r[k] for k in key]) == sorted(
        committed, key=lambda r: [r[k] for k in key]
    ), f"{CLUSTER_ROUTERS.relative_to(ROOT)} is stale. {RERUN}"
