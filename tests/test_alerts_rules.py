"""Each alert of a rendered PrefixServing, evaluated by ``promtool test rules`` on recorded
series: a case where it fires and cases where it must stay silent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from alerts_support import (
    ENGINE_PODS,
    NAMESPACE,
    OTHER_ENGINE_POD,
    ROUTER_POD,
    engine_series,
    expect,
    resource,
    router_series,
    run_promtool_test,
)
from prefixserving.autoscaling import promql
from prefixserving.render import render_children

pytestmark = pytest.mark.slow  # runs promtool

POD_A, POD_B = ENGINE_PODS
RESOURCE_LABELS = {"namespace": NAMESPACE, promql.RESOURCE_LABEL: "demo"}
WARNING = {**RESOURCE_LABELS, "severity": "warning"}
CRITICAL = {**RESOURCE_LABELS, "severity": "critical"}
AUTOSCALED = {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 2}}


def rendered_groups(**spec: Any) -> list[dict[str, Any]]:
    """The rule groups of the PrometheusRule that ``llm/demo`` renders to."""
    (rule,) = [o for o in render_children(resource(**spec)) if o["kind"] == "PrometheusRule"]
    return rule["spec"]["groups"]


def target(pod: str, values: str) -> dict[str, str]:
    return engine_series("up", pod, values)


def down_labels(pod: str, job: str, port: int) -> dict[str, str]:
    return {**CRITICAL, "pod": pod, "instance": f"{pod}:{port}", "job": job}


# ------------------------------------------------------------------------------ hit rate


def hit_rate_series(
    pod: str, hits: str, start: str = "-3600x70", queries: str = "0+600x70"
) -> list:
    """Counters of one engine pod; by default it started an hour before the series begin."""
    return [
        engine_series(promql.VLLM_PREFIX_CACHE_HITS, pod, hits),
        engine_series(promql.VLLM_PREFIX_CACHE_QUERIES, pod, queries),
        engine_series(promql.PROCESS_START_TIME, pod, start),
    ]


def test_hit_rate_decline_fires(tmp_path: Path) -> None:
    # 90% hits for 30 minutes, then 20%.
    series = hit_rate_series(POD_A, "0+540x30 16320+120x39")
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [
            expect("PrefixServingHitRateDeclining", "25m"),
            expect("PrefixServingHitRateDeclining", "50m", WARNING),
        ],
    )


def test_steady_hit_rate_is_silent(tmp_path: Path) -> None:
    series = hit_rate_series(POD_A, "0+540x70")
    run_promtool_test(
        tmp_path, rendered_groups(), series, [expect("PrefixServingHitRateDeclining", "60m")]
    )


def test_cold_new_pod_is_ignored_until_the_grace_ends(tmp_path: Path) -> None:
    # A steady pod at 90%; at 30 minutes a second pod starts and takes as many queries with no
    # hits. The fleet rate halves, but the new pod is ignored for the 20-minute grace; after
    # it, the new pod counts and the alert fires 10 minutes later (its `for`).
    grace = {"monitoring": {"alerts": {"enabled": True, "startupGraceSeconds": 1200}}}
    series = hit_rate_series(POD_A, "0+540x70") + hit_rate_series(
        POD_B, "_x30 0x40", start="_x30 1800x40", queries="_x30 0+600x40"
    )
    run_promtool_test(
        tmp_path,
        rendered_groups(**grace),
        series,
        [
            expect("PrefixServingHitRateDeclining", "45m"),
            expect("PrefixServingHitRateDeclining", "65m", WARNING),
        ],
    )


# ---------------------------------------------------------------------------- capacity


def test_kv_cache_saturated(tmp_path: Path) -> None:
    series = [
        engine_series(promql.VLLM_KV_CACHE_USAGE, POD_A, "0.95x20"),
        engine_series(promql.VLLM_KV_CACHE_USAGE, POD_B, "0.93x20"),
    ]
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [
            expect("PrefixServingKVCacheSaturated", "5m"),  # not yet for its 10m
            expect("PrefixServingKVCacheSaturated", "15m", WARNING),
        ],
    )


def test_kv_cache_saturation_is_averaged_over_own_pods_only(tmp_path: Path) -> None:
    series = [
        engine_series(promql.VLLM_KV_CACHE_USAGE, POD_A, "0.99x20"),
        engine_series(promql.VLLM_KV_CACHE_USAGE, POD_B, "0.5x20"),
        engine_series(promql.VLLM_KV_CACHE_USAGE, OTHER_ENGINE_POD, "0.99x20"),
    ]
    run_promtool_test(
        tmp_path, rendered_groups(), series, [expect("PrefixServingKVCacheSaturated", "15m")]
    )


def test_kv_threshold_comes_from_the_spec(tmp_path: Path) -> None:
    spec = {"monitoring": {"alerts": {"enabled": True, "kvSaturationThreshold": 0.4}}}
    series = [engine_series(promql.VLLM_KV_CACHE_USAGE, POD_A, "0.5x20")]
    run_promtool_test(
        tmp_path,
        rendered_groups(**spec),
        series,
        [expect("PrefixServingKVCacheSaturated", "15m", WARNING)],
    )


@pytest.mark.parametrize(
    ("waiting_a", "waiting_b", "fires"),
    [
        ("0+1x20", "0+1x20", True),  # growing, both replicas of max 2 running
        ("0+1x20", None, False),  # growing, but one replica: the autoscaler can still add one
        ("5x20", "5x20", False),  # at max but flat
    ],
)
def test_queue_growing_at_max(
    tmp_path: Path, waiting_a: str, waiting_b: str | None, fires: bool
) -> None:
    series = [engine_series(promql.VLLM_REQUESTS_WAITING, POD_A, waiting_a)]
    if waiting_b is not None:
        series.append(engine_series(promql.VLLM_REQUESTS_WAITING, POD_B, waiting_b))
    alerts = [WARNING] if fires else []
    run_promtool_test(
        tmp_path,
        rendered_groups(**AUTOSCALED),
        series,
        [expect("PrefixServingQueueGrowingAtMax", "15m", *alerts)],
    )


@pytest.mark.parametrize(("per_minute", "fires"), [(120, True), (30, False)])
def test_preemptions_rising(tmp_path: Path, per_minute: int, fires: bool) -> None:
    series = [engine_series(promql.VLLM_PREEMPTIONS, POD_A, f"0+{per_minute}x20")]
    alerts = [WARNING] if fires else []
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [expect("PrefixServingPreemptionsRising", "15m", *alerts)],
    )


# ---------------------------------------------------------------------------- presence


def test_engine_and_router_down(tmp_path: Path) -> None:
    series = [
        target(POD_A, "0x10"),
        target(POD_B, "1x10"),
        router_series("up", "0x10"),
    ]
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [
            expect("PrefixServingEngineDown", "3m"),  # not yet for its 5m
            expect("PrefixServingEngineDown", "6m", down_labels(POD_A, "demo-engine", 8000)),
            expect("PrefixServingRouterDown", "6m", down_labels(ROUTER_POD, "demo-router", 8080)),
        ],
    )


def test_up_targets_are_silent(tmp_path: Path) -> None:
    series = [target(POD_A, "1x10"), router_series("up", "1x10")]
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [
            expect("PrefixServingEngineDown", "6m"),
            expect("PrefixServingRouterDown", "6m"),
            expect("PrefixServingRoutersMissing", "6m"),
        ],
    )


@pytest.mark.parametrize(("pods", "fires"), [(ENGINE_PODS, False), (ENGINE_PODS[:1], True)])
def test_engines_missing(tmp_path: Path, pods: tuple[str, ...], fires: bool) -> None:
    series = [engine_series(promql.VLLM_REQUESTS_RUNNING, pod, "1x10") for pod in pods]
    alerts = [CRITICAL] if fires else []
    run_promtool_test(
        tmp_path,
        rendered_groups(**AUTOSCALED),
        series,
        [expect("PrefixServingEnginesMissing", "6m", *alerts)],
    )


def test_no_router_serving(tmp_path: Path) -> None:
    series = [router_series("up", "0x10")]
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [expect("PrefixServingRoutersMissing", "6m", CRITICAL)],
    )


# ----------------------------------------------------------------------------- warm-up


@pytest.mark.parametrize(
    ("timeouts", "fires_at_7m"),
    [
        ("_x5 1x25", True),  # first scraped after its timeout: the series starts at 1
        ("0x5 1x25", True),  # scraped during warm-up, then the timeout
        ("0x30", False),  # warm-up finished in time
    ],
)
def test_warmup_timed_out(tmp_path: Path, timeouts: str, fires_at_7m: bool) -> None:
    series = [engine_series(promql.WARMUP_TIMEOUTS, POD_A, timeouts, job="demo-engine-warmup")]
    alerts = [WARNING] if fires_at_7m else []
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [
            expect("PrefixServingWarmupTimedOut", "7m", *alerts),
            # 15 minutes later the old timeout no longer fires.
            expect("PrefixServingWarmupTimedOut", "25m"),
        ],
    )


# ---------------------------------------------------------------------------- hygiene


@pytest.mark.parametrize(
    ("ratio", "cause", "fires"),
    [
        ("0.98x30", "timestamp", True),
        ("0.98x30", "healthy", False),  # the router has no verdict yet (too few requests)
        ("0.4x30", "timestamp", False),
    ],
)
def test_prefix_hygiene(tmp_path: Path, ratio: str, cause: str, fires: bool) -> None:
    series = [
        router_series(promql.ROUTER_NEW_FIRST_BLOCK_RATIO, ratio, model="m"),
        router_series(promql.ROUTER_HYGIENE_CAUSE, "1x30", model="m", cause=cause),
    ]
    alerts = [{**WARNING, "model": "m", "cause": cause}] if fires else []
    run_promtool_test(
        tmp_path,
        rendered_groups(),
        series,
        [expect("PrefixServingPrefixHygiene", "20m", *alerts)],
    )
