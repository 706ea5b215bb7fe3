"""``prefixserving bench cluster``: every routing policy on the same simulated fleets."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import click

from prefixserving.api.defaults import ROUTER_REPLICAS
from prefixserving.router.policies.registry import POLICY_NAMES
from prefixserving_lab.cli.options import command_line, out_dir_option, policy_names
from prefixserving_lab.machine import machine
from prefixserving_lab.models.cluster import KV_EVENT_LAG_S
from prefixserving_lab.models.peer_routers import sim_policy_names
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.reports.cluster import write_cluster_results
from prefixserving_lab.runners.cluster import BALANCE_GOAL, Workload, run_bench, verdicts
from prefixserving_lab.workloads.blocks import SharedPrefixGroups
from prefixserving_lab.workloads.traces import (
    MOONCAKE_FILE,
    TRACES_ENV,
    load_mooncake,
    traces_dir,
)

DEFAULT_TRACE = traces_dir() / MOONCAKE_FILE
ALL_POLICIES = sim_policy_names(POLICY_NAMES)


@click.command()
@click.option(
    "--trace",
    "traces",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help=f"Mooncake-format JSONL trace (repeatable). Default: {MOONCAKE_FILE} from "
    f"${TRACES_ENV} (or shared/traces beside the repository).",
)
@click.option(
    "--groups/--no-groups",
    default=True,
    show_default=True,
    help="Also run generated shared-prefix groups (system prompt, Zipf documents, questions).",
)
@click.option(
    "--replicas",
    "replica_counts",
    type=click.IntRange(1),
    multiple=True,
    help="Engine replicas N (repeatable). Default: 4, 8 and 16.",
)
@click.option(
    "--routers",
    "router_counts",
    type=click.IntRange(1),
    multiple=True,
    help=f"Router replicas in front of the fleet (repeatable). Default: 1 and {ROUTER_REPLICAS}.",
)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    help="Policy to compare (repeatable; dashes or underscores). Default: all.",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Replay this many times faster. Default: per N, from --utilization.",
)
@click.option(
    "--utilization",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.5,
    show_default=True,
    help="Prefill busy share at the ideal hit rate, used to pick the time scale.",
)
@click.option(
    "--cache-blocks",
    type=click.IntRange(1),
    default=None,
    help=f"KV blocks per replica. Default: per N, {BALANCE_GOAL} x the workload's distinct "
    "blocks / N.",
)
@click.option(
    "--kv-event-lag",
    type=click.FloatRange(min=0),
    default=KV_EVENT_LAG_S,
    show_default=True,
    help="Seconds from an engine's cache change to the routers' view of it, for the policies "
    "run with engine events (prefix-affinity-events).",
)
@click.option("--limit", type=click.IntRange(1), default=None, help="Use the first N requests.")
@out_dir_option
@click.option(
    "--name",
    default="cluster",
    show_default=True,
    help="Results file stem: writes NAME.json and NAME.md.",
)
def cluster(
    traces: tuple[Path, ...],
    groups: bool,
    replica_counts: tuple[int, ...],
    router_counts: tuple[int, ...],
    policies: tuple[str, ...],
    time_scale: float | None,
    utilization: float,
    cache_blocks: int | None,
    kv_event_lag: float,
    limit: int | None,
    out_dir: Path,
    name: str,
) -> None:
    """Simulate N replicas with block LRU prefix caches behind the router and compare routing
    policies (ours with and without the engines' KV cache events, two-choice, round-robin,
    least-loaded, KubeAI-style and SGLang-style) on the same requests. Writes cluster.json and
    cluster.md (see --name).

    Example: prefixserving bench cluster --replicas 4 --replicas 8 --routers 2

    Router replicas at fleet scale: prefixserving bench cluster --replicas 8 --replicas 16
    --routers 1 --routers 2 --routers 4 --routers 8 --policy prefix-affinity
    --policy prefix-affinity-events --policy two-choice --policy kubeai-chwbl
    --policy sglang-cache-aware --name cluster-routers
    """
    if not name or Path(name).name != name or name.startswith("."):
        raise click.BadParameter(
            f"{name!r} is not a file stem; pass a plain name such as cluster-routers",
            param_hint="--name",
        )
    paths = traces or (DEFAULT_TRACE,)
    for path in paths:
        if not path.exists():
            raise click.UsageError(f"trace not found: {path}; pass --trace FILE")
    workloads = [Workload(p.stem, tuple(load_mooncake(p, limit=limit))) for p in paths]
    if groups:
        count = limit or SharedPrefixGroups().requests
        workloads.append(
            Workload("shared-prefix-groups", tuple(SharedPrefixGroups(requests=count).generate()))
        )
    service = ServiceModel()
    record = machine()
    started = time.monotonic()
    rows = run_bench(
        workloads,
        replica_counts or (4, 8, 16),
        router_counts or (1, ROUTER_REPLICAS),
        policy_names(policies, ALL_POLICIES),
        service=service,
        cache_blocks=cache_blocks,
        time_scale=time_scale,
        utilization=utilization,
        kv_event_lag_s=kv_event_lag,
    )
    meta = {
        "command": command_line(click.get_current_context()),
        "machine": record,
        "wall_s": time.monotonic() - started,
        "service": ", ".join(f"{k}={v}" for k, v in asdict(service).items() if k != "cache_blocks"),
        "utilization": utilization,
        "deployed_routers": ROUTER_REPLICAS,
        "kv_event_lag_s": kv_event_lag,
    }
    json_path, md_path = write_cluster_results(out_dir, rows, verdicts(rows), meta, name)
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")
