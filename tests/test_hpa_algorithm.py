"""The HPA algorithm against Kubernetes' documented behaviour (horizontal-pod-autoscale docs and
the controller's replica calculator)."""

from __future__ import annotations

import itertools

import pytest

from prefixserving.api.scaling import effective_autoscaling
from prefixserving.api.types import AutoscalingSpec
from prefixserving.autoscaling.hpa import (
    Autoscaler,
    Behavior,
    HpaSpec,
    RatePolicy,
    Rules,
    ScaleEvent,
    hpa_from_autoscaling,
    metric_proposal,
    scale_down_limit,
    scale_up_limit,
)

NO_LIMITS = Behavior(
    Rules(0.0, (RatePolicy("Percent", 10_000, 15.0),)),
    Rules(0.0, (RatePolicy("Percent", 100, 15.0),)),
)


@pytest.mark.parametrize(
    ("current", "values", "target", "missing", "expected"),
    [
        # "200m / 100m == 2.0: the number of replicas will be doubled"
        (2, [200, 200], 100, 0, 4),
        # "50m / 100m == 0.5: you'll halve the number of replicas"
        (4, [50, 50, 50, 50], 100, 0, 2),
        # within the 0.1 tolerance: no change (both sides)
        (4, [109, 109, 109, 109], 100, 0, 4),
        (4, [91, 91, 91, 91], 100, 0, 4),
        # just outside the tolerance: ceil(1.11 * 4) = 5
        (4, [111, 111, 111, 111], 100, 0, 5),
        # ceil(current * metric / target) with an uneven spread: mean 0.9/0.8 * 3 = 3.375
        (3, [1.0, 1.0, 0.7], 0.8, 0, 4),
        # scale up with a missing pod: it counts as 0, so 2 reporting at 2x ask for ceil(4/3*3)
        (3, [200, 200], 100, 1, 4),
        # the missing pod as 0 brings the ratio within tolerance: no change
        (3, [160, 160], 100, 1, 3),
        # scale down with a missing pod: it counts as the target (conservative)
        (3, [20, 20], 100, 1, 2),
        # no pod reports: the controller does not scale
        (3, [], 100, 3, 3),
    ],
)
def test_metric_proposal(
    current: int, values: list[float], target: float, missing: int, expected: int
) -> None:
    assert metric_proposal(current, values, target, missing_pods=missing) == expected


def test_multiple_metrics_take_the_largest_proposal() -> None:
    hpa = Autoscaler(HpaSpec({"kv": 0.8, "queue": 5.0}, 1, 20, NO_LIMITS))
    # kv asks for ceil(0.4/0.8*4) = 2, queue asks for ceil(10/5*4) = 8
    desired = hpa.sync(0.0, 4, {"kv": [0.4] * 4, "queue": [10.0] * 4})
    assert desired == 8


def test_min_and_max_bound_the_proposal() -> None:
    hpa = Autoscaler(HpaSpec({"q": 1.0}, 2, 5, NO_LIMITS))
    assert hpa.sync(0.0, 3, {"q": [10.0] * 3}) == 5
    hpa = Autoscaler(HpaSpec({"q": 1.0}, 2, 5, NO_LIMITS))
    assert hpa.sync(0.0, 3, {"q": [0.0] * 3}) == 2
    # a count already outside the bounds moves to the bound whatever the metric says
    assert Autoscaler(HpaSpec({"q": 1.0}, 2, 5, NO_LIMITS)).sync(0.0, 8, {"q": [9.0] * 8}) == 5


def test_default_scale_up_allows_4_pods_or_100_percent_per_15_s() -> None:
    """Defaults: Percent 100 and Pods 4 every 15 s, selectPolicy Max."""
    rules = Behavior().scale_up
    assert scale_up_limit(1, [], rules, 0.0) == 5  # max(1 * 2, 1 + 4)
    assert scale_up_limit(10, [], rules, 0.0) == 20  # max(20, 14)
    # 4 pods were added 10 s ago: the period started at 6 replicas -> max(12, 10)
    assert scale_up_limit(10, [ScaleEvent(0.0, 4)], rules, 10.0) == 12
    # ... and that event is out of the period 15 s later
    assert scale_up_limit(10, [ScaleEvent(0.0, 4)], rules, 15.0) == 20


def test_documented_scale_down_policy_example() -> None:
    """Docs: Pods 4 and Percent 10 per 60 s; from 80 replicas the first step removes 8, and
    at 72 "10% of the pods is 7.2 but the number is rounded up to 8"."""
    rules = Rules(300.0, (RatePolicy("Pods", 4, 60.0), RatePolicy("Percent", 10, 60.0)), "Max")
    assert scale_down_limit(80, [], rules, 0.0) == 72
    assert scale_down_limit(72, [ScaleEvent(0.0, 8)], rules, 30.0) == 72  # same period: none
    assert scale_down_limit(72, [ScaleEvent(0.0, 8)], rules, 61.0) == 64
    # below 40 replicas the Pods policy allows more: 30 -> 26 (Percent would allow 27)
    assert scale_down_limit(30, [], rules, 0.0) == 26
    # selectPolicy Min takes the smallest change, Disabled none
    assert scale_down_limit(80, [], Rules(0.0, rules.policies, "Min"), 0.0) == 76
    assert scale_down_limit(80, [], Rules(0.0, rules.policies, "Disabled"), 0.0) == 80


def test_scale_down_stabilization_uses_the_highest_recommendation_in_the_window() -> None:
    spec = HpaSpec(
        {"q": 1.0}, 1, 20, Behavior(NO_LIMITS.scale_up, Rules(300.0, NO_LIMITS.scale_down.policies))
    )
    hpa = Autoscaler(spec)
    assert hpa.sync(0.0, 4, {"q": [2.0] * 4}) == 8
    # the load vanishes: the 8 recommended 15 s ago holds the fleet for the 300 s window
    assert hpa.sync(15.0, 8, {"q": [0.1] * 8}) == 8
    assert hpa.sync(290.0, 8, {"q": [0.1] * 8}) == 8
    assert hpa.sync(315.0, 8, {"q": [0.1] * 8}) == 1


def test_scale_up_stabilization_uses_the_lowest_recommendation_in_the_window() -> None:
    spec = HpaSpec(
        {"q": 1.0}, 1, 20, Behavior(Rules(60.0, NO_LIMITS.scale_up.policies), NO_LIMITS.scale_down)
    )
    hpa = Autoscaler(spec)
    assert hpa.sync(0.0, 4, {"q": [1.0] * 4}) == 4  # recommends 4
    assert hpa.sync(15.0, 4, {"q": [3.0] * 4}) == 4  # 12 wanted, 4 still in the window
    assert hpa.sync(61.0, 4, {"q": [3.0] * 4}) == 12


def test_default_scale_down_window_stops_flapping() -> None:
    """An oscillating signal flaps without a window and holds with the default 300 s one."""
    loads = [2.0, 0.5] * 10
    flapping = Autoscaler(HpaSpec({"q": 1.0}, 1, 20, NO_LIMITS))
    steady = Autoscaler(HpaSpec({"q": 1.0}, 1, 20))
    counts: dict[str, list[int]] = {"flapping": [4], "steady": [4]}
    for i, load in enumerate(loads):
        for name, hpa in (("flapping", flapping), ("steady", steady)):
            current = counts[name][-1]
            counts[name].append(hpa.sync(15.0 * i, current, {"q": [load] * current}))
    changes = {
        name: sum(1 for a, b in itertools.pairwise(c) if a != b) for name, c in counts.items()
    }
    assert changes["flapping"] >= 10
    assert max(counts["steady"]) == counts["steady"][-1], "never scaled back down within 300 s"


def test_hpa_from_the_resources_autoscaling_block() -> None:
    auto = effective_autoscaling(
        AutoscalingSpec.model_validate(
            {"enabled": True, "minReplicas": 2, "maxReplicas": 9, "signals": ["queueDepth"]}
        )
    )
    spec = hpa_from_autoscaling(auto, {"kvCacheUsage": "kv", "queueDepth": "queue"})
    assert dict(spec.targets) == {"queue": auto.target_queue_depth}
    assert (spec.min_replicas, spec.max_replicas) == (2, 9)
    assert spec.behavior.scale_up.select_policy == "Max"
    assert spec.behavior.scale_down.select_policy == "Min"
    assert {p.type for p in spec.behavior.scale_down.policies} == {"Pods", "Percent"}
