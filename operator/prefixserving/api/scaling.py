"""The effective autoscaling of a PrefixServing: ``spec.autoscaling`` merged with the
ScalingPolicy it references and the defaults, field by field, into one resolved value.

The renderer (HPA, KEDA ScaledObject, alerts, engine replicas) and the scaling simulator read
only :class:`EffectiveAutoscaling`, never the three layers. Pure; cost is constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from prefixserving.api import defaults
from prefixserving.api.types import (
    AutoscalingSpec,
    PrefixServingSpec,
    ScalingParameters,
    ScalingPolicySpec,
    ScalingRules,
)


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
    target_backlog_seconds: float
    signals: tuple[str, ...]
    prefill_tokens_per_s: float
    prometheus_url: str
    polling_interval_s: int
    cooldown_period_s: int
    scale_up: ScalingBehavior
    scale_down: ScalingBehavior
    policy_name: str | None

    def targets(self) -> dict[str, float]:
        """Target of each enabled signal, by its spec name (``kvCacheUsage``, ...)."""
        every = {
            "kvCacheUsage": self.target_kv_cache_usage,
            "queueDepth": self.target_queue_depth,
            "backlogSeconds": self.target_backlog_seconds,
        }
        return {signal: every[signal] for signal in self.signals}


SCALE_UP: Final = ScalingBehavior(
    defaults.SCALE_UP_WINDOW_S,
    defaults.SCALE_UP_PODS,
    defaults.SCALE_UP_PERCENT,
    defaults.SCALE_UP_PERIOD_S,
)
SCALE_DOWN: Final = ScalingBehavior(
    defaults.SCALE_DOWN_WINDOW_S,
    defaults.SCALE_DOWN_PODS,
    defaults.SCALE_DOWN_PERCENT,
    defaults.SCALE_DOWN_PERIOD_S,
)


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


def effective_autoscaling(
    spec: PrefixServingSpec | AutoscalingSpec, policy: ScalingPolicySpec | None = None
) -> EffectiveAutoscaling:
    """Merge ``spec.autoscaling`` over a ScalingPolicy over the defaults, field by field.

    A value set in the spec wins; otherwise the policy's value; otherwise the default
    (``api/defaults.py``). Nested blocks (targets, behavior.scaleUp/scaleDown) merge field by
    field too. ``spec`` may be the whole PrefixServingSpec or just its autoscaling block;
    ``policy`` is the spec of the ScalingPolicy that ``policyRef`` names (the operator
    resolves it; None without a reference). Pure; cost is constant.
    """
    auto: AutoscalingSpec = getattr(spec, "autoscaling", spec)
    layers: list[ScalingParameters] = [auto] if policy is None else [auto, policy]
    targets = [layer.targets for layer in layers]
    behaviors = [layer.behavior for layer in layers]
    return EffectiveAutoscaling(
        enabled=auto.enabled,
        backend=_pick(layers, "backend", defaults.AUTOSCALING_BACKEND),
        min_replicas=_pick(layers, "min_replicas", defaults.MIN_REPLICAS),
        max_replicas=_pick(layers, "max_replicas", defaults.MAX_REPLICAS),
        target_kv_cache_usage=_pick(targets, "kv_cache_usage", defaults.TARGET_KV_CACHE_USAGE),
        target_queue_depth=_pick(targets, "queue_depth", defaults.TARGET_QUEUE_DEPTH),
        target_backlog_seconds=_pick(targets, "backlog_seconds", defaults.TARGET_BACKLOG_SECONDS),
        signals=tuple(_pick(layers, "signals", defaults.SIGNALS)),
        prefill_tokens_per_s=_pick(
            layers, "prefill_tokens_per_second", defaults.PREFILL_TOKENS_PER_S
        ),
        prometheus_url=_pick(layers, "prometheus_url", defaults.PROMETHEUS_URL),
        polling_interval_s=_pick(layers, "polling_interval_seconds", defaults.POLLING_INTERVAL_S),
        cooldown_period_s=_pick(layers, "cooldown_period_seconds", defaults.COOLDOWN_PERIOD_S),
        scale_up=_rules([_pick([b], "scale_up", None) for b in behaviors], SCALE_UP),
        scale_down=_rules([_pick([b], "scale_down", None) for b in behaviors], SCALE_DOWN),
        policy_name=auto.policy_ref.name if auto.policy_ref is not None else None,
    )
