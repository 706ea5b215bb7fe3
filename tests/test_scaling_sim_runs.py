"""The HPA loop in the cluster simulator on a small bursty workload."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.models.scaling import ScalingSetup
from prefixserving_lab.runners.scaling import ScalingOutcome, run_scaling
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape, compress
from prefixserving_lab.workloads.traces import TraceRequest

SCHEDULE = BurstSchedule(
    duration_s=900.0, base_scale=1.0, burst_scale=6.0, bursts=((300.0, 450.0),)
)
SETUP = ScalingSetup(
    schedule=SCHEDULE,
    shape=ConversationShape(apps=6, system_tokens=768, followup_p=0.3, block_tokens=128),
    # The KV cache (64 blocks, about 7 requests of 9 blocks) binds before the 16 sequence
    # slots, so KV usage is a live signal.
    service=ServiceModel(cache_blocks=64, block_tokens=128, max_running=16),
    lifecycle=PodLifecycle(load_s=30.0, hot_prefixes=8),
    min_replicas=1,
    max_replicas=6,
)


def _requests() -> list[TraceRequest]:
    trace = [TraceRequest(i * 0.5, 1000 + (i * 37) % 200, 50) for i in range(600)]
    return SETUP.shape.apply(compress(trace, SCHEDULE))


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, bool], ScalingOutcome]:
    requests = _requests()
    return {
        (signals, warm): run_scaling(requests, SETUP, signals, warm)
        for signals in ("kv", "queue", "both")
        for warm in (False, True)
    }


@pytest.mark.parametrize("signals", ["kv", "queue", "both"])
def test_burst_triggers_a_scale_up_within_a_few_syncs(
    runs: dict[tuple[str, bool], ScalingOutcome], signals: str
) -> None:
    outcome = runs[(signals, False)]
    assert outcome.react_s is not None and outcome.react_s <= 4 * SETUP.sync_s
    assert outcome.capacity_s is not None
    assert outcome.capacity_s >= outcome.react_s + SETUP.lifecycle.load_s
    assert outcome.peak_replicas > SETUP.min_replicas
    assert outcome.scale_ups >= 1


def test_both_signals_scale_at_least_as_far_as_either(
    runs: dict[tuple[str, bool], ScalingOutcome],
) -> None:
    both = runs[("both", False)].peak_replicas
    assert both >= runs[("kv", False)].peak_replicas
    assert both >= runs[("queue", False)].peak_replicas


def test_replica_minutes_cover_the_floor_and_grow_with_scaling(
    runs: dict[tuple[str, bool], ScalingOutcome],
) -> None:
    floor = SETUP.min_replicas * SCHEDULE.duration_s / 60.0
    for outcome in runs.values():
        assert outcome.replica_minutes > floor
        assert outcome.replica_minutes < SETUP.max_replicas * (SCHEDULE.duration_s + 300) / 60.0


def test_warmed_replicas_hit_the_cache_on_their_first_requests(
    runs: dict[tuple[str, bool], ScalingOutcome],
) -> None:
    for signals in ("queue", "both"):
        cold, warm = runs[(signals, False)], runs[(signals, True)]
        assert warm.fresh_hit_rate > cold.fresh_hit_rate, (signals, cold.summary(), warm.summary())


def test_warm_up_curve_starts_higher_for_warmed_replicas_and_rises_for_cold_ones(
    runs: dict[tuple[str, bool], ScalingOutcome],
) -> None:
    """The curve ages each new replica's requests from its own first request: the first
    interval of a warmed replica hits its cache more than a cold one's, and a cold replica's
    hit rate climbs after its first interval."""
    for signals in ("queue", "both"):
        cold, warm = runs[(signals, False)].curve, runs[(signals, True)].curve
        assert cold[0].requests > 0 and warm[0].requests > 0
        assert warm[0].hit_rate > cold[0].hit_rate, (signals, cold[0], warm[0])
        assert cold[1].hit_rate > cold[0].hit_rate, (signals, cold[:2])


def test_runs_are_deterministic(runs: dict[tuple[str, bool], ScalingOutcome]) -> None:
    again = run_scaling(_requests(), SETUP, "queue", True)
    # repr, not ==: the curve's empty intervals hold NaN, which equals nothing.
    assert repr(again) == repr(runs[("queue", True)])


def test_direction_changes_count_reversals(runs: dict[tuple[str, bool], ScalingOutcome]) -> None:
    for outcome in runs.values():
        directions = [
            1 if s.desired > s.current else -1 for s in outcome.syncs if s.desired != s.current
        ]
        reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
        assert outcome.direction_changes == reversals
        assert outcome.scale_ups + outcome.scale_downs == len(directions)


def test_stabilization_window_only_delays_scale_down(
    runs: dict[tuple[str, bool], ScalingOutcome],
) -> None:
    """Up to the first scale-down of the run without a window the two runs are identical, and
    the default 300 s window cannot scale down earlier."""
    requests = _requests()
    no_window = run_scaling(requests, replace(SETUP, scale_down_window_s=0), "kv", False)
    default = runs[("kv", False)]
    assert (no_window.scale_down_window_s, default.scale_down_window_s) == (0.0, 300.0)

    def first_down(outcome: ScalingOutcome) -> float:
        return min(s.time_s for s in outcome.syncs if s.desired < s.current)

    assert first_down(no_window) <= first_down(default)
    before = [s for s in no_window.syncs if s.time_s < first_down(no_window)]
    assert before == [s for s in default.syncs if s.time_s < first_down(no_window)]
