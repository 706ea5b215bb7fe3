"""``scaling.md``: the autoscaling runs of ``prefixserving bench scaling`` as a table, with one
finding per signal set (warmed against cold new replicas) and per run without a scale-down
window, then the warm-up curve of the new replicas, cold and warmed, on the project's default
signals (every signal set's curve is in the JSON)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixserving.api.defaults import SIGNALS
from prefixserving_lab.machine import machine_line
from prefixserving_lab.models.scaling import SIGNAL_SETS, ScalingSetup
from prefixserving_lab.reports.curves import curve_table
from prefixserving_lab.reports.files import fmt, table
from prefixserving_lab.runners.curves import CurveBucket
from prefixserving_lab.runners.scaling import ScalingOutcome


def scaling_markdown(
    outcomes: Sequence[ScalingOutcome],
    setup: ScalingSetup,
    requests: int,
    trace: str,
    machine: Mapping[str, object],
) -> str:
    """The table of every run, the warm-up findings and the machine line."""
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
    findings = _findings(outcomes)
    signals, curves = scaling_curves(outcomes)
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
            f"## Warm-up curve of the new replicas (`{signals}` signals)",
            "",
            "Each new replica's requests aged from its own first request, pooled over the "
            "replicas the run added; n: requests in the interval. Simulated.",
            "",
            curve_table(curves),
            "",
            f"Machine: {machine_line(machine)}. Simulated time: the figures do not depend on "
            "the machine or its load.",
        ]
    )


def scaling_curves(
    outcomes: Sequence[ScalingOutcome],
) -> tuple[str, dict[str, tuple[CurveBucket, ...]]]:
    """The signal set the report's curve shows (the project's default signals where they ran,
    else the first run's) and its cold and warmed curves, with the default scale-down window.
    ``ValueError`` without both a cold and a warmed run of that signal set."""
    window = outcomes[0].scale_down_window_s
    by_key = {(o.signals, o.warmup): o for o in outcomes if o.scale_down_window_s == window}
    ran = [o.signals for o in outcomes]
    default = [name for name in ran if SIGNAL_SETS[name] == SIGNALS]
    signals = default[0] if default else ran[0]
    cold, warm = by_key.get((signals, False)), by_key.get((signals, True))
    if cold is None or warm is None:
        raise ValueError(f"the curve of `{signals}` needs a cold and a warmed run")
    return signals, {"cold": cold.curve, "warmed": warm.curve}


def _findings(outcomes: Sequence[ScalingOutcome]) -> list[str]:
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
