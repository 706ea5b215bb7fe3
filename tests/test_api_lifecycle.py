"""The conditions: transitions, the documented reasons and the Mark helpers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from prefixserving.api import lifecycle


def test_condition_transitions_keep_time_when_status_holds() -> None:
    first, transitions = lifecycle.apply(
        [],
        [lifecycle.ConditionUpdate(lifecycle.COND_READY, False, "EngineUnavailable", "0/2")],
        1,
        "t1",
    )
    assert [t.warning for t in transitions] == [True]
    second, transitions = lifecycle.apply(
        first,
        [lifecycle.ConditionUpdate(lifecycle.COND_READY, False, "EngineUnavailable", "1/2")],
        1,
        "t2",
    )
    assert transitions == [] and second[0]["lastTransitionTime"] == "t1"
    assert second[0]["message"] == "1/2"
    third, transitions = lifecycle.apply(
        second,
        [
            lifecycle.ConditionUpdate(lifecycle.COND_READY, True, "AllReplicasReady"),
            lifecycle.ConditionUpdate(lifecycle.COND_DEGRADED, False, "Reconciled"),
        ],
        2,
        "t3",
    )
    assert [(t.condition.type, t.warning) for t in transitions] == [
        (lifecycle.COND_READY, False),
        (lifecycle.COND_DEGRADED, False),
    ]
    assert [c["type"] for c in third] == [lifecycle.COND_READY, lifecycle.COND_DEGRADED]
    assert third[0]["lastTransitionTime"] == "t3" and third[0]["observedGeneration"] == 2


def test_every_condition_type_and_reason_is_documented_in_the_module() -> None:
    """The lifecycle docstring is the reference for conditions: each constant appears in it."""
    doc = lifecycle.__doc__ or ""
    names = [n for n in dir(lifecycle) if n.startswith(("COND_", "REASON_"))]
    assert len(names) > 10
    missing = [n for n in names if f"``{getattr(lifecycle, n)}``" not in doc]
    assert missing == [], f"conditions or reasons the docstring does not explain: {missing}"


def test_mark_helpers_set_the_documented_type_status_and_reason() -> None:
    assert lifecycle.mark_ready("ok") == lifecycle.ConditionUpdate(
        lifecycle.COND_READY, True, lifecycle.REASON_READY, "ok"
    )
    halted = lifecycle.mark_halted(lifecycle.REASON_INVALID_SPEC, "fix the spec")
    assert (halted.type, halted.status) == (lifecycle.COND_PROGRESSING, False)
    assert lifecycle.mark_metrics_unknown("set --prometheus-url").status_text == "Unknown"


@pytest.mark.parametrize(
    ("mark", "reason"),
    [
        (lifecycle.mark_not_ready, lifecycle.REASON_SCALER_MISSING),
        (lifecycle.mark_degraded, lifecycle.REASON_ENGINE_UNAVAILABLE),
        (lifecycle.mark_halted, lifecycle.REASON_CHILD_REJECTED),
    ],
)
def test_mark_helpers_refuse_a_reason_the_condition_does_not_document(
    mark: Callable[[str, str], lifecycle.ConditionUpdate], reason: str
) -> None:
    with pytest.raises(ValueError, match="not a documented"):
        mark(reason, "message")
