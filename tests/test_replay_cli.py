"""``prefixserving bench replay`` end to end on a tiny Mooncake-format trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prefixserving.cli import main

pytestmark = pytest.mark.slow  # imports vLLM (the replay runs vLLM's scheduler)


def write_trace(path: Path) -> Path:
    rows = []
    for i in range(12):
        shared = [100, 101] if i % 3 else [200 + i]
        rows.append(
            {
                "timestamp": 200 * i,
                "input_length": 1100,
                "output_length": 4,
                "hash_ids": [*shared, 300 + i, 400 + i][:3],
            }
        )
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_replay_runs_a_policy_subset_on_a_mooncake_file(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "tiny.jsonl")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "replay",
            "--trace",
            str(trace),
            "--policy",
            "sglang_lpm",
            "--policy",
            "trtllm_defer",
            "--time-scale",
            "2",
            "--block-size",
            "16",
            "--cache-blocks",
            "400",
            "--overhead-waiting",
            "",
            "--out-dir",
            str(out),
            "--name",
            "tiny",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "tiny.json").read_text())
    [w] = data["workloads"]
    assert w["name"] == "trace-tiny-2x"
    assert list(w["runs"]) == ["fcfs", "sglang_lpm", "trtllm_defer"]
    assert w["engine"]["num_blocks"] == 400 and w["requests"] == 12
    for m in w["runs"].values():
        assert m["requests"] == 12 and m["hit_rate_matches_vllm"]
    # 8 of 12 requests share two 512-token blocks: the first computes them, later ones hit.
    assert w["runs"]["fcfs"]["hit_rate"] > 0.3
    assert w["ratios"]["fcfs"]["hit_rate"] == 1.0
    assert data["machine"]["cores"] >= 1
    md = (out / "tiny.md").read_text()
    assert "## trace-tiny-2x" in md and "| sglang_lpm |" in md


def test_replay_lists_and_rejects_unknown_policies() -> None:
    listed = CliRunner().invoke(main, ["bench", "replay", "--list"])
    assert listed.exit_code == 0 and "peek" in listed.output and "gsp-q25" in listed.output
    bad = CliRunner().invoke(main, ["bench", "replay", "--policy", "lifo"])
    assert bad.exit_code != 0 and "known: fcfs" in bad.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--loads", "0.5,x"], "--loads"),
        (["--loads", "0"], "positive numbers"),
        (["--sweep", "--trace", "TRACE"], "--trace-load"),
        (["--cost-model", "tpu"], "'default', 'gpu'"),
    ],
)
def test_replay_refuses_bad_sweep_options(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(write_trace(tmp_path / "t.jsonl")) if a == "TRACE" else a for a in args]
    bad = CliRunner().invoke(main, ["bench", "replay", *args, "--out-dir", str(tmp_path)])
    assert bad.exit_code == 2 and message in bad.output, bad.output
    assert not list(tmp_path.glob("*.md"))  # nothing half-written


def test_replay_lists_the_sweep() -> None:
    listed = CliRunner().invoke(main, ["bench", "replay", "--list"])
    sweep = next(line for line in listed.output.splitlines() if line.startswith("sweep:"))
    assert "azure-code" in sweep and "chat-multiturn+hdr16" in sweep


def test_an_unknown_workload_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    args = ["bench", "replay", "--workload", "gsp-q25", "--workload", "nope", "--sweep"]
    bad = CliRunner().invoke(main, [*args, "--out-dir", str(tmp_path)])
    assert bad.exit_code == 1 and "unknown workload(s) ['nope']" in bad.output, bad.output
    assert not list(tmp_path.iterdir())
