"""The operator scenarios of ``tests/test_operator_reconcile.py`` against a real cluster with
the Helm chart installed (``bash e2e/run.sh``). The kind cluster has no GPUs, so engine pods
stay Pending; the tests check what the operator does, not model serving."""

from __future__ import annotations

from functools import partial
from typing import Any

from prefixserving import constants
from prefixserving.api import lifecycle
from prefixserving.api.validation import parse_resource
from prefixserving.controller.handlers.reconcile import CHILD_KINDS
from prefixserving.controller.kube import DEPLOYMENT, KINDS, PREFIX_SERVING, Kube
from prefixserving.render import render_children
from prefixserving_lab.testing import prefixserving_body, wait_for

# A real cluster is slower than the emulator: poll every second, for up to two minutes.
wait_for = partial(wait_for, timeout_s=120.0, interval_s=1.0)

SERVICE = KINDS[("v1", "Service")]
HPA = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
POLICY = KINDS[(constants.API_VERSION, constants.POLICY_KIND)]


def create(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    kind = KINDS[(body["apiVersion"], body["kind"])]
    return kube.request("POST", kind.path(body["metadata"]["namespace"]), body=body)


def children(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    selector = f"{constants.LABEL_INSTANCE}={name},{constants.LABEL_NAME}={constants.PART_OF}"
    return {
        f"{kind.kind}/{obj['metadata']['name']}": obj
        for kind in CHILD_KINDS
        if kube.served(kind.api_version, kind.plural)
        for obj in kube.list(kind, namespace, selector)
    }


def reconciled(kube: Kube, namespace: str, name: str) -> bool:
    body = kube.get(PREFIX_SERVING, namespace, name) or {}
    return (body.get("status") or {}).get("observedGeneration") == body.get("metadata", {}).get(
        "generation"
    )


def condition(kube: Kube, namespace: str, name: str, type_: str) -> dict[str, Any]:
    body = kube.get(PREFIX_SERVING, namespace, name) or {}
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == type_), {}
    )


def test_create_update_drift_delete(kube: Kube, namespace: str) -> None:
    created = create(kube, prefixserving_body("e2e", namespace, replicas=1))
    wait_for(lambda: reconciled(kube, namespace, "e2e"), what="reconcile")
    body = kube.get(PREFIX_SERVING, namespace, "e2e")
    assert body is not None
    expected = {
        f"{c['kind']}/{c['metadata']['name']}"
        for c in render_children(parse_resource({k: v for k, v in body.items() if k != "status"}))
    }
    found = children(kube, namespace, "e2e")
    assert set(found) == expected
    assert all(
        o["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
        for o in found.values()
    )

    kube.merge_patch(PREFIX_SERVING, namespace, "e2e", {"spec": {"replicas": 2}})
    wait_for(
        lambda: (
            (kube.get(DEPLOYMENT, namespace, "e2e-engine") or {}).get("spec", {}).get("replicas")
            == 2
        ),
        what="rollout of replicas: 2",
    )

    kube.delete(SERVICE, namespace, "e2e-router")
    wait_for(lambda: kube.get(SERVICE, namespace, "e2e-router"), what="router Service restored")

    kube.delete(PREFIX_SERVING, namespace, "e2e")
    wait_for(lambda: kube.get(PREFIX_SERVING, namespace, "e2e") is None, what="deletion")
    wait_for(lambda: not children(kube, namespace, "e2e"), what="children removed")


def test_autoscaled_replicas_are_left_alone(kube: Kube, namespace: str) -> None:
    body = prefixserving_body(
        "auto",
        namespace,
        replicas=1,
        autoscaling={"enabled": True, "backend": "hpa", "maxReplicas": 5},
    )
    del body["spec"]["replicas"]
    create(kube, body)
    wait_for(lambda: kube.get(HPA, namespace, "auto-engine"), what="HPA")
    scaler = Kube(kube.api, field_manager="e2e-autoscaler")
    scaler.request(
        "PATCH",
        DEPLOYMENT.path(namespace, "auto-engine", "scale"),
        query=[("fieldManager", "e2e-autoscaler")],
        body={"spec": {"replicas": 3}},
        content_type="application/merge-patch+json",
    )
    kube.merge_patch(
        PREFIX_SERVING, namespace, "auto", {"spec": {"scheduler": {"maxSiblingWaitMs": 90}}}
    )
    wait_for(lambda: reconciled(kube, namespace, "auto"), what="reconcile after update")
    assert (kube.get(DEPLOYMENT, namespace, "auto-engine") or {})["spec"]["replicas"] == 3


def test_invalid_spec_and_policy_propagation(kube: Kube, namespace: str) -> None:
    create(
        kube,
        {
            "apiVersion": constants.API_VERSION,
            "kind": constants.POLICY_KIND,
            "metadata": {"name": "steady", "namespace": namespace},
            "spec": {"backend": "hpa", "minReplicas": 1, "maxReplicas": 3},
        },
    )
    body = prefixserving_body(
        "pol", namespace, autoscaling={"enabled": True, "policyRef": {"name": "steady"}}
    )
    del body["spec"]["replicas"]
    create(kube, body)
    wait_for(
        lambda: (
            (kube.get(HPA, namespace, "pol-engine") or {}).get("spec", {}).get("maxReplicas") == 3
        ),
        what="HPA from the policy",
    )
    kube.merge_patch(POLICY, namespace, "steady", {"spec": {"maxReplicas": 7}})
    wait_for(
        lambda: (
            (kube.get(HPA, namespace, "pol-engine") or {}).get("spec", {}).get("maxReplicas") == 7
        ),
        what="HPA follows the policy",
    )

    # The CRD's schema refuses most bad specs at the API server; a rule without CEL (shm larger
    # than the memory request) reaches the operator and must end in InvalidSpec.
    bad = prefixserving_body(
        "bad",
        namespace,
        placement={"shm": {"sizeLimit": "512Gi"}},
        engine={"resources": {"memory": "8Gi"}},
    )
    create(kube, bad)
    ready = wait_for(
        lambda: (
            (c := condition(kube, namespace, "bad", lifecycle.COND_READY)).get("reason")
            == lifecycle.REASON_INVALID_SPEC
            and c
        ),
        what="InvalidSpec",
    )
    assert ready["status"] == "False"
    assert children(kube, namespace, "bad") == {}
