"""Every default of the API, in one place, and the resolution of the effective autoscaling block.

The models in ``types.py`` take their field defaults from here, so the CRD (generated from the
models) and the Python side always agree. Autoscaling tunables are the exception: they have no
schema default, because a value left unset in ``spec.autoscaling`` falls back to the referenced
``ScalingPolicy`` first and only then to the defaults below (``effective_autoscaling``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from prefixserving import constants
from prefixserving.peek.guard import DEFAULT_PIN_BUDGET_FRACTION
from prefixserving.peek.holding import DEFAULT_MAX_SIBLING_WAIT_S
from prefixserving.peek.lanes import DEFAULT_MAX_OVERTAKES

if TYPE_CHECKING:
    from prefixserving.api.types import (
        AutoscalingSpec,
        PrefixServingSpec,
        ScalingParameters,
        ScalingPolicySpec,
        ScalingRules,
    )

NAMESPACE: Final = "default"

# model
HF_REVISION: Final = "main"
HF_TOKEN_KEY: Final = "token"

# engine
ENGINE_IMAGE: Final = constants.ENGINE_IMAGE
IMAGE_PULL_POLICY: Final = "IfNotPresent"
TENSOR_PARALLEL_SIZE: Final = 1
GPU_RESOURCE_NAME: Final = "nvidia.com/gpu"
GPU_MEMORY_UTILIZATION: Final = 0.9
BLOCK_SIZE: Final = 16
# Block sizes the GPU attention backends of vLLM accept (multiples of 16 up to 128).
BLOCK_SIZES: Final = (16, 32, 64, 128)
ENGINE_CPU: Final = "8"
ENGINE_MEMORY: Final = "64Gi"
STARTUP_TIMEOUT_S: Final = 1800
DRAIN_S: Final = 20
TERMINATION_GRACE_S: Final = 120
MAX_SURGE: Final = 1

# scheduler
SCHEDULER_POLICY: Final = "peek"
# The engine's own defaults (prefixserving.peek), so an engine started without the operator
# schedules like one the operator renders, and the replay benchmark measures the default.
MAX_SIBLING_WAIT_MS: Final = round(DEFAULT_MAX_SIBLING_WAIT_S * 1000)
PIN_BUDGET_FRACTION: Final = DEFAULT_PIN_BUDGET_FRACTION
LANES: Final = True
MAX_OVERTAKES: Final = DEFAULT_MAX_OVERTAKES

# placement
SHM_SIZE_LIMIT: Final = "16Gi"
IPC: Final = "isolated"
NUMA: Final = "none"

# replicas when autoscaling is off
REPLICAS: Final = 1

# router
ROUTER_IMAGE: Final = constants.ROUTER_IMAGE
ROUTER_REPLICAS: Final = 2
ROUTER_ALGORITHM: Final = "prefix-affinity"
ROUTER_LOAD_BOUND: Final = constants.ROUTER_LOAD_BOUND
ROUTER_PREFIX_BLOCKS: Final = constants.ROUTER_PREFIX_BLOCKS
ROUTER_BLOCK_CHARS: Final = constants.ROUTER_BLOCK_CHARS
ROUTER_CPU: Final = "1"
ROUTER_MEMORY: Final = "1Gi"

# autoscaling
AUTOSCALING_BACKEND: Final = "keda"
MIN_REPLICAS: Final = 1
MAX_REPLICAS: Final = 4
TARGET_KV_CACHE_USAGE: Final = 0.8
TARGET_QUEUE_DEPTH: Final = 5.0
SIGNALS: Final = ("kvCacheUsage", "queueDepth")
PROMETHEUS_URL: Final = "http://prometheus-operated.monitoring.svc.cluster.local:9090"
POLLING_INTERVAL_S: Final = 15
COOLDOWN_PERIOD_S: Final = 300
SCALE_UP_WINDOW_S: Final = 0
SCALE_UP_PODS: Final = 2
SCALE_UP_PERCENT: Final = 100
SCALE_UP_PERIOD_S: Final = 60
SCALE_DOWN_WINDOW_S: Final = 300
SCALE_DOWN_PODS: Final = 1
SCALE_DOWN_PERCENT: Final = 50
SCALE_DOWN_PERIOD_S: Final = 120

# warm-up
WARMUP_IMAGE: Final = constants.ROUTER_IMAGE
WARMUP_HOT_PREFIXES: Final = 32
WARMUP_TIMEOUT_S: Final = 300
WARMUP_CONFIGMAP_KEY: Final = "prompts.json"

# monitoring
KV_SATURATION_THRESHOLD: Final = 0.9
KV_SATURATION_FOR: Final = "10m"
HIT_RATE_DROP_FRACTION: Final = 0.3
STARTUP_GRACE_S: Final = 600
FIRST_BLOCK_NEW_THRESHOLD: Final = 0.9
PREEMPTIONS_PER_S: Final = 1.0


@dataclass(frozen=True)
class ScalingBehavior:
    """One direction of HPA behaviour, fully resolved: stabilization window and rate limits."""

    stabilization_window_s: int
    pods: int
    percent: int
    period_s: int


@dataclass(frozen=True)
class EffectiveAutoscaling:
    """``spec.autoscaling`` merged with its ``ScalingPolicy`` and the defaults; nothing unset.

    ``policy_name`` names the ScalingPolicy that contributed values (None when there is none).
    """

    enabled: bool
    backend: str
    min_replicas: int
    max_replicas: int
    target_kv_cache_usage: float
    target_queue_depth: float
    signals: tuple[str, ...]
    prometheus_url: str
    polling_interval_s: int
    cooldown_period_s: int
    scale_up: ScalingBehavior
    scale_down: ScalingBehavior
    policy_name: str | None


def _pick(layers: Sequence[object | None], attr: str, default: Any) -> Any:
    """``attr`` of the first layer that has it set (not None), else ``default``."""
    for layer in layers:
        value = getattr(layer, attr) if layer is not None else None
        if value is not None:
            return value
    return default


def _rules(layers: Sequence[ScalingRules | None], default: ScalingBehavior) -> ScalingBehavior:
    """Resolve one scaling direction field by field: spec, then policy, then default."""
    return ScalingBehavior(
        stabilization_window_s=_pick(
            layers, "stabilization_window_seconds", default.stabilization_window_s
        ),
        pods=_pick(layers, "pods", default.pods),
        percent=_pick(layers, "percent", default.percent),
        period_s=_pick(layers, "period_seconds", default.period_s),
    )


SCALE_UP: Final = ScalingBehavior(
    SCALE_UP_WINDOW_S, SCALE_UP_PODS, SCALE_UP_PERCENT, SCALE_UP_PERIOD_S
)
SCALE_DOWN: Final = ScalingBehavior(
    SCALE_DOWN_WINDOW_S, SCALE_DOWN_PODS, SCALE_DOWN_PERCENT, SCALE_DOWN_PERIOD_S
)


def effective_autoscaling(
    spec: PrefixServingSpec | AutoscalingSpec, policy: ScalingPolicySpec | None = None
) -> EffectiveAutoscaling:
    """Merge ``spec.autoscaling`` over a ScalingPolicy over the defaults, field by field.

    A value set in the spec wins; otherwise the policy's value; otherwise the default here.
    Nested blocks (targets, behavior.scaleUp/scaleDown) merge field by field too. ``spec`` may
    be the whole PrefixServingSpec or just its autoscaling block; ``policy`` is the spec of the
    ScalingPolicy that ``policyRef`` names (the operator resolves it; None without a
    reference). Pure; cost is constant.
    """
    auto: AutoscalingSpec = getattr(spec, "autoscaling", spec)
    layers: list[ScalingParameters] = [auto] if policy is None else [auto, policy]
    targets = [layer.targets for layer in layers]
    behaviors = [layer.behavior for layer in layers]
    return EffectiveAutoscaling(
        enabled=auto.enabled,
        backend=_pick(layers, "backend", AUTOSCALING_BACKEND),
        min_replicas=_pick(layers, "min_replicas", MIN_REPLICAS),
        max_replicas=_pick(layers, "max_replicas", MAX_REPLICAS),
        target_kv_cache_usage=_pick(targets, "kv_cache_usage", TARGET_KV_CACHE_USAGE),
        target_queue_depth=_pick(targets, "queue_depth", TARGET_QUEUE_DEPTH),
        signals=tuple(_pick(layers, "signals", SIGNALS)),
        prometheus_url=_pick(layers, "prometheus_url", PROMETHEUS_URL),
        polling_interval_s=_pick(layers, "polling_interval_seconds", POLLING_INTERVAL_S),
        cooldown_period_s=_pick(layers, "cooldown_period_seconds", COOLDOWN_PERIOD_S),
        scale_up=_rules([_pick([b], "scale_up", None) for b in behaviors], SCALE_UP),
        scale_down=_rules([_pick([b], "scale_down", None) for b in behaviors], SCALE_DOWN),
        policy_name=auto.policy_ref.name if auto.policy_ref is not None else None,
    )
