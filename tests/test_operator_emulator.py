"""The Kubernetes API emulator the operator tests run against: the fixes over plain kmock and
the API semantics the operator relies on, checked through the official client over HTTP."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prefixserving.controller.kube import DEPLOYMENT, KINDS, Kube, KubeError, load_api_client
from prefixserving_lab.testing import wait_for
from support.kube_emulator import EmulatorThread, resources

CONFIGMAP = KINDS[("v1", "ConfigMap")]


@pytest.fixture(scope="module")
def kube(kubeconfig: Path) -> Iterator[Kube]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(kubeconfig))
        yield Kube(load_api_client(), field_manager="operator")


def deployment(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name, "tier": "web"}},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "img:1"}]}}, **spec},
    }


def test_discovery_advertises_core_v1_and_groups(kube: Kube) -> None:
    core = kube.request("GET", "/api/v1/")
    assert {"pods", "services", "configmaps", "events"} <= {r["name"] for r in core["resources"]}
    groups = {g["name"] for g in kube.request("GET", "/apis")["groups"]}
    assert {"apps", "policy", "autoscaling", "prefixserving.io"} <= groups
    assert "keda.sh" not in groups
    assert kube.served("apps/v1", "deployments")
    assert not kube.served("keda.sh/v1alpha1", "scaledobjects")


def test_objects_get_resource_versions_uid_and_generation(kube: Kube) -> None:
    created = kube.apply(deployment("rv", "emu"))
    meta = created["metadata"]
    assert meta["uid"] and meta["generation"] == 1 and int(meta["resourceVersion"]) > 0
    again = kube.apply(deployment("rv", "emu"))
    assert again["metadata"]["resourceVersion"] == meta["resourceVersion"], "no-op apply bumped"
    changed = kube.apply(deployment("rv", "emu", minReadySeconds=5))
    assert int(changed["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert changed["metadata"]["generation"] == 2
    status_only = kube.merge_patch(DEPLOYMENT, "emu", "rv", {"status": {"replicas": 3}}, "status")
    assert status_only["metadata"]["generation"] == 2 and status_only["status"]["replicas"] == 3
    listing = kube.request("GET", DEPLOYMENT.path("emu"))
    assert int(listing["metadata"]["resourceVersion"]) >= int(
        status_only["metadata"]["resourceVersion"]
    )


def test_server_side_apply_keeps_fields_of_other_managers(kube: Kube) -> None:
    kube.apply(deployment("ssa", "emu", replicas=2))
    # An autoscaler takes replicas, a GitOps tool adds an annotation.
    hpa = Kube(kube.api, field_manager="horizontal-pod-autoscaler")
    hpa.request(
        "PATCH",
        DEPLOYMENT.path("emu", "ssa", "scale"),
        query=[("fieldManager", "horizontal-pod-autoscaler")],
        body={"spec": {"replicas": 7}},
        content_type="application/merge-patch+json",
    )
    argo = Kube(kube.api, field_manager="argocd-controller")
    argo.merge_patch(
        DEPLOYMENT, "emu", "ssa", {"metadata": {"annotations": {"argocd.argoproj.io/x": "y"}}}
    )
    # The operator re-applies without replicas (autoscaling on): neither field is touched.
    result = kube.apply(deployment("ssa", "emu"))
    assert result["spec"]["replicas"] == 7
    assert result["metadata"]["annotations"] == {"argocd.argoproj.io/x": "y"}
    managers = {m["manager"] for m in result["metadata"]["managedFields"]}
    assert {"operator", "horizontal-pod-autoscaler", "argocd-controller"} <= managers


def test_apply_removes_fields_the_applier_stopped_sending(kube: Kube) -> None:
    kube.apply(deployment("prune", "emu", minReadySeconds=9))
    result = kube.apply(deployment("prune", "emu"))
    assert "minReadySeconds" not in result["spec"]


def test_forced_apply_takes_back_fields_edited_by_hand(kube: Kube) -> None:
    kube.apply(deployment("edit", "emu"))
    editor = Kube(kube.api, field_manager="kubectl-edit")
    edited = editor.request(
        "PATCH",
        DEPLOYMENT.path("emu", "edit"),
        body={"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "evil"}]}}}},
        content_type="application/strategic-merge-patch+json",
    )
    assert edited["spec"]["template"]["spec"]["containers"][0]["image"] == "evil"
    restored = kube.apply(deployment("edit", "emu"))
    assert restored["spec"]["template"]["spec"]["containers"][0]["image"] == "img:1"


def test_json_patch_failed_test_is_422(kube: Kube) -> None:
    kube.apply(deployment("jp", "emu"))
    with pytest.raises(KubeError) as error:
        kube.request(
            "PATCH",
            DEPLOYMENT.path("emu", "jp"),
            body=[{"op": "test", "path": "/metadata/resourceVersion", "value": "0"}],
            content_type="application/json-patch+json",
        )
    assert error.value.status == 422


def test_merge_patch_with_stale_resource_version_conflicts(kube: Kube) -> None:
    # The version read before a later write (not a fixed "1": the emulator's first object,
    # when this test runs first, has that version and it is current).
    stale = kube.apply(deployment("stale", "emu"))["metadata"]["resourceVersion"]
    kube.apply(deployment("stale", "emu", minReadySeconds=5))
    with pytest.raises(KubeError) as error:
        kube.merge_patch(
            DEPLOYMENT,
            "emu",
            "stale",
            {"metadata": {"resourceVersion": stale}, "spec": {"paused": True}},
        )
    assert error.value.status == 409


def test_label_and_field_selectors(kube: Kube) -> None:
    for name, tier in (("sel-a", "web"), ("sel-b", "db")):
        body = deployment(name, "sel")
        body["metadata"]["labels"]["tier"] = tier
        kube.apply(body)

    def names(selector: str) -> set[str]:
        return {o["metadata"]["name"] for o in kube.list(DEPLOYMENT, "sel", selector)}

    assert names("tier=web") == {"sel-a"}
    assert names("tier!=web") == {"sel-b"}
    assert names("tier in (web,db),app") == {"sel-a", "sel-b"}
    assert names("tier notin (web)") == {"sel-b"}
    assert names("!missing") == {"sel-a", "sel-b"}
    by_field = kube.request(
        "GET", DEPLOYMENT.path("sel"), query=[("fieldSelector", "metadata.name=sel-b")]
    )
    assert [o["metadata"]["name"] for o in by_field["items"]] == ["sel-b"]


def test_finalizers_then_garbage_collection_of_dependents(kube: Kube) -> None:
    owner = kube.request(
        "POST",
        CONFIGMAP.path("gc"),
        body={"metadata": {"name": "owner", "finalizers": ["x/y"]}, "data": {}},
    )
    child = deployment("child", "gc")
    child["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    ]
    kube.apply(child)
    kube.delete(CONFIGMAP, "gc", "owner")
    marked = kube.get(CONFIGMAP, "gc", "owner")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    assert kube.get(DEPLOYMENT, "gc", "child") is not None
    kube.merge_patch(CONFIGMAP, "gc", "owner", {"metadata": {"finalizers": None}})
    assert kube.get(CONFIGMAP, "gc", "owner") is None
    assert kube.get(DEPLOYMENT, "gc", "child") is None


def test_a_write_whose_owners_are_gone_is_collected(kube: Kube) -> None:
    """A controller's apply that lands after its owner was deleted leaves nothing behind (the
    case of an operator's in-flight reconcile racing a deletion); one live owner keeps it."""
    owner = kube.request("POST", CONFIGMAP.path("orphan"), body={"metadata": {"name": "owner"}})
    uid = owner["metadata"]["uid"]
    live = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
    gone = {**live, "name": "gone", "uid": "uid-of-a-deleted-owner"}

    late = deployment("late", "orphan")
    late["metadata"]["ownerReferences"] = [gone]
    assert kube.apply(late)["metadata"]["name"] == "late"
    assert kube.get(DEPLOYMENT, "orphan", "late") is None

    kept = deployment("kept", "orphan")
    kept["metadata"]["ownerReferences"] = [gone, live]
    kube.apply(kept)
    assert kube.get(DEPLOYMENT, "orphan", "kept") is not None

    kept["metadata"]["ownerReferences"] = [gone]
    kube.apply(kept)
    assert kube.get(DEPLOYMENT, "orphan", "kept") is None


def test_watch_resumes_from_a_resource_version(kube: Kube, emulator: EmulatorThread) -> None:
    first = kube.apply(deployment("w1", "watch"))
    kube.apply(deployment("w2", "watch"))
    kube.delete(DEPLOYMENT, "watch", "w1")
    since = first["metadata"]["resourceVersion"]
    response = kube.api.rest_client.pool_manager.request(
        "GET",
        f"{emulator.url}{DEPLOYMENT.path('watch')}?watch=true&resourceVersion={since}&timeoutSeconds=1",
        preload_content=True,
    )
    events = [json.loads(line) for line in response.data.splitlines() if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "w2"),
        ("DELETED", "w1"),
    ]


def test_admission_rule_refuses_with_its_message(kube: Kube, emulator: EmulatorThread) -> None:
    def no_privileged(op: str, rtype: Any, obj: Any) -> tuple[int, str] | None:
        if obj["metadata"]["name"] == "refused":
            return 403, 'deployments "refused" is forbidden: exceeded quota'
        return None

    emulator.call(emulator.server.store.admission.append, no_privileged)
    try:
        with pytest.raises(KubeError) as error:
            kube.apply(deployment("refused", "emu"))
    finally:
        emulator.call(emulator.server.store.admission.remove, no_privileged)
    assert error.value.status == 403 and "exceeded quota" in error.value.message


def test_installing_an_api_later_is_discovered(tmp_path: Path) -> None:
    # An emulator of its own: the module's one must keep serving no KEDA to the other tests.
    with EmulatorThread() as emulator, pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(emulator.write_kubeconfig(tmp_path)))
        kube = Kube(load_api_client(), field_manager="operator")
        assert not kube.served("keda.sh/v1alpha1", "scaledobjects")
        emulator.install(resources.KEDA[0])
        assert kube.served("keda.sh/v1alpha1", "scaledobjects")


def test_gate_holds_a_request_until_opened(kube: Kube, emulator: EmulatorThread) -> None:
    release = emulator.gate(lambda request: request.name == "gated")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (kube.apply(deployment("gated", "emu")), done.set()))
    thread.start()
    wait_for(
        lambda: any(r.name == "gated" for r in emulator.call(lambda: list(emulator.server))),
        what="the gated request at the emulator",
    )
    kube.apply(deployment("after-gated", "emu"))  # a later request is answered meanwhile
    assert not done.is_set()
    release()
    assert done.wait(10)
    thread.join()


def test_kubeconfig_points_at_the_emulator(emulator: EmulatorThread, tmp_path: Path) -> None:
    text = emulator.write_kubeconfig(tmp_path).read_text()
    assert emulator.url in text
