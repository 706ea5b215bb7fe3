"""``prefixserving bench rollout``: TTFT during a rolling update (surge 1, unavailable 0) with
and without warm-up, in the cluster simulator (see :mod:`prefixserving_lab.runners.rollout`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from prefixserving_lab.cli.options import parse_window, schedule_options
from prefixserving_lab.machine import machine
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.rollout import RolloutSetup
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.reports.rollout import rollout_markdown
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
@click.option(
    "--load-s",
    type=float,
    default=90.0,
    show_default=True,
    help="Pod start to engine up (scheduling, image pull, model load).",
)
@click.option("--hot-prefixes", type=int, default=32, show_default=True)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench/results"),
    show_default=True,
)
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
    out_dir: Path,
) -> None:
    """Roll every engine pod once, with cold and with warmed new pods, against a steady run.

    Writes OUT_DIR/rollout.json and OUT_DIR/rollout.md. Example:
    prefixserving bench rollout --replicas 4 --base-scale 4 --out-dir bench/results
    """
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
    outcomes = compare(requests, setup)
    text = rollout_markdown(outcomes, setup, len(requests), trace.name, record)
    payload = {
        "benchmark": "rollout",
        "machine": record,
        "trace": trace.name,
        "requests": len(requests),
        "setup": asdict(setup),
        "runs": [o.summary() for o in outcomes],
    }
    json_path, md_path = write_results(out_dir, "rollout", payload, text)
    click.echo(text)
    click.echo(f"wrote {json_path} and {md_path}")
