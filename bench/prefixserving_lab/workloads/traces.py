"""Trace loaders: Mooncake-format JSONL (prefix structure as block hash ids) and the Azure LLM
inference CSVs (arrivals and lengths only, no sharing).

Both return :class:`TraceRequest` rows sorted by arrival time, with arrival in seconds from the
first request. ``time_scale`` compresses time: 4.0 replays four times faster.

The benchmarks' traces live in one folder, :func:`traces_dir`: ``$PREFIXSERVING_TRACES``, or
``shared/traces`` beside the repository. The files they read by default are named here.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512

TRACES_ENV = "PREFIXSERVING_TRACES"
MOONCAKE_FILE = "mooncake-synthetic.jsonl"
AZURE_CODE_FILE = "azure-code-2023.csv"
AZURE_CONVERSATION_FILE = "azure-conv-2023.csv"


def traces_dir() -> Path:
    """``$PREFIXSERVING_TRACES``, or ``shared/traces`` beside the repository."""
    default = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
    return Path(os.environ.get(TRACES_ENV, default)).resolve()


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace.

    ``block_ids``: one id per ``block_tokens``-token prompt block; equal leading ids mean a
    shared prefix (empty for traces that carry no prefix information).
    """

    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...] = ()
    block_tokens: int = MOONCAKE_BLOCK_TOKENS


def load_mooncake(
    path: Path, *, time_scale: float = 1.0, limit: int | None = None
) -> list[TraceRequest]:
    """Load a Mooncake-format trace: one JSON object per line with ``timestamp`` (ms),
    ``input_length``, ``output_length`` and ``hash_ids`` (one per 512-token block)."""
    rows = []
    for line in _lines(path, limit):
        row = json.loads(line)
        rows.append(
            TraceRequest(
                arrival_s=float(row["timestamp"]) / 1000.0,
                input_tokens=int(row["input_length"]),
                output_tokens=max(1, int(row["output_length"])),
                block_ids=tuple(int(h) for h in row["hash_ids"]),
            )
        )
    return _rebase(rows, time_scale)


def load_azure(
    path: Path, *, time_scale: float = 1.0, limit: int | None = None
) -> list[TraceRequest]:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``)."""
    rows = []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit is not None and i >= limit:
                break
            stamp = datetime.fromisoformat(row["TIMESTAMP"][:26])
            rows.append(
                TraceRequest(
                    arrival_s=stamp.timestamp(),
                    input_tokens=int(row["ContextTokens"]),
                    output_tokens=max(1, int(row["GeneratedTokens"])),
                )
            )
    return _rebase(rows, time_scale)


def _lines(path: Path, limit: int | None) -> Iterator[str]:
    with path.open() as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                return
            if line.strip():
                yield line


def _rebase(rows: list[TraceRequest], time_scale: float) -> list[TraceRequest]:
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    rows.sort(key=lambda r: r.arrival_s)
    if not rows:
        return rows
    t0 = rows[0].arrival_s
    return [
        TraceRequest(
            arrival_s=(r.arrival_s - t0) / time_scale,
            input_tokens=r.input_tokens,
            output_tokens=r.output_tokens,
            block_ids=r.block_ids,
            block_tokens=r.block_tokens,
        )
        for r in rows
    ]
