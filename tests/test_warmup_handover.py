"""The rolling-update handover (``warmup.handover``) against the Kubernetes emulator through the
official client: which old pod a new one claims, the claim's annotations, that two new pods
never claim the same old one (the emulator enforces ``resourceVersion`` preconditions as the
API server does), the routing identity a new pod takes and keeps, and ``/identity``. What the
emulator does not do: delete pods by their deletion cost; that is the ReplicaSet controller's
part, checked on kind in e2e/test_operator_e2e.py."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import kubernetes
import pytest

from prefixserving import constants
from prefixserving.controller.kube import KINDS, Kube, load_api_client
from prefixserving.warmup import handover
from prefixserving.warmup.handover import (
    DELETION_COST,
    DELETION_COST_ANNOTATION,
    HANDOVER_ANNOTATION,
    IDENTITY_ANNOTATION,
    Handover,
    ThisPod,
    claim_replaced,
    pods_api,
    resolve_handover,
)
from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.server import build_app
from prefixserving.warmup.state import WarmupState

NS = "handover"
SELECTOR = "app.kubernetes.io/component=engine,app.kubernetes.io/instance=chat"
LABELS = {"app.kubernetes.io/component": "engine", "app.kubernetes.io/instance": "chat"}
POD = KINDS[("v1", "Pod")]


@pytest.fixture
def kube(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kube]:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    client = Kube(load_api_client(), field_manager="test")
    yield client
    for pod in client.request("GET", f"/api/v1/namespaces/{NS}/pods")["items"]:
        client.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")


@pytest.fixture
def api(kubeconfig: Path) -> handover.PodsApi:
    return pods_api(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))


def make_pod(
    kube: Kube,
    name: str,
    revision: str,
    ip: str,
    *,
    ready: bool = True,
    labels: Mapping[str, str] = LABELS,
    annotations: Mapping[str, str] | None = None,
) -> None:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "labels": {**labels, constants.LABEL_POD_TEMPLATE_HASH: revision},
        "annotations": dict(annotations or {}),
    }
    kube.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        body={"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": []}},
    )
    status = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    kube.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/{name}/status",
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def annotations(kube: Kube, name: str) -> dict[str, str]:
    pod = kube.get(POD, NS, name)
    assert pod is not None
    return pod["metadata"].get("annotations") or {}


def me(name: str = "chat-new-1") -> ThisPod:
    return ThisPod(name, NS, "new")


def test_a_ready_old_pod_of_this_deployment_is_claimed_and_marked_to_go_first(
    kube: Kube, api: handover.PodsApi
) -> None:
    # Created oldest first, so creation time and name give the same order.
    make_pod(kube, "chat-old-0-unready", "old", "10.0.0.3", ready=False)
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    make_pod(kube, "chat-old-b", "old", "10.0.0.2")
    make_pod(kube, "chat-new-0", "new", "10.0.0.9")
    other = {**LABELS, "app.kubernetes.io/instance": "other"}
    make_pod(kube, "other-old", "old", "10.0.0.8", labels=other)

    assert claim_replaced(api, me(), SELECTOR).replaces == "http://10.0.0.1:8000"
    assert annotations(kube, "chat-old-a") == {
        HANDOVER_ANNOTATION: "chat-new-1",
        DELETION_COST_ANNOTATION: DELETION_COST,
    }
    for untouched in ("chat-old-b", "chat-old-0-unready", "chat-new-0", "other-old"):
        assert annotations(kube, untouched) == {}, untouched


def test_a_claimed_pod_is_kept_by_its_claimant_and_skipped_by_others(
    kube: Kube, api: handover.PodsApi
) -> None:
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    make_pod(kube, "chat-old-b", "old", "fd00::2")
    for i in (1, 2, 3):  # the claimants are pods of the new revision
        make_pod(kube, f"chat-new-{i}", "new", f"10.0.1.{i}", ready=False)
    assert claim_replaced(api, me("chat-new-1"), SELECTOR).replaces == "http://10.0.0.1:8000"
    # A restarted sidecar asks again: the same pod, still its own.
    assert claim_replaced(api, me("chat-new-1"), SELECTOR).replaces == "http://10.0.0.1:8000"
    assert claim_replaced(api, me("chat-new-2"), SELECTOR).replaces == "http://[fd00::2]:8000"
    assert claim_replaced(api, me("chat-new-3"), SELECTOR).replaces is None
    assert annotations(kube, "chat-old-b")[HANDOVER_ANNOTATION] == "chat-new-2"


def test_a_claim_of_a_pod_that_is_gone_passes_to_its_successor(
    kube: Kube, api: handover.PodsApi
) -> None:
    make_pod(kube, "chat-new-1", "new", "10.0.0.5")
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    assert claim_replaced(api, me("chat-new-1"), SELECTOR).replaces == "http://10.0.0.1:8000"
    assert claim_replaced(api, me("chat-new-2"), SELECTOR).replaces is None, "its claimant is alive"
    kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/chat-new-1")  # failed, replaced
    assert claim_replaced(api, me("chat-new-2"), SELECTOR).replaces == "http://10.0.0.1:8000"
    assert annotations(kube, "chat-old-a")[HANDOVER_ANNOTATION] == "chat-new-2"


class RacingPods:
    """Lists for ``racer`` too: after this pod's first list, ``racer`` claims first, so this
    pod's patch carries a stale ``resourceVersion``."""

    def __init__(self, api: handover.PodsApi, racer: ThisPod) -> None:
        self.api, self.racer = api, racer
        self.patched: list[str] = []
        self.raced = False

    def list_pods(self, namespace: str, selector: str) -> Sequence[Mapping[str, Any]]:
        pods = self.api.list_pods(namespace, selector)
        if not self.raced:
            self.raced = True
            assert claim_replaced(self.api, self.racer, selector).replaces is not None
        return pods

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.patched.append(name)
        self.api.patch_pod(namespace, name, patch)


def test_two_new_pods_racing_for_one_old_pod_claim_distinct_ones(
    kube: Kube, api: handover.PodsApi
) -> None:
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    make_pod(kube, "chat-old-b", "old", "10.0.0.2")
    for i in (1, 2):
        make_pod(kube, f"chat-new-{i}", "new", f"10.0.1.{i}", ready=False)
    racing = RacingPods(api, me("chat-new-2"))
    assert claim_replaced(racing, me("chat-new-1"), SELECTOR).replaces == "http://10.0.0.2:8000"
    # The stale claim must conflict (409) and be retried; then the identity patch.
    assert racing.patched == ["chat-old-a", "chat-old-b", "chat-new-1"]
    assert annotations(kube, "chat-old-a")[HANDOVER_ANNOTATION] == "chat-new-2"
    assert annotations(kube, "chat-old-b")[HANDOVER_ANNOTATION] == "chat-new-1"


def listed(name: str, created: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {constants.LABEL_POD_TEMPLATE_HASH: "old"},
            "creationTimestamp": created,
            "resourceVersion": "1",
            **meta,
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_candidates_go_oldest_first_then_by_name_and_never_terminating() -> None:
    z = listed("chat-old-z", "2026-12-01T00:00:01Z")
    a = listed("chat-old-a", "2026-12-01T00:00:02Z")
    b = listed("chat-old-b", "2026-12-01T00:00:02Z")
    going = listed("chat-old-0", "2026-11-01T00:00:00Z", deletionTimestamp="2026-12-02T00:00:00Z")
    assert handover.candidates([b, a, going, z], me()) == [z, a, b]


class RefusingPods:
    def list_pods(self, namespace: str, selector: str) -> Sequence[Mapping[str, Any]]:
        raise kubernetes.client.exceptions.ApiException(status=403, reason="Forbidden")

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        raise AssertionError("not reached")


IN_POD = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    constants.ENV_POD_NAME: "chat-new-1",
    constants.ENV_POD_NAMESPACE: NS,
    constants.ENV_POD_TEMPLATE_HASH: "new",
}


def test_outside_a_pod_or_when_refused_warm_up_goes_on_without_handover() -> None:
    def never() -> handover.PodsApi:
        raise AssertionError("no API call outside a pod or with the handover off")

    for missing in IN_POD:
        env = {k: v for k, v in IN_POD.items() if k != missing}
        name = env.get(constants.ENV_POD_NAME)
        assert resolve_handover(env, SELECTOR, api=never) == Handover(None, name), missing
    assert resolve_handover(IN_POD, SELECTOR, api=RefusingPods) == Handover(None, "chat-new-1")
    assert resolve_handover(IN_POD, None, api=never) == Handover(None, "chat-new-1")
    assert resolve_handover({}, None, api=never) == Handover(None, None)


def test_without_an_old_pod_the_identity_is_the_pods_own_name(
    kube: Kube, api: handover.PodsApi
) -> None:
    make_pod(kube, "chat-new-1", "new", "10.0.1.1")
    assert claim_replaced(api, me("chat-new-1"), SELECTOR) == Handover(None, "chat-new-1")
    assert annotations(kube, "chat-new-1") == {}, "nothing claimed, nothing written"


def test_a_new_pod_takes_the_claimed_pods_identity_and_writes_it_on_itself(
    kube: Kube, api: handover.PodsApi
) -> None:
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    make_pod(kube, "chat-new-1", "new", "10.0.1.1", ready=False)
    claimed = claim_replaced(api, me("chat-new-1"), SELECTOR)
    assert claimed == Handover("http://10.0.0.1:8000", "chat-old-a")
    assert annotations(kube, "chat-new-1") == {IDENTITY_ANNOTATION: "chat-old-a"}


def test_a_chain_of_replacements_keeps_one_identity(kube: Kube, api: handover.PodsApi) -> None:
    # chat-old-a took its place from chat-first in the previous rollout.
    make_pod(kube, "chat-old-a", "old", "10.0.0.1", annotations={IDENTITY_ANNOTATION: "chat-first"})
    make_pod(kube, "chat-new-1", "new", "10.0.1.1", ready=False)
    claimed = claim_replaced(api, me("chat-new-1"), SELECTOR)
    assert claimed == Handover("http://10.0.0.1:8000", "chat-first")
    assert annotations(kube, "chat-new-1") == {IDENTITY_ANNOTATION: "chat-first"}


def test_a_restarted_sidecar_keeps_the_identity_written_on_its_pod(
    kube: Kube, api: handover.PodsApi
) -> None:
    """Its first run claimed chat-old-a, which is gone now; it claims chat-old-b for the
    replay but keeps chat-old-a's place in the ranking."""
    make_pod(kube, "chat-old-b", "old", "10.0.0.2", annotations={IDENTITY_ANNOTATION: "chat-b"})
    identity = {IDENTITY_ANNOTATION: "chat-old-a"}
    make_pod(kube, "chat-new-1", "new", "10.0.1.1", ready=False, annotations=identity)
    claimed = claim_replaced(api, me("chat-new-1"), SELECTOR)
    assert claimed == Handover("http://10.0.0.2:8000", "chat-old-a")
    assert annotations(kube, "chat-new-1") == identity
    kube.request("DELETE", f"/api/v1/namespaces/{NS}/pods/chat-old-b")
    assert claim_replaced(api, me("chat-new-1"), SELECTOR) == Handover(None, "chat-old-a")


class SelfPatchRefused:
    """The API as it is, except that patching this pod fails."""

    def __init__(self, api: handover.PodsApi, me: ThisPod) -> None:
        self.api, self.me = api, me

    def list_pods(self, namespace: str, selector: str) -> Sequence[Mapping[str, Any]]:
        return self.api.list_pods(namespace, selector)

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        if name == self.me.name:
            raise kubernetes.client.exceptions.ApiException(status=403, reason="Forbidden")
        self.api.patch_pod(namespace, name, patch)


def test_a_refused_identity_patch_is_logged_and_the_identity_still_served(
    kube: Kube, api: handover.PodsApi, caplog: pytest.LogCaptureFixture
) -> None:
    make_pod(kube, "chat-old-a", "old", "10.0.0.1")
    make_pod(kube, "chat-new-1", "new", "10.0.1.1", ready=False)
    refusing = SelfPatchRefused(api, me("chat-new-1"))
    claimed = claim_replaced(refusing, me("chat-new-1"), SELECTOR)
    assert claimed == Handover("http://10.0.0.1:8000", "chat-old-a")
    assert annotations(kube, "chat-old-a")[HANDOVER_ANNOTATION] == "chat-new-1"
    assert annotations(kube, "chat-new-1") == {}
    assert "cannot annotate pod chat-new-1 with routing identity chat-old-a" in caplog.text


async def _identity(state: WarmupState) -> tuple[int, Any]:
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as client:
        answer = await client.get("/identity")
    return answer.status_code, answer.json()


async def test_identity_is_503_until_resolved_then_200() -> None:
    state = WarmupState()
    assert await _identity(state) == (503, {"identity": None})
    state.set_identity("chat-old-a")
    assert await _identity(state) == (200, {"identity": "chat-old-a"})
    assert not state.ready, "the identity comes before Ready (before the router is asked)"


@pytest.mark.parametrize("pod_name", ["chat-new-1", None])
async def test_identity_is_the_pods_name_with_the_handover_off_or_null_outside_a_pod(
    pod_name: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also when warm-up times out before the handover step (the engine never answers)."""
    monkeypatch.delenv(constants.ENV_POD_NAME, raising=False)
    if pod_name is not None:
        monkeypatch.setenv(constants.ENV_POD_NAME, pod_name)
    state = WarmupState()
    config = WarmupConfig(engine_url="http://127.0.0.1:9", timeout_s=0.3, poll_interval_s=0.05)
    await run_warmup(config, state)
    assert state.timed_out
    assert await _identity(state) == (200, {"identity": pod_name})
