"""The rolling-update handover on a real cluster: what the emulator cannot show.

- The ReplicaSet controller deletes the old pod the handover claimed (its
  ``controller.kubernetes.io/pod-deletion-cost``) when the old ReplicaSet scales down.
- A new pod takes the routing identity of the pod it claims and writes it on itself (a merge
  patch of its own annotations), and a pod that claims that one inherits the same identity.
- The operator may create the warm-up Role that grants the handover's verbs (the API server
  refuses a Role granting more than its creator holds), and the engine pods' service account
  then holds exactly them.

Stand-in engines (``hashicorp/http-echo``) play the old pods; the claim runs from the test as
the new pod's sidecar runs it (``warmup.handover.claim_replaced``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import kubernetes

from prefixserving import constants
from prefixserving.api import names
from prefixserving.controller.kube import (
    DEPLOYMENT,
    KINDS,
    PREFIX_SERVING,
    Kube,
    load_api_client,
)
from prefixserving.warmup.handover import (
    DELETION_COST,
    DELETION_COST_ANNOTATION,
    IDENTITY_ANNOTATION,
    ThisPod,
    claim_replaced,
    pods_api,
)
from prefixserving_lab.testing import prefixserving_body, wait_for
from stand_ins import ECHO_IMAGE, kubectl

wait_for = partial(wait_for, timeout_s=180.0, interval_s=1.0)
POD = KINDS[("v1", "Pod")]
ROLE = KINDS[("rbac.authorization.k8s.io/v1", "Role")]
LABELS = {"app": "handover-e2e"}
SELECTOR = "app=handover-e2e"


def echo_container(text: str) -> dict[str, Any]:
    return {
        "name": "engine",
        "image": ECHO_IMAGE,
        "args": [f"-listen=:{constants.ENGINE_PORT}", f"-text={text}"],
        "readinessProbe": {"httpGet": {"path": "/health", "port": constants.ENGINE_PORT}},
    }


def echo_pod(namespace: str, name: str, revision: str) -> dict[str, Any]:
    """A bare pod of another revision: no ReplicaSet selects it (theirs include their own
    ``pod-template-hash``), the handover's selector does."""
    labels = {**LABELS, constants.LABEL_POD_TEMPLATE_HASH: revision}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [echo_container(name)]},
    }


def echo_deployment(namespace: str, replicas: int) -> dict[str, Any]:
    container = echo_container("old")
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "old-engines", "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": LABELS},
            "template": {"metadata": {"labels": LABELS}, "spec": {"containers": [container]}},
        },
    }


def ready_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    return [
        p
        for p in kube.list(POD, namespace, SELECTOR)
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    ]


def test_the_replicaset_deletes_the_claimed_pod_first(kube: Kube, namespace: str) -> None:
    kube.apply(echo_deployment(namespace, 3))
    wait_for(lambda: len(ready_pods(kube, namespace)) == 3, "three old pods Ready")
    me = ThisPod("new-engine-0", namespace, "a-new-revision")
    handover = claim_replaced(pods_api(load_api_client()), me, SELECTOR)
    assert handover.replaces is not None
    (victim,) = [
        p
        for p in ready_pods(kube, namespace)
        if handover.replaces == f"http://{p['status']['podIP']}:8000"
    ]
    # No pod is named like ``me``: writing the identity on it fails, logged, never fatal.
    assert handover.identity == victim["metadata"]["name"]
    annotations = victim["metadata"]["annotations"]
    assert annotations[DELETION_COST_ANNOTATION] == DELETION_COST
    # Without the cost the controller would pick by readiness time and then at random.
    kubectl("-n", namespace, "scale", "deployment/old-engines", "--replicas=2")
    wait_for(lambda: len(ready_pods(kube, namespace)) == 2, "one old pod deleted")
    left = {p["metadata"]["name"] for p in ready_pods(kube, namespace)}
    assert victim["metadata"]["name"] not in left


def test_a_chain_of_replacements_keeps_the_first_pods_routing_identity(
    kube: Kube, namespace: str
) -> None:
    kube.apply(echo_deployment(namespace, 1))
    wait_for(lambda: len(ready_pods(kube, namespace)) == 1, "the old pod Ready")
    (first,) = ready_pods(kube, namespace)
    api = pods_api(load_api_client())
    kube.apply(echo_pod(namespace, "second", "revision-2"))
    wait_for(lambda: len(ready_pods(kube, namespace)) == 2, "the second pod Ready")
    assert (
        claim_replaced(api, ThisPod("second", namespace, "revision-2"), SELECTOR).identity
        == (first["metadata"]["name"])
    )
    second = kube.get(POD, namespace, "second")
    assert second is not None
    assert second["metadata"]["annotations"][IDENTITY_ANNOTATION] == first["metadata"]["name"]
    kube.apply(echo_pod(namespace, "third", "revision-3"))
    wait_for(lambda: len(ready_pods(kube, namespace)) == 3, "the third pod Ready")
    third = ThisPod("third", namespace, "revision-3")
    # The old pod is claimed by a live pod ("second"), so "third" claims "second", and inherits
    # the identity "second" inherited.
    handover = claim_replaced(api, third, SELECTOR)
    assert handover.identity == first["metadata"]["name"]
    assert handover.replaces == f"http://{second['status']['podIP']}:{constants.ENGINE_PORT}"


def test_the_engine_service_account_holds_the_handover_verbs(kube: Kube, namespace: str) -> None:
    body = prefixserving_body("hand", namespace, warmup={"enabled": True})
    kube.request("POST", PREFIX_SERVING.path(namespace), body=body)
    wait_for(lambda: kube.get(ROLE, namespace, names.warmup_role("hand")), "warm-up Role")
    engines = names.engine_deployment("hand")
    wait_for(lambda: kube.get(DEPLOYMENT, namespace, engines), "engine Deployment")
    account = f"system:serviceaccount:{namespace}:{names.engine_service_account('hand')}"
    authorization = kubernetes.client.AuthorizationV1Api(load_api_client())
    for verb, allowed in (("list", True), ("patch", True), ("delete", False), ("create", False)):
        review = authorization.create_subject_access_review(
            {
                "spec": {
                    "user": account,
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": verb,
                        "resource": "pods",
                    },
                }
            }
        )
        assert review.status.allowed is allowed, (verb, review.status)
