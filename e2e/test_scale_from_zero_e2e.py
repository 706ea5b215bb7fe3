"""Scale from zero in a real cluster with KEDA (``bash e2e/run.sh`` plus KEDA): a
PrefixServing with ``minReplicas: 0`` gets a ScaledObject at zero replicas that activates on
the routers' held requests, and its router pods are Ready with no engine, so the Service
can take the request that wakes the engines.

The kind cluster has no GPUs: an engine never becomes Ready there, so serving the held
request is measured on the local stack instead (real engine processes, router, Prometheus).
"""

from __future__ import annotations

from functools import partial

import pytest

from prefixserving.autoscaling import promql
from prefixserving.controller.kube import DEPLOYMENT, KINDS, Kube
from prefixserving.kinds import KEDA, SCALED_OBJECT
from prefixserving_lab.testing import prefixserving_body, wait_for

wait_for = partial(wait_for, timeout_s=180.0, interval_s=1.0)


def test_min_replicas_zero_keeps_the_router_ready_and_keda_on_held_requests(
    kube: Kube, namespace: str
) -> None:
    if not kube.served(KEDA.api_version, KEDA.plural):
        pytest.skip("KEDA is not installed: helm install keda kedacore/keda -n keda")
    body = prefixserving_body(
        "zero", namespace, autoscaling={"enabled": True, "backend": "keda", "minReplicas": 0}
    )
    del body["spec"]["replicas"]
    kube.request("POST", KINDS[(body["apiVersion"], body["kind"])].path(namespace), body=body)
    scaled = wait_for(
        lambda: kube.get(SCALED_OBJECT, namespace, "zero-engine"), what="ScaledObject"
    )
    assert scaled["spec"]["minReplicaCount"] == 0
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert triggers["held-requests"]["metadata"]["query"] == promql.held_requests_total(
        namespace, "zero"
    )

    def router_ready_without_engine() -> bool:
        engine = kube.get(DEPLOYMENT, namespace, "zero-engine") or {}
        router = kube.get(DEPLOYMENT, namespace, "zero-router") or {}
        no_engine = not (engine.get("status") or {}).get("readyReplicas")
        return no_engine and bool((router.get("status") or {}).get("readyReplicas"))

    wait_for(router_ready_without_engine, what="a Ready router with no Ready engine")
