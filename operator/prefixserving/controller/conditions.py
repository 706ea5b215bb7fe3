"""Kubernetes-style conditions on ``status.conditions``: set one, read one, and tell which
changes are transitions worth an Event.

Who sets what (and how they roll up):

- ``Ready`` (status timer, and the reconcile for ``InvalidSpec`` and ``RenderFailed``): True
  when at least one engine replica and one router replica serve and the rollout of the current
  generation is complete; False with ``EngineUnavailable``, ``RouterUnavailable``,
  ``InvalidSpec`` or ``RenderFailed``.
- ``Progressing`` (reconcile sets True/``RollingOut`` on a new generation; status timer sets
  False/``RolloutComplete`` once the Deployments report the new pods available).
- ``Degraded`` (reconcile): True with ``InvalidSpec``, ``RenderFailed``, ``ChildRejected``,
  ``ScalerMissing`` or ``PolicyNotFound``; False/``Reconciled`` when every child was applied.
- ``MetricsAvailable`` (metrics timer): only the ``status.metrics`` block depends on it; a
  Prometheus outage never touches the other conditions.

Functions are pure; cost is linear in the number of conditions.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefixserving import constants

# (type, status) pairs that are bad news: their transitions are Warning Events.
_WARNING_STATES = {
    (constants.COND_READY, "False"),
    (constants.COND_DEGRADED, "True"),
    (constants.COND_METRICS, "False"),
}


@dataclass(frozen=True)
class Condition:
    """A condition the operator wants set."""

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

    condition: Condition

    @property
    def warning(self) -> bool:
        return (self.condition.type, self.condition.status_text) in _WARNING_STATES


def now_rfc3339() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def find(conditions: Sequence[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if c.get("type") == type_), None)


def apply(
    conditions: Sequence[Mapping[str, Any]] | None,
    updates: Sequence[Condition],
    generation: int | None,
    now: str,
) -> tuple[list[dict[str, Any]], list[Transition]]:
    """Return the new condition list and the transitions. ``lastTransitionTime`` moves only
    when the status changes; conditions not in ``updates`` are kept as they are."""
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
    order = [constants.COND_READY, constants.COND_PROGRESSING, constants.COND_DEGRADED]
    result.sort(key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))
    return result, transitions
