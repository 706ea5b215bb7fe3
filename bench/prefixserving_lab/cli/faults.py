"""``prefixserving bench faults``: hit rate and TTFT over time after a router restart,
engines removed and added back, and a rolling update (see
:mod:`prefixserving_lab.runners.faults`)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import click

from prefixserving.api.defaults import ROUTER_REPLICAS
from prefixserving_lab.cli.cluster import DEFAULT_TRACE
from prefixserving_lab.cli.options import command_line, load_s_option, out_dir_option, policy_names
from prefixserving_lab.machine import machine
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.reports.faults import write_fault_results
from prefixserving_lab.runners.cluster import OURS, PEERS
from prefixserving_lab.runners.faults import FaultSetup, run_faults, trace_inputs


@click.command()
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_TRACE,
    show_default=True,
    help="Mooncake-format JSONL trace.",
)
@click.option("--replicas", type=click.IntRange(2), default=8, show_default=True)
@click.option("--routers", type=click.IntRange(1), default=ROUTER_REPLICAS, show_default=True)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help=f"Policy (repeatable). Default: {OURS} and the peers ({', '.join(PEERS)}).",
)
@click.option("--fault-s", type=click.FloatRange(0), default=300.0, show_default=True)
@click.option("--engines-out", type=click.IntRange(1), default=2, show_default=True)
@click.option(
    "--out-for-s",
    type=click.FloatRange(0),
    default=120.0,
    show_default=True,
    help="Seconds before the removed engines' Deployment is scaled back.",
)
@load_s_option
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Replay this many times faster than the trace.",
)
@click.option("--bucket-s", type=click.FloatRange(min=0, min_open=True), default=15.0)
@out_dir_option
def faults(
    trace: Path,
    replicas: int,
    routers: int,
    policies: tuple[str, ...],
    fault_s: float,
    engines_out: int,
    out_for_s: float,
    load_s: float,
    time_scale: float,
    bucket_s: float,
    out_dir: Path,
) -> None:
    """Replay a trace on REPLICAS engine pods behind ROUTERS router replicas, once steady and
    once per fault, and report the hit rate over time against the steady run. Writes
    faults.json and faults.md.

    Example: prefixserving bench faults --replicas 8 --routers 2 --fault-s 300
    """
    if not trace.exists():
        raise click.UsageError(f"trace not found: {trace}; pass --trace FILE")
    if engines_out >= replicas:
        raise click.BadParameter(
            f"{engines_out} must be fewer than --replicas ({replicas})", param_hint="--engines-out"
        )
    requests, service = trace_inputs(trace, replicas, time_scale)
    setup = FaultSetup(
        replicas=replicas,
        routers=routers,
        fault_s=fault_s,
        engines_out=engines_out,
        out_for_s=out_for_s,
        bucket_s=bucket_s,
        lifecycle=PodLifecycle(load_s=load_s),
    )
    record = machine()
    started = time.monotonic()
    runs = {
        policy: run_faults(requests, replace(setup, policy=policy), service)
        for policy in policy_names(policies, (OURS, *PEERS))
    }
    meta = {
        "command": command_line(click.get_current_context()),
        "machine": record,
        "wall_s": time.monotonic() - started,
        "workload": trace.stem,
        "time_scale": time_scale,
        "service": ", ".join(f"{k}={v}" for k, v in asdict(service).items()),
        "setup": asdict(setup),
    }
    json_path, md_path = write_fault_results(out_dir, runs, meta)
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")
