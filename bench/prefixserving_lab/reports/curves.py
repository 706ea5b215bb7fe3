"""Warm-up curves (:mod:`prefixserving_lab.runners.curves`) in the reports: one markdown table
with the runs side by side, one row per interval, and the same curves as a PNG."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from prefixserving_lab.reports.files import table
from prefixserving_lab.runners.curves import CurveBucket


def curve_table(curves: Mapping[str, Sequence[CurveBucket]]) -> str:
    """One row per interval (age in minutes), per run (``curves``' keys, in order) its request
    count, TTFT p50 and p99 and hit rate. Every curve must have the same intervals."""
    labelled = list(curves.items())
    starts = {tuple(b.start_s for b in buckets) for _, buckets in labelled}
    if len(starts) != 1:
        raise ValueError("curves side by side need the same intervals")
    header = ["minutes"]
    for label, _ in labelled:
        header += [f"{label} n", f"{label} TTFT p50 s", f"{label} TTFT p99 s", f"{label} hit"]
    rows = []
    for index, first in enumerate(labelled[0][1]):
        row: list[object] = [f"{first.start_s / 60:g}-{first.end_s / 60:g}"]
        for _, buckets in labelled:
            b = buckets[index]
            row += [b.requests, b.ttft_p50_s, b.ttft_p99_s, b.hit_rate]
        rows.append(row)
    return table(header, rows)


def curve_chart(
    curves: Mapping[str, Sequence[CurveBucket]], title: str, age: str, path: Path
) -> None:
    """``path`` (PNG): TTFT p99 and hit rate against age in minutes (``age`` says from what),
    one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ttft, hits) = plt.subplots(1, 2, figsize=(11, 3.6))
    for label, buckets in curves.items():
        minutes = [(b.start_s + b.end_s) / 120 for b in buckets]
        ttft.plot(minutes, [b.ttft_p99_s for b in buckets], marker="o", ms=3, label=label)
        hits.plot(minutes, [b.hit_rate for b in buckets], marker="o", ms=3, label=label)
    ttft.set_title("TTFT p99 (s)")
    hits.set_title("prefix-cache hit rate")
    for ax in (ttft, hits):
        ax.set_xlabel(f"minutes after {age}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
