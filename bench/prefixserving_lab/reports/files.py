"""The results files every benchmark writes: ``NAME.json`` (the figures, NaN as null) and
``NAME.md`` (the same as tables, with the machine line), and the cells of those tables."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path


def fmt(value: object, digits: int = 3) -> str:
    """A table cell: floats rounded, None and NaN as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table of ``rows`` under ``header``, every cell through :func:`fmt`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def rounded(value: object, digits: int = 4) -> object:
    """A figure for a summary: floats rounded to ``digits``, NaN as None, the rest as is."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, digits)
    return value


def _finite(value: object) -> object:
    """``value`` with NaN and infinities replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def write_results(
    out_dir: Path, name: str, payload: dict[str, object], markdown: str
) -> tuple[Path, Path]:
    """Write ``name.json`` (``payload``, NaN and infinities as null, keys sorted) and
    ``name.md`` into ``out_dir``; return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    text = json.dumps(_finite(payload), indent=2, sort_keys=True, allow_nan=False, default=str)
    json_path.write_text(text + "\n")
    md_path.write_text(markdown.rstrip() + "\n")
    return json_path, md_path
