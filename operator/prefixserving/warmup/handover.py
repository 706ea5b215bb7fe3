"""Rolling-update handover: a new engine pod claims the old pod it replaces, and its warm-up
replays that pod's cache (``replaces`` of the router's hot-prefix endpoint, ``router.hot``).

In a rolling update (the operator renders ``maxSurge: 1, maxUnavailable: 0``) the ReplicaSet
controller deletes one old pod each time a new one turns Ready, and that pod's cache goes with
it. Without a handover the new pod warms only its own share of the routing ranking, and the
prefixes the deleted pod held are recomputed cold wherever the router sends them next, once
per step of the rollout. The controller deletes Ready pods with the lowest
``controller.kubernetes.io/pod-deletion-cost`` first (Kubernetes 1.22 and later), so the new
pod picks the old pod to go, copies its cache and marks it as the next to delete. With the
engines' KV cache events the router then sends that traffic to the new pod, which holds it.

**Routing identity.** The router ranks backends by rendezvous hashing of an id; started with
``--identity-port`` it hashes the id each engine pod serves at ``GET /identity`` on the
warm-up port instead of its URL. A pod's identity is its ``IDENTITY_ANNOTATION``, else its
name; a new pod that claims an old one takes the old pod's identity, so it gets exactly the old
pod's place in every ranking (no key moves but the old pod's, and they move to it), and a chain
of replacements keeps one identity.

**Algorithm** (:func:`claim_replaced`, once, when the engine is healthy, before asking the
router):

1. List the pods matching ``selector`` in this pod's namespace (this pod among them). If this
   pod already carries ``IDENTITY_ANNOTATION`` (a restarted sidecar), that is its identity.
2. Candidates (:func:`candidates`): pods of another revision (their ``pod-template-hash``
   label differs from this pod's), Running and Ready, not being deleted, with an IP, and not
   claimed by another live pod (annotation ``HANDOVER_ANNOTATION`` absent, naming this pod: a
   restarted sidecar keeps its claim, or naming a pod no longer listed: a new pod that failed
   and was replaced leaves its claim to its successor).
3. Claim the oldest candidate (creation time, then name): a merge patch of its annotations,
   ``HANDOVER_ANNOTATION: <this pod>`` and ``DELETION_COST_ANNOTATION: DELETION_COST``,
   guarded by the ``resourceVersion`` it was listed with, so two new pods never claim the
   same old one. On ``409 Conflict`` list again, at most ``attempts`` times.
4. Without an identity from step 1, take the claimed pod's (:func:`identity_of`) and write it
   on this pod (a merge patch of its annotations; a failure is logged, the identity is still
   served from memory).
5. Answer a :class:`Handover`: the claimed pod's engine URL, written as the router writes
   backends, and this pod's identity.

No replaced URL, and warm-up goes on without a handover, when no old pod is left (a scale-out,
or every old pod already claimed; the identity is then step 1's, else this pod's name) or when
the API server refuses (the Role grants ``list`` and ``patch`` on pods; the identity is then
this pod's name). Until the controller deletes the claimed pod, it serves the same identity.
:func:`resolve_handover` is the entry point: with the handover off or outside a pod (no
``POD_NAME``, ``POD_NAMESPACE`` or ``POD_TEMPLATE_HASH``) it makes no call and the identity is
``POD_NAME``, None without it (the router then hashes the URL). With ``maxSurge`` above 1
several new pods claim distinct old pods, but the controller may delete them in another order
than the new pods turn Ready.

Cost: one list and one patch per attempt, plus one patch of this pod after a claim.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from prefixserving import constants
from prefixserving.warmup.events import in_cluster_api

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger("prefixserving.warmup")

HANDOVER_ANNOTATION = f"{constants.GROUP}/handover-to"
IDENTITY_ANNOTATION = f"{constants.GROUP}/routing-identity"
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
# Below the default 0 and any cost a user is likely to set, above the int32 minimum.
DELETION_COST = "-1000000"


class Conflict(Exception):
    """The pod changed since it was listed (``409``)."""


class PodsApi(Protocol):
    """The two pod calls of the handover, on JSON objects."""

    def list_pods(self, namespace: str, selector: str) -> Sequence[Mapping[str, Any]]: ...

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """A merge patch; :class:`Conflict` when its ``resourceVersion`` is stale."""
        ...


@dataclass(frozen=True, slots=True)
class Handover:
    """What the handover resolved: the engine URL of the old pod this pod replaces (None
    without a claim) and this pod's routing identity (None outside a pod)."""

    replaces: str | None
    identity: str | None


@dataclass(frozen=True, slots=True)
class ThisPod:
    """This pod: its name, namespace and revision (Downward API)."""

    name: str
    namespace: str
    revision: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ThisPod | None:
        name = env.get(constants.ENV_POD_NAME)
        namespace = env.get(constants.ENV_POD_NAMESPACE)
        revision = env.get(constants.ENV_POD_TEMPLATE_HASH)
        if not (env.get("KUBERNETES_SERVICE_HOST") and name and namespace and revision):
            return None
        return cls(name, namespace, revision)


def engine_url(pod: Mapping[str, Any]) -> str:
    """``http://IP:PORT`` of the pod's engine, brackets around an IPv6 address."""
    ip = pod["status"]["podIP"]
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{constants.ENGINE_PORT}"


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    conditions = status.get("conditions") or []
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in conditions
    )


def candidates(pods: Sequence[Mapping[str, Any]], me: ThisPod) -> list[Mapping[str, Any]]:
    """Old pods this pod may claim, the one to claim first (step 2 of the module docstring)."""
    listed = {(p.get("metadata") or {}).get("name") for p in pods}
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        if (
            labels.get(constants.LABEL_POD_TEMPLATE_HASH, me.revision) == me.revision
            or meta.get("deletionTimestamp")
            or not (pod.get("status") or {}).get("podIP")
            or not _ready(pod)
            or annotations.get(HANDOVER_ANNOTATION, me.name) in listed - {me.name}
        ):
            continue
        found.append(pod)
    return sorted(
        found,
        key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]),
    )


def claim_patch(pod: Mapping[str, Any], me: ThisPod) -> dict[str, Any]:
    """The merge patch that claims ``pod`` for ``me`` (step 3)."""
    return {
        "metadata": {
            "resourceVersion": pod["metadata"]["resourceVersion"],
            "annotations": {HANDOVER_ANNOTATION: me.name, DELETION_COST_ANNOTATION: DELETION_COST},
        }
    }


def identity_of(pod: Mapping[str, Any]) -> str:
    """The pod's routing identity: its ``IDENTITY_ANNOTATION``, else its name."""
    meta = pod["metadata"]
    return (meta.get("annotations") or {}).get(IDENTITY_ANNOTATION) or meta["name"]


def kept_identity(pods: Sequence[Mapping[str, Any]], me: ThisPod) -> str | None:
    """This pod's ``IDENTITY_ANNOTATION`` as listed (a restarted sidecar's), or None (step 1)."""
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("name") == me.name:
            return (meta.get("annotations") or {}).get(IDENTITY_ANNOTATION)
    return None


def write_identity(api: PodsApi, me: ThisPod, identity: str) -> None:
    """Annotate this pod with ``identity`` so that a restarted sidecar keeps it (step 4): one
    merge patch; a failure is logged, never raised."""
    patch = {"metadata": {"annotations": {IDENTITY_ANNOTATION: identity}}}
    try:
        api.patch_pod(me.namespace, me.name, patch)
    except Exception as exc:
        log.warning(
            "handover: cannot annotate pod %s with routing identity %s (%s); serving it anyway",
            me.name,
            identity,
            exc,
        )


def claim_replaced(api: PodsApi, me: ThisPod, selector: str, attempts: int = 3) -> Handover:
    """The old pod this pod now replaces and this pod's routing identity (module docstring)."""
    kept: str | None = None
    for _ in range(attempts):
        pods = api.list_pods(me.namespace, selector)
        kept = kept_identity(pods, me)
        found = candidates(pods, me)
        if not found:
            log.info("handover: no old pod to replace (not a rolling update)")
            return Handover(None, kept or me.name)
        pod = found[0]
        try:
            api.patch_pod(me.namespace, pod["metadata"]["name"], claim_patch(pod, me))
        except Conflict:
            continue
        identity = kept or identity_of(pod)
        log.info(
            "handover: replacing pod %s, routing identity %s", pod["metadata"]["name"], identity
        )
        if kept is None:
            write_identity(api, me, identity)
        return Handover(engine_url(pod), identity)
    log.warning("handover: every claim conflicted after %d attempts; no handover", attempts)
    return Handover(None, kept or me.name)


class _CoreV1Pods:
    """:class:`PodsApi` over the official client."""

    def __init__(self, core: CoreV1Api) -> None:
        self._core = core

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        pods = self._core.list_namespaced_pod(namespace, label_selector=selector)
        return self._core.api_client.sanitize_for_serialization(pods).get("items", [])

    def patch_pod(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._core.patch_namespaced_pod(
                name, namespace, dict(patch), _content_type="application/merge-patch+json"
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(str(exc)) from exc
            raise


def pods_api(api_client: Any) -> PodsApi:
    """:class:`PodsApi` over a configured ``kubernetes.client.ApiClient``."""
    from kubernetes import client

    return _CoreV1Pods(client.CoreV1Api(api_client))


def in_cluster_pods() -> PodsApi:
    """:class:`PodsApi` with this pod's service account (:func:`events.in_cluster_api`)."""
    return _CoreV1Pods(in_cluster_api())


def resolve_handover(
    env: Mapping[str, str], selector: str | None, api: Callable[[], PodsApi] = in_cluster_pods
) -> Handover:
    """:func:`claim_replaced` for the pod of ``env`` when ``selector`` is set (the handover is
    on). With the handover off, outside a pod or on any API error (logged: a handover is never
    worth failing warm-up for) nothing is replaced and the identity is ``POD_NAME`` (None
    without it)."""
    name = env.get(constants.ENV_POD_NAME) or None
    if not selector:
        return Handover(None, name)
    me = ThisPod.from_env(env)
    if me is None:
        log.info("handover: not in a pod (no POD_NAME, POD_NAMESPACE, POD_TEMPLATE_HASH)")
        return Handover(None, name)
    try:
        return claim_replaced(api(), me, selector)
    except Exception as exc:
        log.warning("handover: the API server refused (%s); warming without handover", exc)
        return Handover(None, me.name)
