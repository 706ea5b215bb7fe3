"""``demo.md`` and ``demo.png``: the demo's two stacks side by side."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

TITLE = "The local stack against a baseline stack (`prefixserving demo`)"

if TYPE_CHECKING:
    from prefixserving_lab.runners.stack.demo import StackResult


def markdown(results: Sequence[StackResult], machine: str) -> str:
    """Both stacks as a table, their ratios, and ``machine`` (the machine line)."""
    ours, base = results
    lines = [
        f"# {TITLE}",
        "",
        f"Machine: {machine}",
        "",
        "| stack | scheduler | router | warm-up | hit rate | TTFT p50 (s) | TTFT p99 (s) "
        "| throughput (req/s) | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.stack} | {r.scheduler} | {r.router_policy} | {'yes' if r.warmup else 'no'} "
            f"| {r.hit_rate:.3f} | {r.ttft_p50_s:.3f} | {r.ttft_p99_s:.3f} "
            f"| {r.throughput_rps:.2f} | {r.errors} |"
        )
    lines += [
        "",
        "Ratios (prefixserving / baseline): "
        f"hit rate {ours.hit_rate / max(base.hit_rate, 1e-9):.2f}x, "
        f"TTFT p50 {ours.ttft_p50_s / base.ttft_p50_s:.2f}x, "
        f"TTFT p99 {ours.ttft_p99_s / base.ttft_p99_s:.2f}x, "
        f"throughput {ours.throughput_rps / max(base.throughput_rps, 1e-9):.2f}x.",
    ]
    return "\n".join(lines) + "\n"


def chart(results: Sequence[StackResult], path: Path) -> None:
    """``demo.png``: hit rate, TTFT p50 and p99 of both stacks as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.stack for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    panels = [
        ("prefix-cache hit rate", [r.hit_rate for r in results]),
        ("TTFT p50 (s)", [r.ttft_p50_s for r in results]),
        ("TTFT p99 (s)", [r.ttft_p99_s for r in results]),
    ]
    for ax, (title, values) in zip(axes, panels, strict=True):
        ax.bar(names, values, color=["#2a7", "#999"])
        ax.set_title(title)
        for i, v in enumerate(values):
            ax.annotate(f"{v:.2f}", (i, v), ha="center", va="bottom")
    fig.suptitle("PrefixServing vs baseline: same engines, same workload")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
