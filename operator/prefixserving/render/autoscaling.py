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
    matchers = (namespace, name)
    # signal -> KEDA trigger name, PromQL, KEDA metric type, prometheus-adapter metric.
    every = {
        "kvCacheUsage": (
            "kv-cache-usage",
            promql.kv_cache_usage(*matchers),
            "Value",
            promql.ADAPTER_METRIC_KV_CACHE_USAGE,
        ),
        "queueDepth": (
            "queue-depth",
            promql.queue_depth_total(*matchers),
            "AverageValue",
            promql.ADAPTER_METRIC_REQUESTS_WAITING,
        ),
        "backlogSeconds": (
            "backlog-seconds",
            promql.backlog_seconds_total(*matchers, auto.prefill_tokens_per_s),
            "AverageValue",
            promql.ADAPTER_METRIC_BACKLOG_SECONDS,
        ),
    }
    signals = [
        dict(zip(("trigger", "query", "metric_type", "adapter_metric"), every[s], strict=True))
        | {"target": target, "activation_threshold": None}
        for s, target in auto.targets().items()
    ]
    if auto.min_replicas == 0:
        # Scale from zero: no engine series exist at 0 replicas; the routers' held requests
        # wake the Deployment (KEDA activates above the activation threshold), and afterwards
        # ask for one replica per held request while none is Ready.
        signals.append(
            {
                "trigger": "held-requests",
                "query": promql.held_requests_total(*matchers),
                "metric_type": "AverageValue",
                "adapter_metric": None,
                "target": 1,
                "activation_threshold": "0",
            }
        )
    for signal in signals:
        signal["threshold"] = number(signal["target"])
        signal["average_value"] = quantity(signal["target"])
    return {
        "min_replicas": auto.min_replicas,
        # An HPA cannot scale to zero (validation keeps minReplicas 0 to the KEDA backend).
        "hpa_min_replicas": max(auto.min_replicas, 1),
        "max_replicas": auto.max_replicas,
        "prometheus_url": auto.prometheus_url,
        "polling_interval_s": auto.polling_interval_s,
        "cooldown_period_s": auto.cooldown_period_s,
        "behavior": behavior,
        "signals": signals,
    }
