"""A rolling update (surge 1, unavailable 0) in the cluster simulator, cold and warmed."""

from __future__ import annotations

import pytest

from prefixserving_lab.models.cluster import hit_rate
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.replica import ServiceModel
from prefixserving_lab.models.rollout import RolloutSetup
from prefixserving_lab.runners.curves import CurveSpec
from prefixserving_lab.runners.rollout import RolloutRun, compare, run_rollout
from prefixserving_lab.runners.scaling import fresh_outcomes
from prefixserving_lab.workloads.conversations import BurstSchedule, ConversationShape, compress
from prefixserving_lab.workloads.traces import TraceRequest

SETUP = RolloutSetup(
    schedule=BurstSchedule(duration_s=600.0, base_scale=1.0, bursts=()),
    shape=ConversationShape(apps=6, system_tokens=768, followup_p=0.3, block_tokens=128),
    service=ServiceModel(cache_blocks=256, block_tokens=128, max_running=16),
    lifecycle=PodLifecycle(load_s=30.0, hot_prefixes=8),
    replicas=3,
    start_s=200.0,
)


def _requests() -> list[TraceRequest]:
    trace = [TraceRequest(i * 0.25, 1000 + (i * 37) % 200, 40) for i in range(800)]
    return SETUP.shape.apply(compress(trace, SETUP.schedule))


@pytest.fixture(scope="module")
def runs() -> dict[str, RolloutRun]:
    requests = _requests()
    return {mode: run_rollout(requests, SETUP, mode) for mode in ("steady", "cold", "warmed")}


@pytest.mark.parametrize("mode", ["cold", "warmed"])
def test_rollout_replaces_every_pod_without_losing_capacity(
    runs: dict[str, RolloutRun], mode: str
) -> None:
    run = runs[mode]
    assert run.duration_s is not None
    assert run.duration_s >= SETUP.replicas * SETUP.lifecycle.load_s
    assert len(run.new_pods) == SETUP.replicas
    for tick in run.result.ticks:
        ready = sum(1 for s in tick.replicas if s.ready and not s.draining)
        if tick.time_s >= 1.0:
            assert SETUP.replicas <= ready <= SETUP.replicas + 1, (mode, tick.time_s, ready)
    last = run.result.ticks[-1]
    assert {s.name for s in last.replicas if not s.draining} <= set(run.new_pods)


def test_no_rollout_in_the_steady_run(runs: dict[str, RolloutRun]) -> None:
    assert runs["steady"].duration_s is None and runs["steady"].new_pods == ()


def test_warmed_pods_start_with_a_warm_cache(runs: dict[str, RolloutRun]) -> None:
    cold = hit_rate(fresh_outcomes(runs["cold"].result, runs["cold"].new_pods, 50))
    warm = hit_rate(fresh_outcomes(runs["warmed"].result, runs["warmed"].new_pods, 50))
    assert warm > cold


def test_warmup_lengthens_the_rollout_by_its_warm_up_time_only(
    runs: dict[str, RolloutRun],
) -> None:
    cold, warm = runs["cold"].duration_s, runs["warmed"].duration_s
    assert cold is not None and warm is not None
    assert cold <= warm <= cold + SETUP.replicas * 10.0


def test_compare_measures_the_same_window_for_every_mode() -> None:
    outcomes = compare(_requests(), SETUP)
    assert [o.mode for o in outcomes] == ["steady", "cold", "warmed"]
    assert len({o.window_s for o in outcomes}) == 1
    assert len({o.requests for o in outcomes}) == 1
    assert all(o.ttft_p99_s >= o.ttft_p50_s for o in outcomes)


def test_compare_curves_the_whole_fleet_from_the_rollout_start(
    runs: dict[str, RolloutRun],
) -> None:
    spec = CurveSpec(span_s=120.0, bucket_s=40.0)
    outcomes = {o.mode: o for o in compare(_requests(), SETUP, spec)}
    for mode, run in runs.items():
        buckets = outcomes[mode].curve
        assert [(b.start_s, b.end_s) for b in buckets] == [(0, 40), (40, 80), (80, 120)]
        for b in buckets:
            start = SETUP.start_s + b.start_s
            inside = [o for o in run.result.outcomes if start <= o.arrival_s < start + 40]
            assert b.requests == len(inside) > 0, (mode, b)
            assert b.hit_rate == hit_rate(inside)
