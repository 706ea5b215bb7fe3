"""``prefixserving bench scaling``: the HPA on KV-cache, queue and backlog signals, held
siblings counted or not, on the bursty conversations (replica maximum binding and not) and on
shared-prefix and cold-document bursts, in the cluster simulator (see
:mod:`prefixserving_lab.runners.scaling`)."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import click

from prefixserving.api.defaults import SIGNALS
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
from prefixserving_lab.models.scaling import SIGNAL_SETS, Burst, ScalingSetup
from prefixserving_lab.reports.curves import curve_chart
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.reports.scaling import COLD, FANOUT, scaling_curves, scaling_markdown
from prefixserving_lab.runners.curves import CurveSpec
from prefixserving_lab.runners.scaling import (
    WorkloadRuns,
    matrix,
    run_scaling,
    target_sweep,
    without_window,
)
from prefixserving_lab.workloads.conversations import (
    BurstSchedule,
    ConversationShape,
    bursty_conversations,
)
from prefixserving_lab.workloads.prefix_bursts import PrefixBursts
from prefixserving_lab.workloads.traces import TraceRequest

_BURSTS = PrefixBursts()
_POSITIVE = click.FloatRange(min=0.0, min_open=True)
_AT_LEAST_1 = click.IntRange(min=1)


@click.command()
@schedule_options(base_scale=2.0, burst_scale=6.0, bursts=("480:840",))
@click.option(
    "--signals",
    "signal_sets",
    multiple=True,
    type=click.Choice(sorted(SIGNAL_SETS)),
    default=tuple(SIGNAL_SETS),
    show_default=True,
    help="Signal sets to compare (repeatable); each runs with held siblings counted and not.",
)
@click.option("--min-replicas", type=int, default=2, show_default=True)
@click.option("--max-replicas", type=int, default=16, show_default=True)
@click.option(
    "--light-burst-scale",
    type=float,
    default=4.0,
    show_default=True,
    help="Time compression inside the bursts of the second bursty workload.",
)
@click.option(
    "--wide-max-replicas",
    type=int,
    default=64,
    show_default=True,
    help="Replica maximum of the second bursty workload, high enough not to bind.",
)
@click.option(
    "--backlog-target-s",
    "backlog_targets_s",
    type=_POSITIVE,
    multiple=True,
    default=(2.0, 0.5),
    show_default=True,
    help="Also run backlog seconds alone at this target (repeatable; the project's default "
    "always runs).",
)
@click.option(
    "--prefix-duration-s",
    type=float,
    default=900.0,
    show_default=True,
    help="Length of the fan-out and the cold-document workloads (background at --base-scale).",
)
@click.option(
    "--fanout",
    "fanouts",
    multiple=True,
    default=tuple(f"{a:g}:{b:g}" for a, b in _BURSTS.fanout),
    show_default=True,
    help="Fan-out burst window START:END (repeatable): a new shared prompt every "
    "--fanout-every-s with --fanout-requests requests behind it.",
)
@click.option("--fanout-every-s", type=_POSITIVE, default=_BURSTS.fanout_every_s, show_default=True)
@click.option(
    "--fanout-requests", type=_AT_LEAST_1, default=_BURSTS.fanout_requests, show_default=True
)
@click.option("--prefix-tokens", type=_AT_LEAST_1, default=_BURSTS.prefix_tokens, show_default=True)
@click.option(
    "--cold",
    "colds",
    multiple=True,
    default=tuple(f"{a:g}:{b:g}" for a, b in _BURSTS.cold),
    show_default=True,
    help="Cold-document burst window START:END (repeatable).",
)
@click.option("--cold-per-s", type=_POSITIVE, default=_BURSTS.cold_per_s, show_default=True)
@click.option("--cold-tokens", type=_AT_LEAST_1, default=_BURSTS.cold_tokens, show_default=True)
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
    light_burst_scale: float,
    wide_max_replicas: int,
    backlog_targets_s: tuple[float, ...],
    prefix_duration_s: float,
    fanouts: tuple[str, ...],
    fanout_every_s: float,
    fanout_requests: int,
    prefix_tokens: int,
    colds: tuple[str, ...],
    cold_per_s: float,
    cold_tokens: int,
    load_s: float,
    hot_prefixes: int,
    curve_minutes: float,
    curve_bucket_s: float,
    out_dir: Path,
) -> None:
    """Run the HPA on KV usage, queue depth, backlog seconds and their combinations, each with
    PEEK's held siblings counted and not, on four workloads: the bursty conversations (replica
    maximum --max-replicas), the same with lighter bursts (--light-burst-scale, maximum
    --wide-max-replicas), shared-prefix fan-outs and cold-document bursts over the
    conversations without bursts. Backlog seconds alone also run at each --backlog-target-s.

    The bursty run also compares cold and warmed new replicas on the default signals (the
    warm-up curve: TTFT p50/p99 and hit rate of the new replicas per --curve-bucket-s, each
    replica's requests from its own first request, for --curve-minutes, in both files and in
    OUT_DIR/scaling.png) and every signal set without a scale-down window.

    Writes OUT_DIR/scaling.json, OUT_DIR/scaling.md and OUT_DIR/scaling.png. Example:
    prefixserving bench scaling --burst 480:840 --burst-scale 6 --out-dir bench/results
    """
    if wide_max_replicas < max_replicas:
        raise click.BadParameter(
            f"{wide_max_replicas} is below --max-replicas {max_replicas}",
            param_hint="--wide-max-replicas",
        )
    curve = curve_spec(curve_minutes, curve_bucket_s)
    shape = ConversationShape(seed=seed)
    schedule = BurstSchedule(
        duration_s, base_scale, burst_scale, tuple(parse_window(b) for b in bursts)
    )
    setup = ScalingSetup(
        schedule=schedule,
        shape=shape,
        lifecycle=PodLifecycle(load_s=load_s, hot_prefixes=hot_prefixes),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )
    try:
        prefix_bursts = PrefixBursts(
            fanout=tuple(parse_window(w) for w in fanouts),
            fanout_every_s=fanout_every_s,
            fanout_requests=fanout_requests,
            prefix_tokens=prefix_tokens,
            cold=tuple(parse_window(w) for w in colds),
            cold_per_s=cold_per_s,
            cold_tokens=cold_tokens,
            block_tokens=shape.block_tokens,
        )
    except ValueError as exc:
        raise click.UsageError(f"shared-prefix bursts: {exc}") from exc
    record = machine()
    bursty = bursty_conversations(schedule, shape, trace)
    light_schedule = replace(schedule, burst_scale=light_burst_scale)
    light = replace(setup, schedule=light_schedule, max_replicas=wide_max_replicas)
    light_requests = bursty_conversations(light_schedule, shape, trace)
    targets = tuple(backlog_targets_s)
    workloads = [
        _bursty_runs(bursty, setup, signal_sets, targets, curve, trace.name),
        _workload(
            f"Bursty conversations, x{light_burst_scale:g} bursts, at most "
            f"{wide_max_replicas} replicas",
            f"The same trace with x{light_burst_scale:g} during bursts "
            f"({len(light_requests)} requests) and a replica maximum of {wide_max_replicas}, "
            "which no signal reaches.",
            light_requests,
            light,
            signal_sets,
            targets,
            curve,
        ),
        *_prefix_burst_runs(
            prefix_bursts, setup, prefix_duration_s, trace, signal_sets, targets, curve
        ),
    ]
    payload = {
        "benchmark": "scaling",
        "machine": record,
        "trace": trace.name,
        "curve": asdict(curve),
        "workloads": [
            {
                "name": w.name,
                "requests": w.requests,
                "setup": asdict(w.setup),
                "runs": [
                    {
                        **o.summary(),
                        "syncs": [asdict(s) for s in o.syncs if s.desired != s.current],
                    }
                    for o in w.outcomes
                ],
            }
            for w in workloads
        ],
    }
    text = scaling_markdown(workloads, record)
    json_path, md_path = write_results(out_dir, "scaling", payload, text)
    signals, curves = scaling_curves(workloads[0].outcomes)
    png_path = out_dir / "scaling.png"
    title = f"New replicas after a scale-out, `{signals}` signals (simulated)"
    curve_chart(curves, title, "each new replica's first request", png_path)
    click.echo(text)
    click.echo(f"wrote {json_path}, {md_path} and {png_path}")


def _workload(
    name: str,
    description: str,
    requests: list[TraceRequest],
    setup: ScalingSetup,
    signal_sets: tuple[str, ...],
    targets: tuple[float, ...],
    curve: CurveSpec,
) -> WorkloadRuns:
    """The matrix and the backlog target sweep on one workload."""
    click.echo(f"{name}: {len(requests)} requests")
    outcomes = matrix(requests, setup, signal_sets, curve)
    if "backlog" in signal_sets:
        outcomes += target_sweep(requests, setup, targets, curve)
    return WorkloadRuns(name, description, setup, len(requests), tuple(outcomes))


def _bursty_runs(
    requests: list[TraceRequest],
    setup: ScalingSetup,
    signal_sets: tuple[str, ...],
    targets: tuple[float, ...],
    curve: CurveSpec,
    trace: str,
) -> WorkloadRuns:
    """The matrix, then the signal set the warm-up curve shows (the project's default where it
    ran, else the first) with cold new replicas, and every signal set without a scale-down
    window."""
    s, shape = setup.schedule, setup.shape
    description = (
        f"`{trace}` time-compressed x{s.base_scale:g}, x{s.burst_scale:g} during bursts "
        f"({_windows(s.bursts)}), {s.duration_s:.0f} s, {len(requests)} requests, conversational "
        f"prefixes ({shape.apps} apps, {shape.system_tokens}-token system prompts, follow-up "
        f"turns {shape.followup_p:.0%}); {setup.min_replicas}-{setup.max_replicas} replicas."
    )
    runs = _workload(
        f"Bursty conversations, at most {setup.max_replicas} replicas",
        description,
        requests,
        setup,
        signal_sets,
        targets,
        curve,
    )
    shown = next((n for n in signal_sets if SIGNAL_SETS[n] == SIGNALS), signal_sets[0])
    extra = [run_scaling(requests, setup, shown, False, curve)]
    extra += without_window(requests, setup, signal_sets, curve)
    return replace(runs, outcomes=(*runs.outcomes, *extra))


def _prefix_burst_runs(
    bursts: PrefixBursts,
    setup: ScalingSetup,
    duration_s: float,
    trace: Path,
    signal_sets: tuple[str, ...],
    targets: tuple[float, ...],
    curve: CurveSpec,
) -> list[WorkloadRuns]:
    """The fan-outs, then the cold documents, each over the conversations without bursts."""
    base = setup.schedule.base_scale
    schedule = BurstSchedule(duration_s, base, base, ())
    background = bursty_conversations(schedule, setup.shape, trace)
    fanouts = replace(bursts, cold=())
    colds = replace(bursts, fanout=())
    quiet = f"The conversations at x{base:g} without bursts ({duration_s:.0f} s)"
    fan_text = (
        f"{quiet} plus fan-outs ({_windows(bursts.fanout)}): every {bursts.fanout_every_s:g} s "
        f"a new {bursts.prefix_tokens}-token prompt with {bursts.fanout_requests} requests "
        f"behind it within {bursts.fanout_spread_s:g} s, {bursts.question_tokens} tokens of "
        "their own each (one replica absorbs each fan-out)"
    )
    cold_text = (
        f"{quiet} plus cold documents ({_windows(bursts.cold)}): {bursts.cold_per_s:g} a "
        f"second of {bursts.cold_tokens} unrelated tokens"
    )
    out = []
    for name, kind, workload, text, windows in (
        ("Shared-prefix fan-outs", FANOUT, fanouts, fan_text, bursts.fanout),
        ("Cold-document bursts", COLD, colds, cold_text, bursts.cold),
    ):
        requests = workload.requests(background)
        out.append(
            _workload(
                name,
                f"{text}; {len(requests)} requests, {setup.min_replicas}-"
                f"{setup.max_replicas} replicas.",
                requests,
                replace(
                    setup,
                    schedule=schedule,
                    bursts=tuple(Burst(kind, a, b) for a, b in windows),
                ),
                signal_sets,
                targets,
                curve,
            )
        )
    return out


def _windows(windows: tuple[tuple[float, float], ...]) -> str:
    return ", ".join(f"{a:.0f}-{b:.0f} s" for a, b in windows)
