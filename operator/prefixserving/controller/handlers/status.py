"""Status jobs (run by ``controller/periodic.py``): the children's state and the Prometheus
figures, written into ``status``.

:func:`refresh` (every ``status_interval_s``) reads the engine and router Deployments (and,
with warm-up on, the engine pods) and sets ``replicas``, ``readyReplicas`` (engine container
ready), ``warmReplicas`` (pod Ready: with warm-up on, a pod turns Ready only after its
warm-up), ``Ready`` and ``Progressing`` (``api/lifecycle.py`` documents both and the roll-up:
Ready means serving traffic, it does not wait for a rollout). It skips a resource not yet
reconciled and one whose current generation was judged invalid, so ``InvalidSpec`` stays
visible; while a new generation is not applied yet it leaves ``Progressing`` alone.

:func:`refresh_metrics` (every ``metrics_interval_s``) writes ``status.metrics``,
``status.hints`` and the ``MetricsAvailable`` condition. A missing or slow Prometheus only
flips that condition (old figures stay, their ``asOf`` shows their age); nothing else in the
status changes.

Cost per call: two Deployment GETs, plus one pod list with warm-up on (refresh); six PromQL
queries, each bounded by the timeout (refresh_metrics, ``controller/status_metrics.py``); then
one status read-modify-write (a GET and, when something changed, a PATCH) and one Event per
condition transition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prefixserving.api import defaults, lifecycle, names
from prefixserving.api.validation import SpecError, parse_resource
from prefixserving.controller import status_metrics
from prefixserving.controller.handlers.reconcile import write_status
from prefixserving.controller.kube import DEPLOYMENT, POD, Kube

ENGINE_CONTAINER = "engine"


@dataclass(frozen=True)
class DeploymentState:
    """What a Deployment reports about its pods."""

    exists: bool
    desired: int = 0
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    rolled_out: bool = False

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None) -> DeploymentState:
        if obj is None:
            return cls(exists=False)
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        desired = int(spec.get("replicas", 1))
        replicas = int(status.get("replicas", 0))
        updated = int(status.get("updatedReplicas", 0))
        current = int(status.get("observedGeneration", 0)) >= int(
            obj["metadata"].get("generation", 1)
        )
        return cls(
            exists=True,
            desired=desired,
            replicas=replicas,
            ready=int(status.get("readyReplicas", 0)),
            updated=updated,
            rolled_out=current and updated >= desired and replicas <= updated,
        )


@dataclass(frozen=True)
class Observation:
    engine: DeploymentState
    router: DeploymentState
    engine_container_ready: int
    warm: int


def pod_counts(pods: list[dict[str, Any]]) -> tuple[int, int]:
    """(engine container ready, pod Ready) over the engine pods, one pass over ``pods``.

    A pod being deleted counts in neither: it is leaving, and the Deployment's own counts and
    the Service's endpoints drop it too. With warm-up on, pod Ready is the warm-up sidecar's
    readiness (``/readyz`` after its prompts ran) and the engine's, so the second figure is the
    warm replicas.
    """
    ready = warm = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        status = pod.get("status") or {}
        if any(
            c.get("name") == ENGINE_CONTAINER and c.get("ready")
            for c in status.get("containerStatuses") or []
        ):
            ready += 1
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ):
            warm += 1
    return ready, warm


def observe(kube: Kube, namespace: str, name: str, warmup: bool) -> Observation:
    """Read the Deployments; with warm-up on, also the engine pods (without warm-up a pod is
    Ready exactly when its engine is, so the Deployment's count says it all)."""
    engine = DeploymentState.of(kube.get(DEPLOYMENT, namespace, names.engine_deployment(name)))
    router = DeploymentState.of(kube.get(DEPLOYMENT, namespace, names.router_deployment(name)))
    ready = warm = engine.ready
    if warmup:
        selector = names.label_selector(names.engine_selector(name))
        pods = kube.list(POD, namespace, selector)
        if pods:
            ready, warm = pod_counts(pods)
    return Observation(engine=engine, router=router, engine_container_ready=ready, warm=warm)


def judge(observation: Observation, namespace: str, name: str) -> list[lifecycle.ConditionUpdate]:
    """Ready and Progressing from an observation. A pod serves once it is Ready (after its
    warm-up when warm-up is on); "loaded" counts engine containers that are up."""
    engine, router = observation.engine, observation.router
    engines = (
        f"{engine.ready}/{engine.desired} engine replicas serving "
        f"({observation.engine_container_ready} loaded)"
    )
    routers = f"{router.ready}/{router.desired} router replicas ready"
    if not engine.exists or engine.ready == 0:
        deployment = names.engine_deployment(name)
        ready = lifecycle.mark_not_ready(
            lifecycle.REASON_ENGINE_UNAVAILABLE,
            f"{engines}; for scheduling or model-loading problems run: "
            f"kubectl -n {namespace} describe deployment {deployment}",
        )
    elif not router.exists or router.ready == 0:
        ready = lifecycle.mark_not_ready(lifecycle.REASON_ROUTER_UNAVAILABLE, routers)
    else:
        ready = lifecycle.mark_ready(f"{engines}; {routers}")
    if engine.rolled_out and router.rolled_out:
        progressing = lifecycle.mark_rollout_complete("all replicas updated")
    else:
        progressing = lifecycle.mark_rolling_out(
            f"engine {engine.updated}/{engine.desired} updated; "
            f"router {router.updated}/{router.desired} updated"
        )
    return [ready, progressing]


def _judged_invalid(body: Mapping[str, Any]) -> bool:
    status = body.get("status") or {}
    ready = lifecycle.find(status.get("conditions"), lifecycle.COND_READY)
    return bool(
        ready
        and ready.get("reason") == lifecycle.REASON_INVALID_SPEC
        and status.get("observedGeneration") == body["metadata"].get("generation")
    )


def refresh(kube: Kube, body: Mapping[str, Any]) -> Observation | None:
    """Children -> replica counts, Ready, Progressing. None when skipped."""
    meta = body["metadata"]
    status = body.get("status") or {}
    if _judged_invalid(body) or status.get("observedGeneration") is None:
        return None  # invalid, or not reconciled yet: nothing to judge
    warmup = bool(((body.get("spec") or {}).get("warmup") or {}).get("enabled"))
    observation = observe(kube, meta["namespace"], meta["name"], warmup)
    updates = judge(observation, meta["namespace"], meta["name"])
    if status.get("observedGeneration") != meta.get("generation"):
        updates = [u for u in updates if u.type != lifecycle.COND_PROGRESSING]
    write_status(
        kube,
        body,
        updates,
        {
            "replicas": observation.engine.replicas,
            "readyReplicas": observation.engine_container_ready,
            "warmReplicas": observation.warm,
        },
    )
    return observation


def refresh_metrics(
    kube: Kube, body: Mapping[str, Any], prometheus_url: str, timeout_s: float
) -> status_metrics.Figures | None:
    """Prometheus -> ``status.metrics``; a failure degrades only ``MetricsAvailable``."""
    meta = body["metadata"]
    if not prometheus_url:
        write_status(
            kube,
            body,
            [
                lifecycle.mark_metrics_unknown(
                    "start the operator with --prometheus-url to fill status.metrics"
                )
            ],
            {},
        )
        return None
    try:
        figures = status_metrics.query(
            prometheus_url, meta["namespace"], meta["name"], timeout_s, _hygiene_threshold(body)
        )
    except status_metrics.MetricsUnavailable as exc:
        write_status(
            kube,
            body,
            [lifecycle.mark_metrics_unavailable(str(exc))],
            {},
        )
        return None
    write_status(
        kube,
        body,
        [lifecycle.mark_metrics_available(f"queried {prometheus_url}")],
        {"metrics": figures.as_status(lifecycle.now_rfc3339()), "hints": list(figures.hints)},
    )
    return figures


def _hygiene_threshold(body: Mapping[str, Any]) -> float:
    """The resource's prefix-hygiene threshold (the default while its spec is invalid)."""
    try:
        return parse_resource(body).spec.monitoring.alerts.first_block_new_threshold
    except SpecError:
        return defaults.FIRST_BLOCK_NEW_THRESHOLD
