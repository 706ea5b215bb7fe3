"""Conditions of a PrefixServing and how they roll up into ``Ready``.

Part conditions (who sets them, when present):
- ``EngineReady``: the operator's status timer, always. True when the engine Deployment has
  all its desired replicas Ready (after warm-up when warm-up is on).
- ``RouterReady``: the status timer, always. True when the router Deployment has a Ready pod.
- ``ScalerReady``: the reconcile handler, only while autoscaling is enabled. False with
  reason ``ScalerMissing`` when the backend's API (KEDA or the HPA metrics) is not installed.
  Unset (removed) when autoscaling is off, so it never blocks Ready.
- ``MetricsAvailable``: the metrics timer; informational, never part of Ready.

Roll-up: ``Ready`` is True when every present part condition of ``READY_PARTS`` is True; it
is False with the first failing part's reason otherwise, and Unknown while a part is missing.
``Progressing`` and ``Degraded`` are set by the operator next to it.

All helpers are pure: they take a list of conditions and return a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from prefixserving import constants
from prefixserving.api.types import Condition

COND_ENGINE_READY = "EngineReady"
COND_ROUTER_READY = "RouterReady"
COND_SCALER_READY = "ScalerReady"

# Part conditions that must be True for Ready; ScalerReady only counts while present.
READY_PARTS: tuple[str, ...] = (COND_ENGINE_READY, COND_ROUTER_READY, COND_SCALER_READY)
REQUIRED_PARTS: tuple[str, ...] = (COND_ENGINE_READY, COND_ROUTER_READY)

Status = Literal["True", "False", "Unknown"]


def get(conditions: Sequence[Condition], type_: str) -> Condition | None:
    """The condition of ``type_``, or None."""
    return next((c for c in conditions if c.type == type_), None)


def is_true(conditions: Sequence[Condition], type_: str) -> bool:
    """Whether the condition ``type_`` is present and True."""
    found = get(conditions, type_)
    return found is not None and found.status == "True"


def set_condition(
    conditions: Sequence[Condition],
    type_: str,
    status: Status,
    reason: str,
    message: str,
    now: str,
    generation: int | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; ``lastTransitionTime`` moves only on change."""
    old = get(conditions, type_)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )
    if old is None:
        return [*conditions, new]
    return [new if c.type == type_ else c for c in conditions]


def mark_true(
    conditions: Sequence[Condition], type_: str, reason: str, message: str, now: str, **kw: int
) -> list[Condition]:
    """Set ``type_`` True."""
    return set_condition(conditions, type_, "True", reason, message, now, kw.get("generation"))


def mark_false(
    conditions: Sequence[Condition], type_: str, reason: str, message: str, now: str, **kw: int
) -> list[Condition]:
    """Set ``type_`` False."""
    return set_condition(conditions, type_, "False", reason, message, now, kw.get("generation"))


def unset(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    """Remove ``type_`` (an optional part that no longer applies, e.g. ScalerReady)."""
    return [c for c in conditions if c.type != type_]


def roll_up_ready(
    conditions: Sequence[Condition], now: str, generation: int | None = None
) -> list[Condition]:
    """Return ``conditions`` with ``Ready`` derived from the part conditions (see module doc)."""
    missing = [p for p in REQUIRED_PARTS if get(conditions, p) is None]
    failing = [
        c for p in READY_PARTS if (c := get(conditions, p)) is not None and c.status != "True"
    ]
    if failing:
        first = failing[0]
        return set_condition(
            conditions,
            constants.COND_READY,
            "False",
            first.reason or first.type,
            first.message,
            now,
            generation,
        )
    if missing:
        return set_condition(
            conditions,
            constants.COND_READY,
            "Unknown",
            "Pending",
            f"waiting for {', '.join(missing)}",
            now,
            generation,
        )
    return set_condition(
        conditions,
        constants.COND_READY,
        "True",
        constants.REASON_READY,
        "engines and router are ready",
        now,
        generation,
    )
