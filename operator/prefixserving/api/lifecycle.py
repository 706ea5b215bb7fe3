"""The conditions of a PrefixServing's ``status.conditions``: every type and reason, who sets
it and when, how they roll up into ``Ready``, and the helpers that build them.

``Ready`` means *serving traffic* (as KServe's Ready): clients that call the router get
answers. It does not wait for a rollout; ``Progressing`` says whether one is under way.

=====================  =====================================================================
Condition              Meaning, who sets it, when
=====================  =====================================================================
``Ready``              True, ``AllReplicasReady``: at least one engine pod is Ready (after its
                       warm-up when warm-up is on) and at least one router replica is ready.
                       False, ``EngineUnavailable`` / ``RouterUnavailable``: no engine pod or
                       no router replica serves. Set by the status job (``controller/handlers
                       /status.py``, every status interval) once the resource was reconciled.
                       False, ``InvalidSpec`` / ``RenderFailed``: set by the reconcile; the
                       status job leaves ``InvalidSpec`` in place while that generation is
                       current, and judges the pods again after ``RenderFailed`` (the pods of
                       the last applied generation keep serving).
``Progressing``        True, ``RollingOut``: the reconcile applied a new generation. False,
                       ``RolloutComplete``: the status job saw both Deployments report every
                       replica updated for the current generation. False, ``InvalidSpec`` /
                       ``RenderFailed``: nothing was applied; the message says what to do.
``Degraded``           True, ``InvalidSpec``, ``RenderFailed``, ``ChildRejected`` (the API
                       server refused a child), ``ScalerMissing`` (KEDA or the custom metrics
                       API is not installed), ``InferencePoolMissing`` (router.mode
                       endpointPicker, and the InferencePool CRD of the Gateway API Inference
                       Extension is not installed: the pool is skipped, the picker runs) or
                       ``PolicyNotFound`` (the ScalingPolicy named by ``policyRef`` is missing
                       or invalid). False, ``Reconciled``: every child was applied. Set by the
                       reconcile (create, update, resume, resync).
``MetricsAvailable``   True, ``PrometheusAnswered``; False, ``PrometheusUnavailable``; Unknown,
                       ``PrometheusNotConfigured`` (the operator runs without
                       ``--prometheus-url``). Set by the metrics job; only ``status.metrics``
                       and ``status.hints`` depend on it.
=====================  =====================================================================

Roll-up into Ready: only the replicas that serve decide it. ``Degraded`` and
``MetricsAvailable`` never turn Ready False on their own (a refused PodDisruptionBudget or a
Prometheus outage leaves the model served), except for ``InvalidSpec`` and ``RenderFailed``,
which set Ready False with the reason because the spec as written cannot be served.
``Progressing=True`` does not block Ready: during a rollout the old pods keep serving.

There is no "unset" (remove a condition) helper: every condition is always present once its
job has run, and the one optional part, metrics, reports ``Unknown`` with the flag to set
rather than disappearing, so ``kubectl describe`` says how to turn it on.

Transitions (a status or reason change) become Events; the bad ones (Ready False, Degraded
True, MetricsAvailable False) Warning Events. Functions are pure; :func:`apply` is linear in
the number of conditions.
"""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

# Condition types.
COND_READY: Final = "Ready"
COND_PROGRESSING: Final = "Progressing"
COND_DEGRADED: Final = "Degraded"
COND_METRICS: Final = "MetricsAvailable"

# Reasons (see the module docstring for who sets each).
REASON_READY: Final = "AllReplicasReady"
REASON_ENGINE_UNAVAILABLE: Final = "EngineUnavailable"
REASON_ROUTER_UNAVAILABLE: Final = "RouterUnavailable"
REASON_INVALID_SPEC: Final = "InvalidSpec"
REASON_RENDER_FAILED: Final = "RenderFailed"
REASON_ROLLING_OUT: Final = "RollingOut"
REASON_ROLLOUT_COMPLETE: Final = "RolloutComplete"
REASON_CHILD_REJECTED: Final = "ChildRejected"
REASON_SCALER_MISSING: Final = "ScalerMissing"
REASON_INFERENCE_POOL_MISSING: Final = "InferencePoolMissing"
REASON_POLICY_NOT_FOUND: Final = "PolicyNotFound"
REASON_RECONCILED: Final = "Reconciled"
REASON_PROMETHEUS_ANSWERED: Final = "PrometheusAnswered"
REASON_PROMETHEUS_UNAVAILABLE: Final = "PrometheusUnavailable"
REASON_PROMETHEUS_NOT_CONFIGURED: Final = "PrometheusNotConfigured"

# The reasons a reconcile stops with: Ready False, Degraded True, Progressing False.
HALT_REASONS: Final = frozenset({REASON_INVALID_SPEC, REASON_RENDER_FAILED})
NOT_READY_REASONS: Final = HALT_REASONS | {REASON_ENGINE_UNAVAILABLE, REASON_ROUTER_UNAVAILABLE}
DEGRADED_REASONS: Final = HALT_REASONS | {
    REASON_CHILD_REJECTED,
    REASON_SCALER_MISSING,
    REASON_INFERENCE_POOL_MISSING,
    REASON_POLICY_NOT_FOUND,
}

# (type, status) pairs that are bad news: their transitions are Warning Events.
_WARNING_STATES: Final = {
    (COND_READY, "False"),
    (COND_DEGRADED, "True"),
    (COND_METRICS, "False"),
}
# Order of status.conditions: these first, any other type after them.
_ORDER: Final = (COND_READY, COND_PROGRESSING, COND_DEGRADED)


@dataclass(frozen=True)
class ConditionUpdate:
    """A condition the operator wants set: ``status`` True, False or None (Unknown)."""

    type: str
    status: bool | None
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else str(self.status)


@dataclass(frozen=True)
class Transition:
    """A condition whose status or reason changed: worth an Event."""

    condition: ConditionUpdate

    @property
    def warning(self) -> bool:
        return (self.condition.type, self.condition.status_text) in _WARNING_STATES


def _checked(reason: str, allowed: Collection[str], condition: str) -> str:
    if reason not in allowed:
        raise ValueError(f"{reason!r} is not a documented {condition} reason: {sorted(allowed)}")
    return reason


def mark_ready(message: str) -> ConditionUpdate:
    """Ready=True: an engine pod and a router replica serve."""
    return ConditionUpdate(COND_READY, True, REASON_READY, message)


def mark_not_ready(reason: str, message: str) -> ConditionUpdate:
    """Ready=False with one of :data:`NOT_READY_REASONS`."""
    return ConditionUpdate(COND_READY, False, _checked(reason, NOT_READY_REASONS, "Ready"), message)


def mark_rolling_out(message: str) -> ConditionUpdate:
    """Progressing=True: a new generation was applied."""
    return ConditionUpdate(COND_PROGRESSING, True, REASON_ROLLING_OUT, message)


def mark_rollout_complete(message: str) -> ConditionUpdate:
    """Progressing=False: every replica runs the current generation."""
    return ConditionUpdate(COND_PROGRESSING, False, REASON_ROLLOUT_COMPLETE, message)


def mark_halted(reason: str, next_step: str) -> ConditionUpdate:
    """Progressing=False with one of :data:`HALT_REASONS`: nothing was applied."""
    return ConditionUpdate(
        COND_PROGRESSING, False, _checked(reason, HALT_REASONS, "halting"), next_step
    )


def mark_degraded(reason: str, message: str) -> ConditionUpdate:
    """Degraded=True with one of :data:`DEGRADED_REASONS`."""
    return ConditionUpdate(
        COND_DEGRADED, True, _checked(reason, DEGRADED_REASONS, "Degraded"), message
    )


def mark_reconciled(message: str) -> ConditionUpdate:
    """Degraded=False: every child was applied."""
    return ConditionUpdate(COND_DEGRADED, False, REASON_RECONCILED, message)


def mark_metrics_available(message: str) -> ConditionUpdate:
    """MetricsAvailable=True: Prometheus answered every query."""
    return ConditionUpdate(COND_METRICS, True, REASON_PROMETHEUS_ANSWERED, message)


def mark_metrics_unavailable(message: str) -> ConditionUpdate:
    """MetricsAvailable=False: Prometheus did not answer (the old figures stay)."""
    return ConditionUpdate(COND_METRICS, False, REASON_PROMETHEUS_UNAVAILABLE, message)


def mark_metrics_unknown(message: str) -> ConditionUpdate:
    """MetricsAvailable=Unknown: no Prometheus configured; ``message`` says how to set one."""
    return ConditionUpdate(COND_METRICS, None, REASON_PROMETHEUS_NOT_CONFIGURED, message)


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of type ``type_`` in a ``status.conditions`` list, or None."""
    return next((c for c in conditions or () if c.get("type") == type_), None)


def apply(
    conditions: Sequence[Mapping[str, Any]] | None,
    updates: Sequence[ConditionUpdate],
    generation: int | None,
    now: str,
) -> tuple[list[dict[str, Any]], list[Transition]]:
    """Return the new condition list and the transitions. ``lastTransitionTime`` moves only
    when the status changes; conditions not in ``updates`` are kept as they are. The list is
    ordered Ready, Progressing, Degraded, then the others in their order."""
    result = [dict(c) for c in conditions or ()]
    transitions: list[Transition] = []
    for update in updates:
        old = find(result, update.type)
        entry = {
            "type": update.type,
            "status": update.status_text,
            "reason": update.reason,
            "message": update.message,
            "observedGeneration": generation,
            "lastTransitionTime": now,
        }
        if old is not None:
            if old.get("status") == entry["status"] and old.get("lastTransitionTime"):
                entry["lastTransitionTime"] = old["lastTransitionTime"]
            if (old.get("status"), old.get("reason")) != (entry["status"], entry["reason"]):
                transitions.append(Transition(update))
            result[result.index(old)] = entry
        else:
            result.append(entry)
            transitions.append(Transition(update))
    result.sort(key=lambda c: _ORDER.index(c["type"]) if c["type"] in _ORDER else len(_ORDER))
    return result, transitions
