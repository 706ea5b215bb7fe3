"""Figures and files of the simulation benchmarks: quantiles and hit rates of request
outcomes, ``<name>.json`` plus a short ``<name>.md`` table with the machine they ran on."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from prefixserving_lab.models.cluster import Outcome
from prefixserving_lab.runners.cluster import machine_description


def machine() -> dict[str, object]:
    """Cores, CPU model and load average (other jobs on the machine show up there)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"description": machine_description(), "load_average_1m": round(load[0], 2)}


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (as ``ClusterResult.ttft_quantile``); NaN for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def hit_rate(outcomes: Sequence[Outcome]) -> float:
    """Cached prompt tokens over prompt tokens of ``outcomes``; NaN for none."""
    total = sum(o.input_tokens for o in outcomes)
    return sum(o.hit_tokens for o in outcomes) / total if total else float("nan")


def fmt(value: object, digits: int = 3) -> str:
    """A table cell: floats rounded, None and NaN as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _finite(value: object) -> object:
    """``value`` with NaN and infinities replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_results(out_dir: Path, name: str, payload: dict[str, object], markdown: str) -> Path:
    """Write ``name.json`` and ``name.md`` into ``out_dir``; return the JSON path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    text = json.dumps(_finite(payload), indent=2, sort_keys=True, allow_nan=False, default=str)
    path.write_text(text + "\n")
    (out_dir / f"{name}.md").write_text(markdown.rstrip() + "\n")
    return path
