"""``prefixserving bench scaling``: the HPA on KV-cache, queue and both signals, with new
replicas cold or warmed, in the cluster simulator (see :mod:`prefixserving_lab.runners.scaling`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import click

from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.scaling import SIGNAL_SETS, ScalingSetup
from prefixserving_lab.reports.files import fmt, machine, table, write_results
from prefixserving_lab.runners.scaling import ScalingOutcome, compare
from prefixserving_lab.workloads.conversations import (
    DEFAULT_TRACE,
    BurstSchedule,
    ConversationShape,
    bursty_conversations,
)


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds, e.g. ``480:840``."""
    try:
        start, end = (float(part) for part in text.split(":"))
    except ValueError as exc:
        raise click.BadParameter(
            f"{text!r}: write a burst as START:END seconds, e.g. 480:840"
        ) from exc
    if not 0 <= start < end:
        raise click.BadParameter(f"{text!r}: need 0 <= START < END")
    return start, end


def schedule_options(
    base_scale: float, burst_scale: float, bursts: tuple[str, ...]
) -> Callable[[click.Command], click.Command]:
    """The workload flags shared by ``bench scaling`` and ``bench rollout``, with defaults."""
    options = [
        click.option(
            "--trace",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=DEFAULT_TRACE,
            show_default=True,
            help="Azure-format CSV (TIMESTAMP,ContextTokens,GeneratedTokens).",
        ),
        click.option("--duration-s", type=float, default=1800.0, show_default=True),
        click.option(
            "--base-scale",
            type=float,
            default=base_scale,
            show_default=True,
            help="Time compression outside bursts.",
        ),
        click.option(
            "--burst-scale",
            type=float,
            default=burst_scale,
            show_default=True,
            help="Time compression inside bursts.",
        ),
        click.option(
            "--burst",
            "bursts",
            multiple=True,
            default=bursts,
            show_default=True,
            help="Burst window START:END in simulated seconds (repeatable).",
        ),
        click.option("--seed", type=int, default=0, show_default=True),
    ]

    def apply(command: click.Command) -> click.Command:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


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
    out_dir: Path,
) -> None:
    """Run the HPA on KV usage, queue depth and both, cold vs warmed new replicas.

    Writes OUT_DIR/scaling.json and OUT_DIR/scaling.md. Example:
    prefixserving bench scaling --burst 480:840 --burst-scale 6 --out-dir bench/results
    """
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
    requests = bursty_conversations(schedule, setup.shape, trace)
    click.echo(f"{len(requests)} requests over {duration_s:.0f} s; running {len(signal_sets) * 3}")
    outcomes = compare(requests, setup, signal_sets)
    payload = {
        "benchmark": "scaling",
        "machine": machine(),
        "trace": trace.name,
        "requests": len(requests),
        "setup": asdict(setup),
        "runs": [
            {**o.summary(), "syncs": [asdict(s) for s in o.syncs if s.desired != s.current]}
            for o in outcomes
        ],
    }
    path = write_results(
        out_dir, "scaling", payload, scaling_markdown(outcomes, setup, len(requests), trace.name)
    )
    click.echo(scaling_markdown(outcomes, setup, len(requests), trace.name))
    click.echo(f"wrote {path}")


def scaling_markdown(
    outcomes: list[ScalingOutcome], setup: ScalingSetup, requests: int, trace: str
) -> str:
    s = setup.schedule
    rows = [
        [
            o.signals,
            "warmed" if o.warmup else "cold",
            o.scale_down_window_s,
            o.react_s,
            o.capacity_s,
            o.replica_minutes,
            o.peak_replicas,
            o.ttft_p50_s,
            o.ttft_p99_s,
            o.burst_ttft_p99_s,
            o.fresh_ttft_p99_s,
            o.fresh_hit_rate,
            o.hit_rate,
            o.direction_changes,
        ]
        for o in outcomes
    ]
    header = [
        "signals",
        "new replicas",
        "down window s",
        "react s",
        "capacity s",
        "replica-min",
        "peak",
        "TTFT p50 s",
        "TTFT p99 s",
        "burst TTFT p99 s",
        "fresh TTFT p99 s",
        "fresh hit",
        "hit rate",
        "direction changes",
    ]
    bursts = ", ".join(f"{a:.0f}-{b:.0f} s" for a, b in s.bursts)
    m = machine()
    findings = _findings(outcomes)
    return "\n".join(
        [
            "# Autoscaling in the cluster simulator",
            "",
            f"Workload: `{trace}` time-compressed x{s.base_scale:g}, x{s.burst_scale:g} during "
            f"bursts ({bursts}), {s.duration_s:.0f} s, {requests} requests, conversational "
            f"prefixes ({setup.shape.apps} apps, {setup.shape.system_tokens}-token system "
            f"prompts, follow-up turns {setup.shape.followup_p:.0%}). HPA every "
            f"{setup.sync_s:g} s with the project's default targets and behaviour, "
            f"{setup.min_replicas}-{setup.max_replicas} replicas, pods load for "
            f"{setup.lifecycle.load_s:g} s; router `{setup.policy}`.",
            "",
            table(header, rows),
            "",
            "react: burst start to the first scale-up decision; capacity: to the first new "
            "replica taking traffic. fresh: the first 100 requests each new replica served. "
            "Direction changes count scale-ups followed by scale-downs or back.",
            "",
            *findings,
            "",
            f"Machine: {m['description']}, load average {m['load_average_1m']} "
            "(other jobs were running). Simulated time; the figures do not depend on the machine.",
        ]
    )


def _findings(outcomes: list[ScalingOutcome]) -> list[str]:
    """One line per signal set: warmed against cold new replicas, as ratios."""
    default = [o for o in outcomes if o.scale_down_window_s == outcomes[0].scale_down_window_s]
    by_key = {(o.signals, o.warmup): o for o in default}
    lines = []
    for signals in dict.fromkeys(o.signals for o in default):
        cold, warm = by_key.get((signals, False)), by_key.get((signals, True))
        if cold is None or warm is None:
            continue
        lines.append(
            f"- `{signals}`: warmed vs cold new replicas: fresh hit rate "
            f"{fmt(cold.fresh_hit_rate)} -> {fmt(warm.fresh_hit_rate)}, fresh TTFT p99 x"
            f"{fmt(_ratio(warm.fresh_ttft_p99_s, cold.fresh_ttft_p99_s), 2)}, run TTFT p99 x"
            f"{fmt(_ratio(warm.ttft_p99_s, cold.ttft_p99_s), 2)}, replica-minutes x"
            f"{fmt(_ratio(warm.replica_minutes, cold.replica_minutes), 2)}."
        )
    for o in outcomes:
        if o.scale_down_window_s != outcomes[0].scale_down_window_s:
            lines.append(
                f"- `{o.signals}` with a {o.scale_down_window_s:g} s scale-down window: "
                f"{o.direction_changes} direction changes, {fmt(o.replica_minutes, 1)} "
                f"replica-minutes, TTFT p99 {fmt(o.ttft_p99_s, 1)} s."
            )
    return lines


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
