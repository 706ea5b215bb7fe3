"""The effective autoscaling block merges spec, policy and defaults field by field."""

from __future__ import annotations

from prefixserving.api import defaults
from prefixserving.api.scaling import SCALE_DOWN, SCALE_UP, effective_autoscaling
from prefixserving.api.types import AutoscalingSpec, PrefixServingSpec, ScalingPolicySpec


def spec(**autoscaling: object) -> PrefixServingSpec:
    return PrefixServingSpec.model_validate(
        {
            "model": {"servedName": "m", "source": {"pvc": {"claimName": "w"}}},
            "autoscaling": autoscaling,
        }
    )


def test_effective_autoscaling_without_policy_uses_defaults() -> None:
    auto = effective_autoscaling(spec(enabled=True))
    assert auto.enabled and auto.backend == defaults.AUTOSCALING_BACKEND
    assert (auto.min_replicas, auto.max_replicas) == (defaults.MIN_REPLICAS, defaults.MAX_REPLICAS)
    assert auto.target_kv_cache_usage == defaults.TARGET_KV_CACHE_USAGE
    assert auto.target_queue_depth == defaults.TARGET_QUEUE_DEPTH
    assert auto.signals == defaults.SIGNALS
    assert auto.scale_up == SCALE_UP and auto.scale_down == SCALE_DOWN
    assert auto.policy_name is None


def test_spec_wins_over_policy_which_wins_over_defaults_field_by_field() -> None:
    policy = ScalingPolicySpec.model_validate(
        {
            "backend": "hpa",
            "minReplicas": 3,
            "maxReplicas": 6,
            "targets": {"kvCacheUsage": 0.7, "queueDepth": 8},
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 900, "pods": 2}},
            "prometheusUrl": "http://prom:9090",
        }
    )
    s = spec(
        enabled=True,
        policyRef={"name": "shared"},
        maxReplicas=12,
        targets={"queueDepth": 3},
        behavior={"scaleDown": {"pods": 1}},
    )
    auto = effective_autoscaling(s, policy)
    assert auto.backend == "hpa"  # policy
    assert auto.min_replicas == 3  # policy
    assert auto.max_replicas == 12  # spec
    assert auto.target_kv_cache_usage == 0.7  # policy (spec's targets block leaves it unset)
    assert auto.target_queue_depth == 3  # spec
    assert auto.scale_down.stabilization_window_s == 900  # policy
    assert auto.scale_down.pods == 1  # spec
    assert auto.scale_down.period_s == defaults.SCALE_DOWN_PERIOD_S  # default
    assert auto.scale_up == SCALE_UP
    assert auto.prometheus_url == "http://prom:9090"
    assert auto.policy_name == "shared"


def test_effective_autoscaling_accepts_the_autoscaling_block_alone() -> None:
    block = AutoscalingSpec.model_validate({"enabled": False, "minReplicas": 2})
    auto = effective_autoscaling(block)
    assert not auto.enabled and auto.min_replicas == 2
