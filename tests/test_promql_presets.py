"""The ScalingPolicy presets in ``examples/``: what a PrefixServing referencing each renders to
(KEDA and HPA), and that each preset does what its name promises relative to the others."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from prefixserving.api.types import PrefixServing
from prefixserving.api.validation import parse_scaling_policy
from prefixserving.autoscaling import promql
from prefixserving.render import render_children
from render_examples import EXAMPLES

PRESETS = ("latency-first", "cost-first", "batch")


def preset(name: str) -> Any:
    return parse_scaling_policy(
        yaml.safe_load((EXAMPLES / f"scalingpolicy-{name}.yaml").read_text())
    )


def scaler(name: str, backend: str) -> dict[str, Any]:
    """The autoscaler of a PrefixServing that only names the preset (and a backend)."""
    policy = preset(name)
    resource = PrefixServing.model_validate(
        {
            "metadata": {"name": "chat", "namespace": "llm"},
            "spec": {
                "model": {"servedName": "m", "source": {"pvc": {"claimName": "models"}}},
                "autoscaling": {
                    "enabled": True,
                    "backend": backend,
                    "policyRef": {"name": policy.metadata.name},
                },
            },
        }
    )
    kind = "ScaledObject" if backend == "keda" else "HorizontalPodAutoscaler"
    (obj,) = [o for o in render_children(resource, policy.spec) if o["kind"] == kind]
    return obj


@pytest.mark.parametrize("name", PRESETS)
def test_preset_drives_keda_and_hpa(name: str) -> None:
    spec = preset(name).spec
    keda = scaler(name, "keda")["spec"]
    hpa = scaler(name, "hpa")["spec"]
    assert preset(name).metadata.name == name
    assert (keda["minReplicaCount"], keda["maxReplicaCount"]) == (
        spec.min_replicas,
        spec.max_replicas,
    )
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (spec.min_replicas, spec.max_replicas)
    assert keda["pollingInterval"] == spec.polling_interval_seconds
    assert keda["cooldownPeriod"] == spec.cooldown_period_seconds
    behavior = keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == hpa["behavior"]
    up = behavior["scaleUp"]
    assert up["stabilizationWindowSeconds"] == spec.behavior.scale_up.stabilization_window_seconds
    assert {p["type"]: p["value"] for p in up["policies"]} == {
        "Pods": spec.behavior.scale_up.pods,
        "Percent": spec.behavior.scale_up.percent,
    }
    queries = {t["metadata"]["query"] for t in keda["triggers"]}
    adapter = {m["pods"]["metric"]["name"] for m in hpa["metrics"]}
    if "kvCacheUsage" in spec.signals:
        assert promql.kv_cache_usage("llm", "chat") in queries
        assert promql.ADAPTER_METRIC_KV_CACHE_USAGE in adapter
    assert promql.queue_depth_total("llm", "chat") in queries
    assert promql.ADAPTER_METRIC_REQUESTS_WAITING in adapter
    assert len(queries) == len(adapter) == len(spec.signals)


def thresholds(name: str) -> dict[str, float]:
    triggers = scaler(name, "keda")["spec"]["triggers"]
    return {t["name"]: float(t["metadata"]["threshold"]) for t in triggers}


def test_latency_first_reacts_before_cost_first() -> None:
    latency, cost = thresholds("latency-first"), thresholds("cost-first")
    assert latency.keys() == cost.keys() == {"kv-cache-usage", "queue-depth"}
    assert all(latency[k] < cost[k] for k in latency)
    fast, slow = preset("latency-first").spec.behavior, preset("cost-first").spec.behavior
    assert fast.scale_up.stabilization_window_seconds < slow.scale_up.stabilization_window_seconds
    assert fast.scale_up.period_seconds < slow.scale_up.period_seconds
    # Latency keeps warm replicas longer; cost gives them back sooner.
    assert (
        fast.scale_down.stabilization_window_seconds > slow.scale_down.stabilization_window_seconds
    )
    assert preset("latency-first").spec.min_replicas >= 2


def test_batch_scales_on_the_backlog_only() -> None:
    batch = thresholds("batch")
    assert set(batch) == {"queue-depth"}
    assert batch["queue-depth"] > max(thresholds(n)["queue-depth"] for n in PRESETS[:2])
    spec = preset("batch").spec
    assert spec.behavior.scale_down.stabilization_window_seconds >= 600
    assert spec.max_replicas == max(preset(n).spec.max_replicas for n in PRESETS)
