"""The operator, in-process (kopf's KopfRunner), against the Kubernetes API emulator:
create, update, removal of unneeded children, drift repair, fields other controllers own,
ScalingPolicy propagation, bad input, refused children, readiness (deletion:
test_operator_deletion.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jinja2
import pytest

from prefixserving import constants
from prefixserving.api import lifecycle
from prefixserving.api.validation import parse_resource
from prefixserving.controller.handlers import reconcile as reconcile_module
from prefixserving.controller.kube import DEPLOYMENT, KINDS, POD
from prefixserving.render import render_children
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.kube_emulator import resources
from support.operator_harness import Harness

SCALING_POLICY = KINDS[(constants.API_VERSION, constants.POLICY_KIND)]
CONFIGMAP = KINDS[("v1", "ConfigMap")]
HPA = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
SERVICE = KINDS[("v1", "Service")]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    # The custom metrics API is served (prometheus-adapter), KEDA is not.
    running = Harness(tmp_path_factory.mktemp("operator"), extra_types=resources.CUSTOM_METRICS)
    running.start_operator()
    yield running
    running.close()


def expected_children(h: Harness, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    body = h.prefixserving(namespace, name)
    rendered = render_children(parse_resource({k: v for k, v in body.items() if k != "status"}))
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in rendered}


def reconciled(h: Harness, namespace: str, name: str) -> bool:
    body = h.prefixserving(namespace, name)
    status = body.get("status") or {}
    return status.get("observedGeneration") == body["metadata"]["generation"]


def engine(h: Harness, namespace: str, name: str) -> dict[str, Any]:
    obj = h.get(DEPLOYMENT, namespace, f"{name}-engine")
    assert obj is not None
    return obj


def engine_args(h: Harness, namespace: str, name: str) -> list[str]:
    containers = engine(h, namespace, name)["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "engine")["args"]


def test_create_makes_every_child_with_owner_references(harness: Harness) -> None:
    created = harness.create(resource("create", "t-create"))
    uid = created["metadata"]["uid"]
    wait_for(lambda: reconciled(harness, "t-create", "create"), what="observedGeneration")
    expected = expected_children(harness, "t-create", "create")
    actual = harness.children("t-create", "create")
    assert set(actual) == set(expected) and len(expected) >= 6
    for ref, obj in actual.items():
        owners = obj["metadata"]["ownerReferences"]
        assert owners == [
            {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
                "name": "create",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ], ref
        managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
        assert managers == {constants.FIELD_MANAGER}, ref
        assert obj["spec"] == expected[ref]["spec"], ref
    status = harness.prefixserving("t-create", "create")["status"]
    assert status["routerEndpoint"] == "http://create-router.t-create.svc.cluster.local:8080"
    degraded = harness.condition("t-create", "create", lifecycle.COND_DEGRADED)
    assert degraded is not None and degraded["status"] == "False"


def test_update_rolls_out_and_removes_what_is_no_longer_needed(harness: Harness) -> None:
    harness.create(resource("roll", "t-roll"))
    wait_for(lambda: reconciled(harness, "t-roll", "roll"), what="first reconcile")
    assert engine(harness, "t-roll", "roll")["spec"]["replicas"] == 2
    assert not any(k.startswith("ConfigMap/") for k in harness.children("t-roll", "roll"))

    harness.patch_spec(
        "t-roll",
        "roll",
        {
            "replicas": 3,
            "scheduler": {"policy": "fcfs"},
            "warmup": {"enabled": True, "prompts": [{"prompt": "You are a helpful assistant."}]},
        },
    )
    wait_for(lambda: reconciled(harness, "t-roll", "roll"), what="second reconcile")
    assert engine(harness, "t-roll", "roll")["spec"]["replicas"] == 3
    assert constants.PEEK_SCHEDULER_CLS not in " ".join(engine_args(harness, "t-roll", "roll"))
    assert set(harness.children("t-roll", "roll")) == set(
        expected_children(harness, "t-roll", "roll")
    )
    assert "ConfigMap/roll-warmup" in harness.children("t-roll", "roll")
    assert engine(harness, "t-roll", "roll")["metadata"]["generation"] == 2

    harness.patch_spec("t-roll", "roll", {"warmup": {"enabled": False, "prompts": []}})
    wait_for(lambda: reconciled(harness, "t-roll", "roll"), what="third reconcile")
    wait_for(
        lambda: "ConfigMap/roll-warmup" not in harness.children("t-roll", "roll"),
        what="warm-up ConfigMap removed",
    )
    assert set(harness.children("t-roll", "roll")) == set(
        expected_children(harness, "t-roll", "roll")
    )


def test_deleted_and_edited_children_are_restored(harness: Harness) -> None:
    harness.create(resource("drift", "t-drift"))
    wait_for(lambda: reconciled(harness, "t-drift", "drift"), what="reconcile")
    original = engine(harness, "t-drift", "drift")

    harness.kube.delete(SERVICE, "t-drift", "drift-router")
    wait_for(
        lambda: harness.get(SERVICE, "t-drift", "drift-router"), what="router Service restored"
    )

    editor = harness.kube.__class__(harness.kube.api, field_manager="kubectl-edit")
    containers = original["spec"]["template"]["spec"]["containers"]
    edited = [
        dict(c, image="attacker/image:latest") if c["name"] == "engine" else c for c in containers
    ]
    editor.merge_patch(
        DEPLOYMENT,
        "t-drift",
        "drift-engine",
        {"spec": {"template": {"spec": {"containers": edited}}}},
    )

    def image_restored() -> bool:
        spec = engine(harness, "t-drift", "drift")["spec"]["template"]["spec"]
        return spec["containers"] == containers

    wait_for(image_restored, what="engine image restored")
    reasons = {e["reason"] for e in harness.events("t-drift", "drift")}
    assert "DriftRepaired" in reasons


def test_fields_owned_by_autoscaler_and_gitops_are_left_alone(harness: Harness) -> None:
    auto = {"enabled": True, "backend": "hpa", "minReplicas": 1, "maxReplicas": 5}
    body = resource("auto", "t-auto", autoscaling=auto)
    del body["spec"]["replicas"]
    harness.create(body)
    wait_for(lambda: reconciled(harness, "t-auto", "auto"), what="reconcile")
    assert harness.get(HPA, "t-auto", "auto-engine") is not None

    # The HPA scales the Deployment through /scale; Argo CD and Flux annotate a child.
    scaler = harness.kube.__class__(harness.kube.api, field_manager="horizontal-pod-autoscaler")
    scaler.request(
        "PATCH",
        DEPLOYMENT.path("t-auto", "auto-engine", "scale"),
        query=[("fieldManager", "horizontal-pod-autoscaler")],
        body={"spec": {"replicas": 4}},
        content_type="application/merge-patch+json",
    )
    gitops = {
        "argocd.argoproj.io/tracking-id": "llm:apps/Deployment:t-auto/auto-engine",
        "kustomize.toolkit.fluxcd.io/reconcile": "disabled",
    }
    harness.kube.__class__(harness.kube.api, field_manager="argocd-controller").merge_patch(
        DEPLOYMENT, "t-auto", "auto-engine", {"metadata": {"annotations": gitops}}
    )
    harness.kube.__class__(harness.kube.api, field_manager="hpa-controller").merge_patch(
        HPA,
        "t-auto",
        "auto-engine",
        {"status": {"currentReplicas": 4, "desiredReplicas": 4}},
        "status",
    )

    # A spec change makes the operator re-apply every child.
    harness.patch_spec("t-auto", "auto", {"scheduler": {"maxSiblingWaitMs": 80}})
    wait_for(lambda: reconciled(harness, "t-auto", "auto"), what="reconcile after update")
    wait_for(
        lambda: (
            "80" in " ".join(engine_args(harness, "t-auto", "auto"))
            or any(
                e.get("value") == "80"
                for c in engine(harness, "t-auto", "auto")["spec"]["template"]["spec"]["containers"]
                for e in c.get("env") or []
            )
        ),
        what="new sibling wait rolled out",
    )
    deployment = engine(harness, "t-auto", "auto")
    assert deployment["spec"]["replicas"] == 4
    assert gitops.items() <= deployment["metadata"]["annotations"].items()
    hpa = harness.get(HPA, "t-auto", "auto-engine")
    assert hpa is not None and hpa["status"] == {"currentReplicas": 4, "desiredReplicas": 4}


def test_scaling_policy_change_propagates(harness: Harness) -> None:
    policy = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.POLICY_KIND,
        "metadata": {"name": "steady", "namespace": "t-policy"},
        "spec": {"backend": "hpa", "minReplicas": 1, "maxReplicas": 3},
    }
    harness.create(policy)
    for name in ("p1", "p2"):
        body = resource(
            name, "t-policy", autoscaling={"enabled": True, "policyRef": {"name": "steady"}}
        )
        del body["spec"]["replicas"]
        harness.create(body)
    harness.create(resource("unrelated", "t-policy"))
    for name in ("p1", "p2", "unrelated"):
        wait_for(lambda name=name: reconciled(harness, "t-policy", name), what=f"{name} reconciled")
    for name in ("p1", "p2"):
        hpa = harness.get(HPA, "t-policy", f"{name}-engine")
        assert hpa is not None and hpa["spec"]["maxReplicas"] == 3

    harness.kube.merge_patch(SCALING_POLICY, "t-policy", "steady", {"spec": {"maxReplicas": 9}})
    for name in ("p1", "p2"):
        wait_for(
            lambda name=name: (
                (harness.get(HPA, "t-policy", f"{name}-engine") or {})
                .get("spec", {})
                .get("maxReplicas")
                == 9
            ),
            what=f"{name} HPA follows the policy",
        )
    assert harness.get(HPA, "t-policy", "unrelated-engine") is None


def test_invalid_spec_creates_nothing_and_leaves_others_alone(harness: Harness) -> None:
    harness.create(resource("good", "t-invalid"))
    bad = resource("bad", "t-invalid", engine={"tensorParallelSize": 0, "blockSize": 17})
    harness.create(bad)
    wait_for(lambda: reconciled(harness, "t-invalid", "good"), what="good reconciled")
    ready = wait_for(
        lambda: (
            (c := harness.condition("t-invalid", "bad", lifecycle.COND_READY))
            and c["reason"] == lifecycle.REASON_INVALID_SPEC
            and c
        ),
        what="InvalidSpec",
    )
    assert ready["status"] == "False"
    assert (
        "engine.tensorParallelSize" in ready["message"] and "engine.blockSize" in ready["message"]
    )
    assert harness.children("t-invalid", "bad") == {}
    assert set(harness.children("t-invalid", "good")) == set(
        expected_children(harness, "t-invalid", "good")
    )
    assert any(
        e["reason"] == lifecycle.REASON_INVALID_SPEC for e in harness.events("t-invalid", "bad")
    )

    # Fixing the spec creates the children.
    harness.patch_spec("t-invalid", "bad", {"engine": {"tensorParallelSize": 1, "blockSize": 16}})
    wait_for(lambda: len(harness.children("t-invalid", "bad")) >= 6, what="children after fix")


def test_a_renderer_crash_stays_on_its_resource(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body that breaks the renderer in a way validation cannot foresee (here: a template
    error for one resource) is reported on that resource; the others still reconcile."""
    real_render = reconcile_module.render_children

    def render(resource: Any, policy: Any = None) -> list[dict[str, Any]]:
        if resource.metadata.name == "crash":
            raise jinja2.UndefinedError("'engine' is undefined")  # what a broken template raises
        return real_render(resource, policy)

    monkeypatch.setattr(reconcile_module, "render_children", render)
    harness.create(resource("crash", "t-crash"))
    harness.create(resource("fine", "t-crash"))
    wait_for(lambda: reconciled(harness, "t-crash", "fine"), what="fine reconciled")
    degraded = wait_for(
        lambda: (
            (c := harness.condition("t-crash", "crash", lifecycle.COND_DEGRADED))
            and c["reason"] == lifecycle.REASON_RENDER_FAILED
            and c
        ),
        what="RenderFailed",
    )
    assert degraded["status"] == "True"
    assert "UndefinedError: 'engine' is undefined" in degraded["message"]
    ready = harness.condition("t-crash", "crash", lifecycle.COND_READY)
    assert ready is not None and ready["status"] == "False"
    assert harness.children("t-crash", "crash") == {}
    assert set(harness.children("t-crash", "fine")) == set(
        expected_children(harness, "t-crash", "fine")
    )
    # The operator is still serving: once the renderer works, the next change goes through.
    monkeypatch.setattr(reconcile_module, "render_children", real_render)
    harness.patch_spec("t-crash", "crash", {"replicas": 1})
    wait_for(lambda: reconciled(harness, "t-crash", "crash"), what="crash reconciled after fix")
    assert set(harness.children("t-crash", "crash")) == set(
        expected_children(harness, "t-crash", "crash")
    )


def test_keda_missing_reports_scaler_missing_until_installed(harness: Harness) -> None:
    body = resource("keda", "t-keda", autoscaling={"enabled": True, "backend": "keda"})
    del body["spec"]["replicas"]
    harness.create(body)
    degraded = wait_for(
        lambda: (
            (c := harness.condition("t-keda", "keda", lifecycle.COND_DEGRADED))
            and c["reason"] == lifecycle.REASON_SCALER_MISSING
            and c
        ),
        what="ScalerMissing",
    )
    assert degraded["status"] == "True" and "KEDA is not installed" in degraded["message"]
    assert "Deployment/keda-engine" in harness.children("t-keda", "keda")

    harness.emulator.install(resources.KEDA[0])
    harness.patch_spec("t-keda", "keda", {"autoscaling": {"maxReplicas": 6}})
    scaled = KINDS[("keda.sh/v1alpha1", "ScaledObject")]
    wait_for(lambda: harness.get(scaled, "t-keda", "keda-engine"), what="ScaledObject created")
    wait_for(
        lambda: (
            (harness.condition("t-keda", "keda", lifecycle.COND_DEGRADED) or {}).get("status")
            == "False"
        ),
        what="Degraded cleared",
    )


def test_a_missing_inference_pool_crd_is_degraded_until_installed(harness: Harness) -> None:
    """router.mode endpointPicker without the InferencePool CRD: the picker runs, the pool is
    skipped and Degraded says why; once the CRD is served the next reconcile creates it."""
    harness.create(resource("gw", "t-gw", router={"mode": "endpointPicker"}))
    degraded = wait_for(
        lambda: (
            (c := harness.condition("t-gw", "gw", lifecycle.COND_DEGRADED))
            and c["reason"] == lifecycle.REASON_INFERENCE_POOL_MISSING
            and c
        ),
        what="InferencePoolMissing",
    )
    assert degraded["status"] == "True"
    assert "InferencePool/gw" in degraded["message"] and "router.mode: proxy" in degraded["message"]
    children = harness.children("t-gw", "gw")
    assert "Deployment/gw-router" in children and "InferencePool/gw" not in children
    router_args = children["Deployment/gw-router"]["spec"]["template"]["spec"]["containers"][0]
    assert "endpoint-picker" in router_args["args"]
    assert (harness.prefixserving("t-gw", "gw").get("status") or {}).get("routerEndpoint") is None

    harness.emulator.install(resources.INFERENCE_EXTENSION[0])
    harness.patch_spec("t-gw", "gw", {"replicas": 3})
    pool_kind = KINDS[("inference.networking.k8s.io/v1", "InferencePool")]
    pool = wait_for(lambda: harness.get(pool_kind, "t-gw", "gw"), what="InferencePool created")
    assert pool["spec"]["endpointPickerRef"]["name"] == "gw-router"
    wait_for(
        lambda: (
            (harness.condition("t-gw", "gw", lifecycle.COND_DEGRADED) or {}).get("status")
            == "False"
        ),
        what="Degraded cleared",
    )
    harness.patch_spec("t-gw", "gw", {"router": {"mode": "proxy"}})
    wait_for(lambda: harness.get(pool_kind, "t-gw", "gw") is None, what="pool pruned")
    wait_for(
        lambda: (harness.prefixserving("t-gw", "gw").get("status") or {}).get("routerEndpoint"),
        what="routerEndpoint back in proxy mode",
    )


def test_refused_child_degrades_naming_the_object_and_message(harness: Harness) -> None:
    message = 'services "refuse-router" is forbidden: exceeded quota: services=10'

    def quota(op: str, rtype: Any, obj: Any) -> tuple[int, str] | None:
        meta = obj["metadata"]
        if (
            rtype.plural == "services"
            and meta.get("namespace") == "t-refuse"
            and meta["name"] == "refuse-router"
        ):
            return 403, message
        return None

    harness.emulator.call(harness.emulator.server.store.admission.append, quota)
    try:
        harness.create(resource("refuse", "t-refuse"))
        degraded = wait_for(
            lambda: (
                (c := harness.condition("t-refuse", "refuse", lifecycle.COND_DEGRADED))
                and c["reason"] == lifecycle.REASON_CHILD_REJECTED
                and c
            ),
            what="ChildRejected",
        )
        assert degraded["status"] == "True"
        assert "Service/refuse-router" in degraded["message"] and message in degraded["message"]
        assert "Deployment/refuse-engine" in harness.children("t-refuse", "refuse")
    finally:
        harness.emulator.call(harness.emulator.server.store.admission.remove, quota)


def test_ready_follows_the_children(harness: Harness) -> None:
    harness.create(
        resource("ready", "t-ready", warmup={"enabled": True, "prompts": [{"prompt": "hi"}]})
    )
    wait_for(lambda: reconciled(harness, "t-ready", "ready"), what="reconcile")
    ready = wait_for(
        lambda: harness.condition("t-ready", "ready", lifecycle.COND_READY), what="Ready"
    )
    assert ready["status"] == "False" and ready["reason"] == lifecycle.REASON_ENGINE_UNAVAILABLE

    # Emulate the Deployment controller and the kubelet: two engine pods, one warmed up.
    labels = {
        "app.kubernetes.io/name": "prefixserving",
        "app.kubernetes.io/instance": "ready",
        "app.kubernetes.io/component": "engine",
    }
    for index, warm in enumerate((True, False)):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"ready-engine-abc-{index}",
                "namespace": "t-ready",
                "labels": labels,
            },
        }
        harness.create(pod)
        status = {
            "status": {
                "conditions": [{"type": "Ready", "status": str(warm)}],
                "containerStatuses": [
                    {"name": "engine", "ready": True},
                    {"name": "warmup", "ready": warm},
                ],
            }
        }
        harness.kube.merge_patch(POD, "t-ready", pod["metadata"]["name"], status, "status")
    for name, ready_count in (("ready-engine", 1), ("ready-router", 2)):
        generation = harness.get(DEPLOYMENT, "t-ready", name)["metadata"]["generation"]
        harness.kube.merge_patch(
            DEPLOYMENT,
            "t-ready",
            name,
            {
                "status": {
                    "observedGeneration": generation,
                    "replicas": 2,
                    "updatedReplicas": 2,
                    "readyReplicas": ready_count,
                    "availableReplicas": ready_count,
                }
            },
            "status",
        )
    wait_for(
        lambda: (
            (harness.condition("t-ready", "ready", lifecycle.COND_READY) or {}).get("status")
            == "True"
        ),
        what="Ready=True",
    )
    status = harness.prefixserving("t-ready", "ready")["status"]
    assert (status["replicas"], status["readyReplicas"], status["warmReplicas"]) == (2, 2, 1)
    progressing = harness.condition("t-ready", "ready", lifecycle.COND_PROGRESSING)
    assert progressing is not None and progressing["status"] == "False"


def test_missing_policy_is_reported_until_it_is_created(harness: Harness) -> None:
    auto = {"enabled": True, "backend": "hpa", "policyRef": {"name": "later"}}
    body = resource("late", "t-late", autoscaling=auto)
    del body["spec"]["replicas"]
    harness.create(body)
    degraded = wait_for(
        lambda: (
            (c := harness.condition("t-late", "late", lifecycle.COND_DEGRADED))
            and c["reason"] == "PolicyNotFound"
            and c
        ),
        what="PolicyNotFound",
    )
    assert degraded["status"] == "True" and "t-late/later" in degraded["message"]

    policy = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.POLICY_KIND,
        "metadata": {"name": "later", "namespace": "t-late"},
        "spec": {"backend": "hpa", "minReplicas": 2, "maxReplicas": 7},
    }
    harness.create(policy)
    wait_for(
        lambda: (
            (harness.get(HPA, "t-late", "late-engine") or {}).get("spec", {}).get("maxReplicas")
            == 7
        ),
        what="HPA from the policy created later",
    )
    wait_for(
        lambda: (
            (harness.condition("t-late", "late", lifecycle.COND_DEGRADED) or {}).get("status")
            == "False"
        ),
        what="Degraded cleared",
    )
