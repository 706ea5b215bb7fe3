"""``rollout.md``: TTFT during a rolling update (``prefixserving bench rollout``), with cold
and warmed new pods against the same window of a steady run, then the fleet's warm-up curve
from the rollout's start in the three runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefixserving_lab.machine import machine_line
from prefixserving_lab.models.rollout import RolloutSetup
from prefixserving_lab.reports.curves import curve_table
from prefixserving_lab.reports.files import table
from prefixserving_lab.runners.curves import CurveBucket
from prefixserving_lab.runners.rollout import RolloutOutcome


def rollout_markdown(
    outcomes: Sequence[RolloutOutcome],
    setup: RolloutSetup,
    requests: int,
    trace: str,
    machine: Mapping[str, object],
) -> str:
    """The steady, cold and warmed runs as a table, their curves, the machine line."""
    by_mode = {o.mode: o for o in outcomes}
    steady = by_mode["steady"].ttft_p99_s
    rows = [
        [
            o.mode,
            o.rollout_s,
            o.requests,
            o.ttft_p50_s,
            o.ttft_p99_s,
            o.ttft_p99_s / steady if steady else None,
            o.hit_rate,
        ]
        for o in outcomes
    ]
    header = [
        "run",
        "rollout s",
        "requests",
        "TTFT p50 s",
        "TTFT p99 s",
        "p99 / steady",
        "hit rate",
    ]
    s = setup.schedule
    window = outcomes[0].window_s
    return "\n".join(
        [
            "# TTFT during a rolling update (surge 1, unavailable 0)",
            "",
            f"Workload: `{trace}` time-compressed x{s.base_scale:g} ({requests} requests, "
            f"conversational prefixes), {setup.replicas} replicas behind `{setup.policy}`; every "
            f"pod replaced from {setup.start_s:.0f} s, pods load for {setup.lifecycle.load_s:g} s. "
            f"Measured over arrivals {window[0]:.0f}-{window[1]:.0f} s in all three runs; "
            "steady = the same traffic with no rollout.",
            "",
            table(header, rows),
            "",
            "## Warm-up curve of the fleet",
            "",
            f"Every request aged from the rollout's start ({setup.start_s:.0f} s; the same "
            "instant in the steady run); n: requests in the interval. Simulated.",
            "",
            curve_table(rollout_curves(outcomes)),
            "",
            f"Machine: {machine_line(machine)}. Simulated time: the figures do not depend on "
            "the machine or its load.",
        ]
    )


def rollout_curves(outcomes: Sequence[RolloutOutcome]) -> dict[str, tuple[CurveBucket, ...]]:
    """Each run's curve by its mode (steady, cold, warmed)."""
    return {o.mode: o.curve for o in outcomes}
