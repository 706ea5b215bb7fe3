"""``prefixserving bench scaling``: the HPA on KV-cache, queue and backlog signals, with new
replicas cold or warmed, in the cluster simulator (see :mod:`prefixserving_lab.runners.scaling`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from prefixserving_lab.cli.options import (
    curve_options,
    curve_spec,
    hot_prefixes_option,
    load_s_option,
    out_dir_option,
    parse_window,
    schedule_options,
)
from prefixserving_lab.machine import machine
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.scaling import SIGNAL_SETS, ScalingSetup
from prefixserving_lab.reports.curves import curve_chart
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.reports.scaling import scaling_curves, scaling_markdown
from prefixserving_lab.runners.scaling import compare
from prefixserving_lab.workloads.conversations import (
    BurstSchedule,
    ConversationShape,
    bursty_conversations,
)


@click.command()
@schedule_options(base_scale=2.0, burst_scale=6.0, bursts=("480:840",))
@click.option(
    "--signals",
    "signal_sets",
    multiple=True,
    type=click.Choice(sorted(SIGNAL_SETS)),
    default=tuple(SIGNAL_SETS),
    show_default=True,
    help="Signal sets to compare (repeatable).",
)
@click.option("--min-replicas", type=int, default=2, show_default=True)
@click.option("--max-replicas", type=int, default=16, show_default=True)
@load_s_option
@hot_prefixes_option
@curve_options
@out_dir_option
def scaling(
    trace: Path,
    duration_s: float,
    base_scale: float,
    burst_scale: float,
    bursts: tuple[str, ...],
    seed: int,
    signal_sets: tuple[str, ...],
    min_replicas: int,
    max_replicas: int,
    load_s: float,
    hot_prefixes: int,
    curve_minutes: float,
    curve_bucket_s: float,
    out_dir: Path,
) -> None:
    """Run the HPA on KV usage, queue depth, backlog seconds and their combinations, cold vs
    warmed new replicas.

    The warm-up curve (TTFT p50/p99 and hit rate of the new replicas per --curve-bucket-s,
    each replica's requests from its own first request, for --curve-minutes) is in both files
    and in OUT_DIR/scaling.png.

    Writes OUT_DIR/scaling.json, OUT_DIR/scaling.md and OUT_DIR/scaling.png. Example:
    prefixserving bench scaling --burst 480:840 --burst-scale 6 --out-dir bench/results
    """
    curve = curve_spec(curve_minutes, curve_bucket_s)
    schedule = BurstSchedule(
        duration_s, base_scale, burst_scale, tuple(parse_window(b) for b in bursts)
    )
    setup = ScalingSetup(
        schedule=schedule,
        shape=ConversationShape(seed=seed),
        lifecycle=PodLifecycle(load_s=load_s, hot_prefixes=hot_prefixes),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )
    record = machine()
    requests = bursty_conversations(schedule, setup.shape, trace)
    click.echo(f"{len(requests)} requests over {duration_s:.0f} s; running {len(signal_sets) * 3}")
    outcomes = compare(requests, setup, signal_sets, curve)
    payload = {
        "benchmark": "scaling",
        "machine": record,
        "trace": trace.name,
        "requests": len(requests),
        "setup": asdict(setup),
        "curve": asdict(curve),
        "runs": [
            {**o.summary(), "syncs": [asdict(s) for s in o.syncs if s.desired != s.current]}
            for o in outcomes
        ],
    }
    text = scaling_markdown(outcomes, setup, len(requests), trace.name, record)
    json_path, md_path = write_results(out_dir, "scaling", payload, text)
    signals, curves = scaling_curves(outcomes)
    png_path = out_dir / "scaling.png"
    title = f"New replicas after a scale-out, `{signals}` signals (simulated)"
    curve_chart(curves, title, "each new replica's first request", png_path)
    click.echo(text)
    click.echo(f"wrote {json_path}, {md_path} and {png_path}")
