"""The drift watch covers every child kind of the kind table, the prometheus-operator ones
included: a deleted ServiceMonitor or PrometheusRule comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixserving import kinds
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.kube_emulator import resources
from support.operator_harness import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path, extra_types=resources.PROMETHEUS_OPERATOR)
    running.start_operator()
    yield running
    running.close()


@pytest.mark.parametrize(
    "kind", [kinds.SERVICE_MONITOR, kinds.PROMETHEUS_RULE], ids=lambda k: k.kind
)
def test_deleted_monitoring_child_is_restored(harness: Harness, kind: kinds.Kind) -> None:
    monitoring = {"serviceMonitor": True, "alerts": {"enabled": True}}
    harness.create(resource("mon", "t-mon", monitoring=monitoring))
    found = wait_for(
        lambda: [
            c for ref, c in harness.children("t-mon", "mon").items() if ref.startswith(kind.kind)
        ],
        what=f"the {kind.kind}",
    )
    (child,) = found
    uid = child["metadata"]["uid"]
    harness.kube.delete(kind, "t-mon", child["metadata"]["name"])
    restored = wait_for(
        lambda: (
            (c := harness.get(kind, "t-mon", child["metadata"]["name"]))
            and c["metadata"]["uid"] != uid
            and c
        ),
        what=f"the {kind.kind} restored",
    )
    assert restored["spec"] == child["spec"]
