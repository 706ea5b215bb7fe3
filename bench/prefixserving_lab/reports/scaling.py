"""``scaling.md``: the autoscaling runs of ``prefixserving bench scaling``.

Opens with the issue's goals, each met or missed with its figures (:func:`goal_lines`), the
best signal combination per workload (:func:`best_run`) and why backlog seconds react later
than queue depth on the bursty trace (:func:`backlog_lag_lines`, read off the syncs); then one
table per workload (every run: signals, held siblings counted or not, cold or warmed, window),
the warm-up and no-window findings, and the warm-up curve of the new replicas, cold and warmed,
on the project's default signals (every run's curve is in the JSON)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixserving.api.defaults import SIGNALS
from prefixserving_lab.machine import machine_line
from prefixserving_lab.models.scaling import SIGNAL_SETS
from prefixserving_lab.reports.curves import curve_table
from prefixserving_lab.reports.files import fmt, table
from prefixserving_lab.runners.curves import CurveBucket
from prefixserving_lab.runners.scaling import (
    BURST_TAIL_S,
    FLAP_S,
    FRESH_REQUESTS,
    ScalingOutcome,
    WorkloadRuns,
)

# Runs whose TTFT p99 is within this factor of a workload's lowest count as "equal" p99.
P99_SLACK = 1.1
# Runs within this factor of the best run's replica-minutes tie with it.
TIE = 1.005
FANOUT, COLD = "fan-out", "cold"


def scaling_markdown(workloads: Sequence[WorkloadRuns], machine: Mapping[str, object]) -> str:
    """Goals, the backlog finding, a table per workload, the warm-up curve, the machine."""
    first = workloads[0].setup
    targets = first.hpa("all").targets
    sections: list[str] = []
    for w in workloads:
        sections += [f"## {w.name}", "", w.description, "", _table(w), "", *_findings(w), ""]
    signals, curves = scaling_curves(workloads[0].outcomes)
    return "\n".join(
        [
            "# Autoscaling in the cluster simulator",
            "",
            f"HPA every {first.sync_s:g} s with the project's default targets (KV usage "
            f"{targets['kv']:g}, queue depth {targets['queue']:g} a replica, backlog "
            f"{targets['backlog']:g} s a replica) and behaviour, pods load for "
            f"{first.lifecycle.load_s:g} s, router `{first.policy}`. Signals: honest (what the "
            "operator's queries read from a PEEK engine: held siblings not in the queue depth, "
            "a shared block once in the backlog) or `+held` (the stock gauges: every waiting "
            "request queued, each request's uncached tokens its own); `kv` runs once, held "
            "siblings pin no KV blocks.",
            "",
            "## Goals",
            "",
            *goal_lines(workloads),
            "",
            "## Why backlog seconds react later than queue depth on the bursty trace",
            "",
            *backlog_lag_lines(workloads[0]),
            "",
            *sections,
            "react: burst start to the first scale-up decision within the burst (plus "
            f"{BURST_TAIL_S:g} s), per burst kind, '-' where none scaled out; capacity: to the "
            "first new replica taking traffic. fresh: the first "
            f"{FRESH_REQUESTS} requests each new replica served. flaps: "
            f"scale-downs undone within {FLAP_S / 60:g} minutes; direction changes: scale-ups "
            "followed by scale-downs or back.",
            "",
            f"## Warm-up curve of the new replicas (`{signals}` signals, {workloads[0].name})",
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


def _default_runs(w: WorkloadRuns) -> list[ScalingOutcome]:
    """The runs with warmed replicas and the default scale-down window."""
    window = w.outcomes[0].scale_down_window_s
    return [o for o in w.outcomes if o.warmup and o.scale_down_window_s == window]


def _run(w: WorkloadRuns, label: str) -> ScalingOutcome | None:
    return next((o for o in _default_runs(w) if o.label == label), None)


def best_run(w: WorkloadRuns) -> ScalingOutcome:
    """The fewest replica-minutes among the default runs whose TTFT p99 is within
    ``P99_SLACK`` of the workload's lowest."""
    runs = _default_runs(w)
    floor = min(o.ttft_p99_s for o in runs)
    return min(
        (o for o in runs if o.ttft_p99_s <= floor * P99_SLACK), key=lambda o: o.replica_minutes
    )


def goal_lines(workloads: Sequence[WorkloadRuns]) -> list[str]:
    """The three goals of the issue for ``backlog`` (honest, default target), met or missed,
    and the best run of each workload."""
    lines = []
    for w in workloads:
        backlog, held = _run(w, "backlog"), _run(w, "backlog+held")
        kinds = {b.kind for b in w.setup.burst_windows()}
        if backlog is None:
            continue
        if COLD in kinds:
            sync = w.setup.sync_s
            cold = backlog.react_by_kind.get(COLD)
            met = cold is not None and cold <= sync
            lines.append(
                f"- Backlog reacts within one polling interval ({sync:g} s) to a cold-document "
                f"burst ({w.name}): **{'met' if met else 'missed'}**, first scale-up "
                f"{fmt(cold, 1)} s after the burst began."
            )
        if FANOUT in kinds:
            fan = backlog.react_by_kind.get(FANOUT)
            result = "met" if fan is None else f"missed, scaled out after {fmt(fan, 1)} s"
            contrast = (
                ""
                if held is None
                else f"; counting held siblings (`backlog+held`) peak {held.peak_replicas}, "
                f"{fmt(held.replica_minutes, 1)} vs {fmt(backlog.replica_minutes, 1)} "
                "replica-minutes"
            )
            lines.append(
                f"- Backlog does not scale out for a same-prefix burst one replica absorbs "
                f"({w.name}): **{result}** (peak {backlog.peak_replicas}){contrast}."
            )
    for w in workloads:
        backlog = _run(w, "backlog")
        for label in ("queue", "queue+held"):
            queue = _run(w, label)
            if backlog is None or queue is None:
                continue
            met = (
                backlog.replica_minutes < queue.replica_minutes
                and backlog.ttft_p99_s <= queue.ttft_p99_s * P99_SLACK
            )
            lines.append(
                f"- Backlog uses fewer replica-minutes than `{label}` at equal (within "
                f"{P99_SLACK - 1:.0%}) or better TTFT p99 ({w.name}): "
                f"**{'met' if met else 'missed'}**, "
                f"{fmt(backlog.replica_minutes, 1)} vs {fmt(queue.replica_minutes, 1)} "
                f"replica-minutes, TTFT p99 {fmt(backlog.ttft_p99_s, 2)} vs "
                f"{fmt(queue.ttft_p99_s, 2)} s."
            )
    for w in workloads:
        best = best_run(w)
        tied = [
            f"`{o.label}`"
            for o in _default_runs(w)
            if o.replica_minutes <= best.replica_minutes * TIE
            and o.ttft_p99_s <= best.ttft_p99_s * P99_SLACK
        ]
        lines.append(
            f"- Best on {w.name} (fewest replica-minutes with TTFT p99 within "
            f"{P99_SLACK - 1:.0%} of the lowest): {', '.join(tied)}, "
            f"{fmt(best.replica_minutes, 1)} replica-minutes, TTFT p99 {fmt(best.ttft_p99_s, 2)} s."
        )
    return lines


def backlog_lag_lines(w: WorkloadRuns) -> list[str]:
    """At the first sync in a burst where ``queue`` scaled up: what each signal read against
    its target, and the uncached tokens a waiting request carried; then where the slowest
    ``backlog`` run (of every target that ran) scaled up, and how busy the prefill was."""
    queue = _run(w, "queue")
    backlogs = [
        o
        for o in _default_runs(w)
        if o.signals == "backlog" and not o.held_counted and o.react_s is not None
    ]
    if queue is None or not backlogs:
        return ["- Needs the `queue` and `backlog` runs."]
    backlog = max(backlogs, key=lambda o: (o.react_s or 0.0, o.ttft_p99_s))
    targets = dict(w.setup.hpa("all").targets)
    if backlog.backlog_target_s is not None:
        targets["backlog"] = backlog.backlog_target_s
    seconds_per_token = w.setup.service.prefill_s_per_token
    lines = []
    start = w.setup.burst_windows()[0].start_s
    up = next((s for s in queue.syncs if s.time_s >= start and s.desired > s.current), None)
    if up is None:
        return ["- `queue` did not scale out in the first burst."]
    q, b = up.means["queue"], up.means["backlog"]
    tokens = b / seconds_per_token / q if q else 0.0
    lines.append(
        f"- {up.time_s - start:g} s into the burst (`queue` scales out) a replica had "
        f"{fmt(q, 1)} waiting requests (target {targets['queue']:g}) but {fmt(b, 2)} s of "
        f"backlog (target {targets['backlog']:g}): {tokens:.0f} uncached tokens a waiting "
        f"request at {1 / seconds_per_token:.0f} tokens/s, so the queue target stands for "
        f"{targets['queue'] * tokens * seconds_per_token:.2f} s of backlog and the backlog "
        f"target for {targets['backlog'] / (tokens * seconds_per_token):.0f} waiting requests. "
        f"The replicas ran {fmt(up.means['slots'], 2)} of their sequence slots and "
        f"{fmt(up.means['kv'], 2)} of their KV blocks, their prefill servers busy "
        f"{fmt(up.means['prefill_busy'], 2)} of the period: the queue waited for slots and KV "
        "blocks, which backlog seconds do not price."
    )
    bup = next((s for s in backlog.syncs if s.time_s >= start and s.desired > s.current), None)
    if bup is not None and bup.time_s <= up.time_s:
        lines.append(f"- `{backlog.label}` scales out at the same sync as `queue`.")
    elif bup is not None:
        before = [s for s in queue.syncs if start <= s.time_s < bup.time_s]
        busy = ", ".join(f"{fmt(s.means['prefill_busy'], 2)}" for s in before)
        lines.append(
            f"- `{backlog.label}` scales out {bup.time_s - start:g} s into the burst, when it "
            f"reads {fmt(bup.means['backlog'], 2)} s. The replicas' prefill servers were busy "
            f"{busy} of the sync periods before (`queue` run): a replica's backlog stays near "
            "rho/(1-rho) mean prefill times until its prefill saturates, well under a second "
            f"for {tokens:.0f}-token prompts, so a {targets['backlog']:g} s target is crossed "
            "only once the replica is overloaded, and the backlog then grows through the "
            f"{w.setup.lifecycle.load_s:g} s the new pods load."
        )
    return lines


def _table(w: WorkloadRuns) -> str:
    kinds = list(dict.fromkeys(b.kind for b in w.setup.burst_windows()))
    header = [
        "signals",
        "new replicas",
        "down window s",
        *[f"react s ({k})" for k in kinds],
        "capacity s",
        "replica-min",
        "peak",
        "TTFT p50 s",
        "TTFT p99 s",
        "burst TTFT p99 s",
        "fresh TTFT p99 s",
        "fresh hit",
        "hit rate",
        "flaps",
        "direction changes",
    ]
    rows = [
        [
            o.label,
            "warmed" if o.warmup else "cold",
            o.scale_down_window_s,
            *[o.react_by_kind.get(k) for k in kinds],
            o.capacity_s,
            o.replica_minutes,
            o.peak_replicas,
            o.ttft_p50_s,
            o.ttft_p99_s,
            o.burst_ttft_p99_s,
            o.fresh_ttft_p99_s,
            o.fresh_hit_rate,
            o.hit_rate,
            o.flaps,
            o.direction_changes,
        ]
        for o in w.outcomes
    ]
    return table(header, rows)


def scaling_curves(
    outcomes: Sequence[ScalingOutcome],
) -> tuple[str, dict[str, tuple[CurveBucket, ...]]]:
    """The signal set the report's curve shows (the project's default signals where they ran,
    else the first run's), honest, and its cold and warmed curves, with the default scale-down
    window. ``ValueError`` without both a cold and a warmed run of that signal set."""
    window = outcomes[0].scale_down_window_s
    by_key = {
        (o.signals, o.warmup): o
        for o in outcomes
        if o.scale_down_window_s == window and not o.held_counted
    }
    ran = [o.signals for o in outcomes]
    default = [name for name in ran if SIGNAL_SETS[name] == SIGNALS]
    signals = default[0] if default else ran[0]
    cold, warm = by_key.get((signals, False)), by_key.get((signals, True))
    if cold is None or warm is None:
        raise ValueError(f"the curve of `{signals}` needs a cold and a warmed run")
    return signals, {"cold": cold.curve, "warmed": warm.curve}


def _findings(w: WorkloadRuns) -> list[str]:
    """Warmed against cold new replicas (as ratios) and the runs without a scale-down window."""
    window = w.outcomes[0].scale_down_window_s
    by_key = {(o.label, o.warmup): o for o in w.outcomes if o.scale_down_window_s == window}
    lines = []
    for label in dict.fromkeys(o.label for o in w.outcomes):
        cold, warm = by_key.get((label, False)), by_key.get((label, True))
        if cold is None or warm is None:
            continue
        lines.append(
            f"- `{label}`: warmed vs cold new replicas: fresh hit rate "
            f"{fmt(cold.fresh_hit_rate)} -> {fmt(warm.fresh_hit_rate)}, fresh TTFT p99 x"
            f"{fmt(_ratio(warm.fresh_ttft_p99_s, cold.fresh_ttft_p99_s), 2)}, run TTFT p99 x"
            f"{fmt(_ratio(warm.ttft_p99_s, cold.ttft_p99_s), 2)}, replica-minutes x"
            f"{fmt(_ratio(warm.replica_minutes, cold.replica_minutes), 2)}."
        )
    for o in w.outcomes:
        if o.scale_down_window_s != window:
            with_window = by_key.get((o.label, o.warmup))
            flaps = "" if with_window is None else f" (with the window: {with_window.flaps})"
            lines.append(
                f"- `{o.label}` with a {o.scale_down_window_s:g} s scale-down window: "
                f"{o.flaps} flaps{flaps}, {fmt(o.replica_minutes, 1)} replica-minutes, TTFT p99 "
                f"{fmt(o.ttft_p99_s, 1)} s."
            )
    return lines


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
