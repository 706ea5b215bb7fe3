"""``status.readyReplicas`` and ``status.warmReplicas`` from the engine pods (pure function)."""

from __future__ import annotations

from typing import Any

from prefixserving.controller.handlers.status import pod_counts


def pod(engine_ready: bool, warm: bool, deleting: bool = False) -> dict[str, Any]:
    """An engine pod as the API server reports it with warm-up on: the engine container, the
    warm-up sidecar, and pod Ready only when both are ready."""
    metadata: dict[str, Any] = {"name": "p"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    ready = engine_ready and warm
    return {
        "metadata": metadata,
        "status": {
            "conditions": [{"type": "Ready", "status": str(ready)}],
            "containerStatuses": [
                {"name": "engine", "ready": engine_ready},
                {"name": "warmup", "ready": warm},
            ],
        },
    }


def test_a_loaded_engine_still_warming_is_ready_but_not_warm() -> None:
    assert pod_counts([pod(True, False)]) == (1, 0)
    assert pod_counts([pod(True, True), pod(True, False), pod(False, False)]) == (2, 1)


def test_a_pending_pod_counts_in_neither() -> None:
    assert pod_counts([{"metadata": {"name": "p"}, "status": {"phase": "Pending"}}]) == (0, 0)
    assert pod_counts([{"metadata": {"name": "p"}}]) == (0, 0)


def test_a_pod_being_deleted_is_not_capacity() -> None:
    assert pod_counts([pod(True, True, deleting=True), pod(True, True)]) == (1, 1)


def test_no_pods_is_zero() -> None:
    assert pod_counts([]) == (0, 0)
