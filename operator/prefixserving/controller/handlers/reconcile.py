"""Reconcile a PrefixServing: validate, render, apply the children, prune, report.

Algorithm of :func:`reconcile` (one resource; every step idempotent, so an operator restart in
the middle converges to the same objects):

1. Validate the body (``api.validation.parse_resource``). A bad spec sets ``Ready=False``,
   ``Degraded=True`` and ``Progressing=False`` with reason ``InvalidSpec`` and the problems
   (``api/lifecycle.py``), creates and changes nothing, and raises :class:`InvalidSpec`.
2. Resolve ``spec.autoscaling.policyRef`` to the ScalingPolicy (missing: ``PolicyNotFound``,
   rendered with the spec's values and the defaults until the policy appears).
3. Render the children (pure, ``render.render_children``). Should the renderer raise (a bug
   that a spec triggers, not an invalid spec), the conditions say ``RenderFailed`` with the
   error, nothing is applied, and :class:`RenderFailed` is raised: the failure stays on this
   resource. Then check the optional API each kind requires (``Kind.requires`` in
   ``prefixserving.kinds``): a child whose own API is not served is dropped (KEDA's
   ScaledObject without KEDA, ServiceMonitor/PrometheusRule without prometheus-operator, the
   InferencePool without its CRD); a missing dependency (the custom metrics API of the HPA
   backend) is noted. KEDA and the custom metrics API missing are ``ScalerMissing``, the
   InferencePool CRD ``InferencePoolMissing``.
4. Server-side apply each child with the operator's field manager and ``force``. The operator
   owns exactly the fields it renders, so ``replicas`` left out under autoscaling, HPA/KEDA
   status and annotations that Argo CD or Flux add stay with their owners. A refused child is
   recorded with the server's message; the others are still applied.
5. Delete children of this resource (owner uid and instance label) the new spec no longer
   renders.
6. Write ``observedGeneration``, ``routerEndpoint`` (none in endpointPicker mode),
   ``Degraded`` (and ``Progressing`` on a new generation) and post Events for transitions.

Cost: one GET of the referenced ScalingPolicy, one discovery request per API group (cached
when present), one apply per child, one list per managed kind served for pruning, one status
read-modify-write (GET, then PATCH when something changed) and one Event per condition
transition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from prefixserving import constants
from prefixserving.api import lifecycle, names
from prefixserving.api.types import PrefixServing, ScalingPolicy
from prefixserving.api.validation import SpecError, parse_resource, parse_scaling_policy
from prefixserving.controller.drift import drifted
from prefixserving.controller.kube import Kube, KubeError
from prefixserving.kinds import (
    CHILD_KINDS,
    INFERENCE_POOLS,
    PREFIX_SERVING,
    SCALING_POLICY,
    kind_of,
)
from prefixserving.render import render_children

logger = logging.getLogger(__name__)

# How long kopf waits before retrying a reconcile whose children were refused.
REFUSED_RETRY_S = 30.0


class InvalidSpec(Exception):
    """The resource failed validation; the status already says why."""


class ChildrenRefused(Exception):
    """The API server refused some children; the status already names them."""


class RenderFailed(Exception):
    """Rendering the children raised: an operator bug that a spec triggers, not an invalid spec."""


@dataclass
class Outcome:
    """What one reconcile did."""

    applied: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    scaler_missing: str = ""
    inference_pool_missing: str = ""
    policy_missing: str = ""

    def degraded(self) -> lifecycle.ConditionUpdate:
        """Degraded: the most pressing reason (refused child, missing scaler, missing
        InferencePool CRD, missing policy), with every problem in the message."""
        refused = "; ".join(f"{ref}: {message}" for ref, message in self.refused)
        problems = [
            (lifecycle.REASON_CHILD_REJECTED, refused),
            (lifecycle.REASON_SCALER_MISSING, self.scaler_missing),
            (lifecycle.REASON_INFERENCE_POOL_MISSING, self.inference_pool_missing),
            (lifecycle.REASON_POLICY_NOT_FOUND, self.policy_missing),
        ]
        found = [(reason, message) for reason, message in problems if message]
        if found:
            message = " | ".join(message for _, message in found)
            return lifecycle.mark_degraded(found[0][0], message)
        message = f"{len(self.applied)} objects applied"
        if self.skipped:
            message += f"; not served by this cluster, skipped: {', '.join(self.skipped)}"
        return lifecycle.mark_reconciled(message)


def ref(obj: Mapping[str, Any]) -> str:
    """``Kind/name``, how messages and Events name a child."""
    return f"{obj['kind']}/{obj['metadata']['name']}"


def validate(body: Mapping[str, Any]) -> PrefixServing:
    """Parse the spec part of an API body (status and server metadata are not validated)."""
    return parse_resource({key: value for key, value in body.items() if key != "status"})


def resolve_policy(kube: Kube, resource: PrefixServing) -> tuple[ScalingPolicy | None, str]:
    """The referenced ScalingPolicy, or (None, why not) when it is missing or invalid."""
    policy_ref = resource.spec.autoscaling.policy_ref
    if policy_ref is None:
        return None, ""
    namespace = resource.metadata.namespace
    body = kube.get(SCALING_POLICY, namespace, policy_ref.name)
    if body is None:
        return None, (
            f"ScalingPolicy {namespace}/{policy_ref.name} not found; using the spec's values and "
            f"the defaults. Create it: kubectl apply -n {namespace} -f <policy.yaml>"
        )
    try:
        return parse_scaling_policy({k: v for k, v in body.items() if k != "status"}), ""
    except SpecError as exc:
        return None, f"ScalingPolicy {namespace}/{policy_ref.name} is invalid: {exc}"


def desired_children(kube: Kube, resource: PrefixServing, outcome: Outcome) -> list[dict[str, Any]]:
    """Rendered children whose API is served; notes missing scalers in ``outcome``."""
    policy, outcome.policy_missing = resolve_policy(kube, resource)
    policy_spec = policy.spec if policy is not None else None
    try:
        children = render_children(resource, policy_spec)
    except Exception as error:  # any bug here must stay on this one resource
        raise RenderFailed(
            f"rendering the children failed ({type(error).__name__}: {str(error)[:500]});"
            " nothing was applied. This is an operator bug: report it with this resource's YAML"
        ) from error
    served: list[dict[str, Any]] = []
    for child in children:
        kind = kind_of(child)
        api = kind.requires
        if api is not None and not kube.served(api.api_version, api.plural):
            message = api.missing.format(ref=ref(child))
            if api is INFERENCE_POOLS:
                outcome.inference_pool_missing = message
            elif message:
                outcome.scaler_missing = message
            if kind.optional:  # its own API is missing: it cannot be created
                outcome.skipped.append(ref(child))
                continue
        served.append(child)
    return served


def apply_children(kube: Kube, children: Iterable[Mapping[str, Any]], outcome: Outcome) -> None:
    for child in children:
        try:
            kube.apply(child)
        except KubeError as exc:
            if exc.status >= 500 or exc.status in (408, 429):
                raise  # the server is unwell, not refusing: let kopf retry the whole step
            outcome.refused.append((ref(child), exc.message))
        else:
            outcome.applied.append(ref(child))


def prune(
    kube: Kube, resource: PrefixServing, keep: Iterable[Mapping[str, Any]], outcome: Outcome
) -> None:
    """Delete this resource's children that are not in ``keep``."""
    wanted = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in keep}
    namespace, name, uid = (
        resource.metadata.namespace,
        resource.metadata.name,
        resource.metadata.uid,
    )
    selector = names.label_selector(names.instance_selector(name))
    for kind in CHILD_KINDS:
        if kind.optional and not kube.served(kind.api_version, kind.plural):
            continue
        for obj in kube.list(kind, namespace, selector):
            owners = obj["metadata"].get("ownerReferences") or []
            key = (kind.api_version, kind.kind, obj["metadata"]["name"])
            ours = any(o.get("uid") == uid for o in owners)
            if key not in wanted and ours and kube.delete(kind, namespace, key[2]):
                outcome.deleted.append(f"{kind.kind}/{key[2]}")


def write_status(
    kube: Kube,
    body: Mapping[str, Any],
    updates: list[lifecycle.ConditionUpdate],
    extra: Mapping[str, Any],
) -> list[lifecycle.Transition]:
    """Set conditions and fields on ``status``; post an Event per transition."""
    meta = body["metadata"]
    transitions: list[lifecycle.Transition] = []

    def mutate(status: dict[str, Any]) -> dict[str, Any]:
        nonlocal transitions
        for key, value in extra.items():
            old = status.get(key)
            merge = isinstance(old, Mapping) and isinstance(value, Mapping)
            status[key] = {**old, **value} if merge else value
        status["conditions"], transitions = lifecycle.apply(
            status.get("conditions"), updates, meta.get("generation"), lifecycle.now_rfc3339()
        )
        return status

    result = kube.update_status(PREFIX_SERVING, meta["namespace"], meta["name"], mutate)
    if result is None:
        return []
    for transition in transitions:
        c = transition.condition
        kube.event(
            body,
            "Warning" if transition.warning else "Normal",
            c.reason,
            f"{c.type}={c.status_text}: {c.message}" if c.message else f"{c.type}={c.status_text}",
        )
    return transitions


def halt(
    kube: Kube,
    body: Mapping[str, Any],
    reason: str,
    message: str,
    next_step: str,
    extra: Mapping[str, Any],
) -> None:
    """Ready=False and Degraded=True with ``reason`` and ``message``; Progressing=False says
    ``next_step``."""
    write_status(
        kube,
        body,
        [
            lifecycle.mark_not_ready(reason, message),
            lifecycle.mark_degraded(reason, message),
            lifecycle.mark_halted(reason, next_step),
        ],
        extra,
    )


def reject_invalid(kube: Kube, body: Mapping[str, Any], error: SpecError) -> None:
    message = "; ".join(str(problem) for problem in error.problems)
    extra = {"observedGeneration": body["metadata"].get("generation")}
    halt(kube, body, lifecycle.REASON_INVALID_SPEC, message, "fix the spec to continue", extra)


def reconcile(kube: Kube, body: Mapping[str, Any]) -> Outcome:
    """Steps 1-6 of the module docstring.

    Raises :class:`InvalidSpec` for a bad spec, :class:`RenderFailed` when the renderer raised
    and :class:`ChildrenRefused` when the server refused a child (all after writing status).
    A render failure leaves ``observedGeneration`` as it was (this generation is not applied),
    so the status timer goes on judging the children already running."""
    try:
        resource = validate(body)
    except SpecError as error:
        reject_invalid(kube, body, error)
        raise InvalidSpec(str(error)) from error
    outcome = Outcome()
    try:
        children = desired_children(kube, resource, outcome)
    except RenderFailed as error:
        next_step = "nothing applied; the resync retries it"
        halt(kube, body, lifecycle.REASON_RENDER_FAILED, str(error), next_step, {})
        raise
    apply_children(kube, children, outcome)
    prune(kube, resource, children, outcome)

    meta = body["metadata"]
    generation = meta.get("generation")
    previous = (body.get("status") or {}).get("observedGeneration")
    updates = [outcome.degraded()]
    if previous != generation:
        updates.append(
            lifecycle.mark_rolling_out(
                f"generation {generation}: applied {len(outcome.applied)} objects"
                + (f", deleted {', '.join(outcome.deleted)}" if outcome.deleted else "")
            )
        )
    write_status(
        kube,
        body,
        updates,
        {
            "observedGeneration": generation,
            # In endpointPicker mode clients call the gateway; no router URL to give.
            "routerEndpoint": (
                names.router_url(meta["name"], meta["namespace"])
                if resource.spec.router.mode == "proxy"
                else None
            ),
        },
    )
    if outcome.refused:
        raise ChildrenRefused(outcome.degraded().message)
    return outcome


def repair(kube: Kube, event_type: str, child: Mapping[str, Any]) -> list[str]:
    """Drift repair for one child event: when a child of a live PrefixServing was deleted or
    no longer contains what the operator renders, re-apply that resource's children.
    ``event_type`` is the watch event (``LISTED`` for the listing at operator start-up, which
    catches edits made while the operator was down); ``ADDED`` is skipped.
    Returns the drifted paths (empty when nothing was done)."""
    meta = child["metadata"]
    owner_name = (meta.get("labels") or {}).get(constants.LABEL_INSTANCE)
    if not owner_name or event_type == "ADDED":
        return []  # a new child is the operator's own apply: nothing to repair
    owner = kube.get(PREFIX_SERVING, meta["namespace"], owner_name)
    if owner is None or owner["metadata"].get("deletionTimestamp"):
        return []
    uid = owner["metadata"]["uid"]
    if not any(o.get("uid") == uid for o in meta.get("ownerReferences") or []):
        return []
    outcome = Outcome()
    try:
        resource = validate(owner)
        children = desired_children(kube, resource, outcome)
    except (SpecError, RenderFailed):
        return []  # the owner's own reconcile reports it on the owner's status
    key = (child["apiVersion"], child["kind"], meta["name"])
    desired = next(
        (c for c in children if (c["apiVersion"], c["kind"], c["metadata"]["name"]) == key), None
    )
    if desired is None:
        return []
    paths = ["(deleted)"] if event_type == "DELETED" else drifted(desired, child)
    if not paths:
        return []
    apply_children(kube, children, outcome)
    kube.event(
        owner,
        "Normal",
        "DriftRepaired",
        f"{ref(child)} was {'deleted' if event_type == 'DELETED' else 'changed'} "
        f"({', '.join(paths[:5])}); restored",
    )
    return paths


def propagate_policy(kube: Kube, namespace: str, referencing: Iterable[str]) -> list[str]:
    """A ScalingPolicy changed: reconcile every PrefixServing that references it. Returns the
    names reconciled; a failure of one never stops the others."""
    done: list[str] = []
    for name in sorted(set(referencing)):
        body = kube.get(PREFIX_SERVING, namespace, name)
        if body is None:
            continue
        try:
            reconcile(kube, body)
        except (InvalidSpec, RenderFailed, ChildrenRefused) as exc:
            logger.warning("policy change: %s/%s not fully reconciled: %s", namespace, name, exc)
        done.append(name)
    return done


def policy_references(namespace: str, name: str, spec: Mapping[str, Any]) -> dict[Any, str]:
    """Index entry ``(namespace, policy name) -> resource name`` for a PrefixServing."""
    policy_ref = ((spec.get("autoscaling") or {}).get("policyRef") or {}).get("name")
    return {(namespace, policy_ref): name} if policy_ref else {}


def is_child_of_ours(obj: Mapping[str, Any]) -> bool:
    """Owned by a PrefixServing (the ``kopf`` filter of the drift handlers)."""
    owners = obj.get("metadata", {}).get("ownerReferences") or []
    return any(
        o.get("kind") == constants.KIND and o.get("apiVersion") == constants.API_VERSION
        for o in owners
    )


def on_change(kube: Kube, body: Mapping[str, Any]) -> None:
    """create / update / resume: reconcile; a bad spec is permanent until the spec changes,
    refused children are retried after ``REFUSED_RETRY_S``."""
    try:
        reconcile(kube, body)
    except InvalidSpec as exc:
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    except RenderFailed as exc:  # retried by the resync timer and on the next spec change
        raise kopf.PermanentError(str(exc)) from exc
    except ChildrenRefused as exc:
        raise kopf.TemporaryError(f"children refused: {exc}", delay=REFUSED_RETRY_S) from exc


def resync(kube: Kube, body: Mapping[str, Any]) -> None:
    """The periodic full re-apply: catches missed events, a scaler API installed later and
    children refused before. Skipped while the resource is being deleted or while a change is
    still being reconciled (its generation not yet observed: kopf's update handler, which
    retries, owns it). Problems are already in the status; nothing is raised."""
    meta = body["metadata"]
    observed = (body.get("status") or {}).get("observedGeneration")
    if meta.get("deletionTimestamp") or observed != meta.get("generation"):
        return
    try:
        reconcile(kube, body)
    except (InvalidSpec, RenderFailed, ChildrenRefused) as exc:
        logger.info("resync of %s: %s", body["metadata"]["name"], exc)
