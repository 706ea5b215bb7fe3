"""The Kubernetes HorizontalPodAutoscaler algorithm (``autoscaling/v2``) as pure functions.

The simulator runs it to measure how KV-cache and queue signals scale a fleet; it follows the
controller's ``replica_calculator.go`` and ``horizontal.go`` (Kubernetes 1.29-1.35) and the
behaviour documented at kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/.

**Algorithm** (one sync, every ``--horizontal-pod-autoscaler-sync-period``, 15 s):

1. Per metric (:func:`metric_proposal`), ``ratio = mean(ready pods' values) / target`` and the
   proposal is ``ceil(ratio * ready_pods)``; a ratio within ``tolerance`` (0.1) of 1 keeps
   the current count. Pods with no value yet (pending, engine loading) count as using 0
   when the ratio says scale up and as the target when it says scale down; when that flips
   the direction or lands within tolerance, the current count is kept.
2. Several metrics: the largest proposal wins (:func:`combine`).
3. Stabilization (:meth:`Autoscaler.sync`): the recommendation may rise only to the lowest
   proposal of the scale-up window and fall only to the highest proposal of the scale-down
   window (default windows: 0 s up, 300 s down).
4. Rate policies (:func:`scale_up_limit`, :func:`scale_down_limit`): each policy allows
   ``Pods`` replicas or ``Percent`` of the replicas at the start of its ``period_s`` (the
   changes made within the last period are subtracted); ``select_policy`` ``Max`` takes the
   policy allowing the biggest change, ``Min`` the smallest, ``Disabled`` none. Percent up is
   rounded up, percent down is truncated, as in the controller.
5. Clamp to ``[min_replicas, max_replicas]``; a count already outside the bounds is moved to
   the bound directly.

**Parameters**: :class:`HpaSpec` (targets, bounds, :class:`Behavior`, tolerance).
**Cost**: O(pods) per metric, O(recommendations + events in the windows) per sync.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prefixserving.api.scaling import EffectiveAutoscaling, ScalingBehavior

DEFAULT_TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0

PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]


@dataclass(frozen=True, slots=True)
class RatePolicy:
    """At most ``value`` pods (``Pods``) or percent of the replicas (``Percent``) per period."""

    type: PolicyType
    value: int
    period_s: float


@dataclass(frozen=True, slots=True)
class Rules:
    """One direction of ``spec.behavior``."""

    stabilization_window_s: float
    policies: tuple[RatePolicy, ...]
    select_policy: SelectPolicy = "Max"


# Kubernetes' defaults when ``behavior`` is omitted.
DEFAULT_SCALE_UP = Rules(
    0.0, (RatePolicy("Percent", 100, 15.0), RatePolicy("Pods", 4, 15.0)), "Max"
)
DEFAULT_SCALE_DOWN = Rules(300.0, (RatePolicy("Percent", 100, 15.0),), "Max")


@dataclass(frozen=True, slots=True)
class Behavior:
    scale_up: Rules = DEFAULT_SCALE_UP
    scale_down: Rules = DEFAULT_SCALE_DOWN


@dataclass(frozen=True, slots=True)
class HpaSpec:
    """Targets (average value per pod, by metric name), bounds and behaviour."""

    targets: Mapping[str, float]
    min_replicas: int = 1
    max_replicas: int = 10
    behavior: Behavior = field(default_factory=Behavior)
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self) -> None:
        if not self.targets or any(t <= 0 for t in self.targets.values()):
            raise ValueError("at least one metric with a target > 0 is needed")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")


def metric_proposal(
    current_replicas: int,
    ready_values: Sequence[float],
    target: float,
    *,
    missing_pods: int = 0,
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """Replicas one Pods/AverageValue metric asks for (step 1 of the module docstring).

    ``ready_values``: the metric of each pod that reports it. ``missing_pods``: pods of the
    Deployment with no value yet (pending, or an engine still loading): they count as using
    0 when the others ask to scale up and as exactly the target when they ask to scale down.
    """
    if not ready_values:
        return current_replicas  # no metrics for any pod: the controller does not scale
    count = len(ready_values)
    ratio = sum(ready_values) / (count * target)
    if missing_pods == 0:
        if abs(ratio - 1.0) <= tolerance:
            return current_replicas
        return math.ceil(ratio * count)
    filled = sum(ready_values) + (missing_pods * target if ratio < 1.0 else 0.0)
    pods = count + missing_pods
    new_ratio = filled / (pods * target)
    if abs(new_ratio - 1.0) <= tolerance or (ratio < 1.0 < new_ratio) or (new_ratio < 1.0 < ratio):
        return current_replicas
    proposal = math.ceil(new_ratio * pods)
    if (new_ratio < 1.0 and proposal > current_replicas) or (
        new_ratio > 1.0 and proposal < current_replicas
    ):
        return current_replicas
    return proposal


def combine(proposals: Sequence[int]) -> int:
    """Several metrics: the largest proposal."""
    return max(proposals)


@dataclass(frozen=True, slots=True)
class ScaleEvent:
    time_s: float
    change: int  # replicas added (scale up) or removed (scale down), > 0


def _changed_within(events: Sequence[ScaleEvent], now_s: float, period_s: float) -> int:
    return sum(e.change for e in events if e.time_s > now_s - period_s)


def scale_up_limit(current: int, events: Sequence[ScaleEvent], rules: Rules, now_s: float) -> int:
    """Most replicas the scale-up policies allow now (never below ``current``)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for policy in rules.policies:
        start = current - _changed_within(events, now_s, policy.period_s)
        if policy.type == "Pods":
            proposals.append(start + policy.value)
        else:
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    limit = max(proposals) if rules.select_policy == "Max" else min(proposals)
    return max(limit, current)


def scale_down_limit(current: int, events: Sequence[ScaleEvent], rules: Rules, now_s: float) -> int:
    """Fewest replicas the scale-down policies allow now (never above ``current``)."""
    if rules.select_policy == "Disabled" or not rules.policies:
        return current
    proposals = []
    for policy in rules.policies:
        start = current + _changed_within(events, now_s, policy.period_s)
        if policy.type == "Pods":
            proposals.append(start - policy.value)
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    # "Max" selects the policy allowing the biggest change: the fewest replicas.
    limit = min(proposals) if rules.select_policy == "Max" else max(proposals)
    return min(limit, current)


@dataclass
class Autoscaler:
    """One HPA object: keeps the recommendation history and scale events between syncs."""

    spec: HpaSpec
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    up_events: list[ScaleEvent] = field(default_factory=list)
    down_events: list[ScaleEvent] = field(default_factory=list)

    def sync(
        self,
        now_s: float,
        current: int,
        metrics: Mapping[str, Sequence[float]],
        missing_pods: int = 0,
    ) -> int:
        """Desired replicas at ``now_s`` given each reporting pod's value per metric name and
        the number of pods with no value yet."""
        spec = self.spec
        if current > spec.max_replicas or current < spec.min_replicas:
            desired = min(max(current, spec.min_replicas), spec.max_replicas)
            self._record(now_s, current, desired)
            return desired
        proposal = combine(
            [
                metric_proposal(
                    current,
                    metrics.get(name, ()),
                    target,
                    missing_pods=missing_pods,
                    tolerance=spec.tolerance,
                )
                for name, target in spec.targets.items()
            ]
        )
        desired = self._stabilize(now_s, current, proposal)
        behavior = spec.behavior
        if desired > current:
            limit = scale_up_limit(current, self.up_events, behavior.scale_up, now_s)
            desired = min(desired, limit, spec.max_replicas)
        elif desired < current:
            limit = scale_down_limit(current, self.down_events, behavior.scale_down, now_s)
            desired = max(desired, limit, spec.min_replicas)
        desired = min(max(desired, spec.min_replicas), spec.max_replicas)
        self._record(now_s, current, desired)
        return desired

    def _stabilize(self, now_s: float, current: int, proposal: int) -> int:
        up_window = self.spec.behavior.scale_up.stabilization_window_s
        down_window = self.spec.behavior.scale_down.stabilization_window_s
        up = down = proposal
        for time_s, value in self.recommendations:
            if time_s > now_s - up_window:
                up = min(up, value)
            if time_s > now_s - down_window:
                down = max(down, value)
        horizon = max(up_window, down_window)
        self.recommendations = [r for r in self.recommendations if r[0] > now_s - horizon]
        self.recommendations.append((now_s, proposal))
        return min(max(current, up), down)

    def _record(self, now_s: float, current: int, desired: int) -> None:
        longest = max(
            [p.period_s for p in self.spec.behavior.scale_up.policies]
            + [p.period_s for p in self.spec.behavior.scale_down.policies]
            + [0.0]
        )
        if desired > current:
            self.up_events.append(ScaleEvent(now_s, desired - current))
        elif desired < current:
            self.down_events.append(ScaleEvent(now_s, current - desired))
        self.up_events = [e for e in self.up_events if e.time_s > now_s - longest]
        self.down_events = [e for e in self.down_events if e.time_s > now_s - longest]


def rules_from_spec(rules: ScalingBehavior, select_policy: SelectPolicy) -> Rules:
    """The HPA rules the operator renders for one resolved direction (Pods and Percent)."""
    period = float(rules.period_s)
    return Rules(
        float(rules.stabilization_window_s),
        (RatePolicy("Pods", rules.pods, period), RatePolicy("Percent", rules.percent, period)),
        select_policy,
    )


def hpa_from_autoscaling(auto: EffectiveAutoscaling, metric_names: Mapping[str, str]) -> HpaSpec:
    """The HPA the operator renders for ``auto``: scale up by the larger allowed step (Max),
    down by the smaller (Min). ``metric_names`` maps signal (``kvCacheUsage``,
    ``queueDepth``, ``backlogSeconds``) to the metric name the caller feeds to
    :meth:`Autoscaler.sync`."""
    return HpaSpec(
        targets={metric_names[s]: target for s, target in auto.targets().items()},
        min_replicas=auto.min_replicas,
        max_replicas=auto.max_replicas,
        behavior=Behavior(
            rules_from_spec(auto.scale_up, "Max"), rules_from_spec(auto.scale_down, "Min")
        ),
    )
