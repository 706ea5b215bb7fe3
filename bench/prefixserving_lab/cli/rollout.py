"""``prefixserving bench rollout``: TTFT during a rolling update (surge 1, unavailable 0) with
and without warm-up, in the cluster simulator (see :mod:`prefixserving_lab.runners.rollout`)."""

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
from prefixserving_lab.models.rollout import RolloutSetup
from prefixserving_lab.reports.curves import curve_chart
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.reports.rollout import rollout_curves, rollout_markdown
from prefixserving_lab.runners.rollout import compare
from prefixserving_lab.workloads.conversations import (
    BurstSchedule,
    ConversationShape,
    bursty_conversations,
)


@click.command()
@schedule_options(base_scale=4.0, burst_scale=4.0, bursts=())
@click.option("--replicas", type=int, default=4, show_default=True)
@click.option("--start-s", type=float, default=600.0, show_default=True, help="Rollout start.")
@load_s_option
@hot_prefixes_option
@curve_options
@out_dir_option
def rollout(
    trace: Path,
    duration_s: float,
    base_scale: float,
    burst_scale: float,
    bursts: tuple[str, ...],
    seed: int,
    replicas: int,
    start_s: float,
    load_s: float,
    hot_prefixes: int,
    curve_minutes: float,
    curve_bucket_s: float,
    out_dir: Path,
) -> None:
    """Roll every engine pod once, with cold and with warmed new pods, against a steady run.

    The warm-up curve (TTFT p50/p99 and hit rate of the fleet per --curve-bucket-s from the
    rollout's start, for --curve-minutes) is in both files and in OUT_DIR/rollout.png.

    Writes OUT_DIR/rollout.json, OUT_DIR/rollout.md and OUT_DIR/rollout.png. Example:
    prefixserving bench rollout --replicas 4 --base-scale 4 --out-dir bench/results
    """
    curve = curve_spec(curve_minutes, curve_bucket_s)
    schedule = BurstSchedule(
        duration_s, base_scale, burst_scale, tuple(parse_window(b) for b in bursts)
    )
    setup = RolloutSetup(
        schedule=schedule,
        shape=ConversationShape(seed=seed),
        lifecycle=PodLifecycle(load_s=load_s, hot_prefixes=hot_prefixes),
        replicas=replicas,
        start_s=start_s,
    )
    record = machine()
    requests = bursty_conversations(schedule, setup.shape, trace)
    outcomes = compare(requests, setup, curve)
    text = rollout_markdown(outcomes, setup, len(requests), trace.name, record)
    payload = {
        "benchmark": "rollout",
        "machine": record,
        "trace": trace.name,
        "requests": len(requests),
        "setup": asdict(setup),
        "curve": asdict(curve),
        "runs": [o.summary() for o in outcomes],
    }
    json_path, md_path = write_results(out_dir, "rollout", payload, text)
    png_path = out_dir / "rollout.png"
    title = "The fleet after a rolling update (simulated)"
    curve_chart(rollout_curves(outcomes), title, "the rollout's start", png_path)
    click.echo(text)
    click.echo(f"wrote {json_path}, {md_path} and {png_path}")
