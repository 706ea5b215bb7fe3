"""Template values of the autoscaler (HPA on prometheus-adapter metrics, or KEDA with
Prometheus triggers): one entry per signal with its PromQL query, adapter metric name and
target. Pure; cost is constant."""

from __future__ import annotations

from typing import Any

from prefixserving.api.scaling import EffectiveAutoscaling, ScalingBehavior
from prefixserving.api.types import PrefixServing
from prefixserving.autoscaling import promql
from prefixserving.render.formats import number, quantity


def _behavior(rules: ScalingBehavior, select: str) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_s,
        "selectPolicy": select,
        "policies": [
            {"type": "Pods", "value": rules.pods, "periodSeconds": rules.period_s},
            {"type": "Percent", "value": rules.percent, "periodSeconds": rules.period_s},
        ],
    }


def autoscaling_context(resource: PrefixServing, auto: EffectiveAutoscaling) -> dict[str, Any]:
    """Values of the HPA and KEDA templates: bounds, behaviour, and one entry per signal."""
    name, namespace = resource.metadata.name, resource.metadata.namespace
    # Scale up by the larger allowed step, down by the smaller one.
    behavior = {
        "scaleUp": _behavior(auto.scale_up, "Max"),
        "scaleDown": _behavior(auto.scale_down, "Min"),
    }
    signals = []
    if "kvCacheUsage" in auto.signals:
        signals.append(
            {
                "trigger": "kv-cache-usage",
                "query": promql.kv_cache_usage(namespace, name),
                "metric_type": "Value",
                "adapter_metric": promql.ADAPTER_METRIC_KV_CACHE_USAGE,
                "target": auto.target_kv_cache_usage,
            }
        )
    if "queueDepth" in auto.signals:
        signals.append(
            {
                "trigger": "queue-depth",
                "query": promql.queue_depth_total(namespace, name),
                "metric_type": "AverageValue",
                "adapter_metric": promql.ADAPTER_METRIC_REQUESTS_WAITING,
                "target": auto.target_queue_depth,
            }
        )
    for signal in signals:
        signal["threshold"] = number(signal["target"])
        signal["average_value"] = quantity(signal["target"])
    return {
        "min_replicas": auto.min_replicas,
        "max_replicas": auto.max_replicas,
        "prometheus_url": auto.prometheus_url,
        "polling_interval_s": auto.polling_interval_s,
        "cooldown_period_s": auto.cooldown_period_s,
        "behavior": behavior,
        "signals": signals,
    }
