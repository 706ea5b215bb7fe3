"""Operator configurations: the HPA backend without the custom metrics API (prometheus-adapter)
gives ScalerMissing while the HPA is still created; a namespaced operator touches nothing
outside its namespaces; with a peering name it registers for active-passive HA."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixserving.api import lifecycle
from prefixserving.controller.kube import KINDS
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.kube_emulator import resources
from support.operator_harness import Harness

HPA = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    running = Harness(tmp_path_factory.mktemp("scalers"))  # no custom.metrics.k8s.io served
    running.start_operator()
    yield running
    running.close()


def test_hpa_backend_without_custom_metrics_api_is_scaler_missing(harness: Harness) -> None:
    body = resource("hpa", "t-hpa", autoscaling={"enabled": True, "backend": "hpa"})
    del body["spec"]["replicas"]
    harness.create(body)
    degraded = wait_for(
        lambda: (
            (c := harness.condition("t-hpa", "hpa", lifecycle.COND_DEGRADED))
            and c["reason"] == lifecycle.REASON_SCALER_MISSING
            and c
        ),
        what="ScalerMissing",
    )
    assert degraded["status"] == "True"
    assert "custom.metrics.k8s.io" in degraded["message"]
    assert "prometheusAdapterRules.enabled=true" in degraded["message"]
    assert harness.get(HPA, "t-hpa", "hpa-engine") is not None
    warnings = [e for e in harness.events("t-hpa", "hpa") if e["type"] == "Warning"]
    assert any(e["reason"] == lifecycle.REASON_SCALER_MISSING for e in warnings)


def test_namespaced_operator_leaves_other_namespaces_alone(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    try:
        for namespace in ("watched", "other"):
            body = {"metadata": {"name": namespace}}
            harness.kube.request("POST", "/api/v1/namespaces", body=body)
        harness.start_operator("--namespace", "watched")
        harness.create(resource("in", "watched"))
        harness.create(resource("out", "other"))
        seen_before = len(harness.emulator.call(lambda: list(harness.emulator.server)))
        # A later event in the watched namespace, handled to the end: the operator would have
        # had the event of "out" before it, had it watched "other" (watch streams are ordered).
        harness.create(resource("later", "watched"))
        wait_for(
            lambda: (
                harness.prefixserving("watched", "later")
                .get("status", {})
                .get("observedGeneration")
                == 1
            ),
            what="the later resource reconciled",
        )
        requests = harness.emulator.call(lambda: list(harness.emulator.server))
        # Every request since "out" was created is the operator's (or the test's, in
        # "watched"); kopf's own requests are named by its User-Agent, from the start.
        touched = [
            f"{r.method.value} {r.url.path}"
            for index, r in enumerate(requests)
            if r.namespace == "other"
            and (index >= seen_before or r.headers.get("User-Agent", "").startswith("kopf/"))
        ]
        assert touched == []
        assert harness.children("other", "out") == {}
        assert "status" not in harness.prefixserving("other", "out")
        assert harness.children("watched", "in")
    finally:
        harness.close()


def test_peering_runs_active_passive(tmp_path: Path) -> None:
    """With a peering name the operator registers in the ClusterKopfPeering the chart creates
    and still reconciles (one replica: it is the active one)."""
    harness = Harness(
        tmp_path,
        extra_types=resources.KOPF_PEERING,
        env={"PREFIXSERVING_PEERING": "prefixserving-operator"},
    )
    peering = KINDS[("kopf.dev/v1", "ClusterKopfPeering")]
    try:
        harness.kube.request(
            "POST", peering.path(None), body={"metadata": {"name": "prefixserving-operator"}}
        )
        harness.start_operator()
        harness.create(resource("peered", "t-peer"))
        wait_for(lambda: harness.children("t-peer", "peered"), what="children with peering on")
        obj = wait_for(
            lambda: (
                (o := harness.kube.get(peering, None, "prefixserving-operator"))
                and o.get("status")
                and o
            ),
            what="the operator's entry in the peering object",
        )
        assert len(obj["status"]) == 1  # this operator, alive
    finally:
        harness.close()
