"""``render_children``: a validated PrefixServing -> its child Kubernetes objects.

Algorithm: resolve the effective autoscaling block, build one template context
(``render/context.py``), then render each entry of ``CHILDREN`` whose ``when`` predicate
holds, in table order, check that it made the kind its row names, and stamp every object with
the namespace, the ``app.kubernetes.io/*`` labels and an owner reference to the PrefixServing
(controller, blockOwnerDeletion), so garbage collection removes the children. Pure and
deterministic: same input, same list, same order.

To add a child: a template in ``templates/`` and a row in ``CHILDREN`` naming its kind, which
must be a ``child=True`` row of the kind table (``prefixserving.kinds``; pruning, the drift
watch, RBAC and the docs follow from that table).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prefixserving import constants, kinds
from prefixserving.api import names
from prefixserving.api.scaling import EffectiveAutoscaling, effective_autoscaling
from prefixserving.api.types import PrefixServing, PrefixServingSpec, ScalingPolicySpec
from prefixserving.api.validation import SpecError, check_rules
from prefixserving.render.context import build_context
from prefixserving.render.environment import render_template
from prefixserving.render.router import PICKER_MODE

# Owner uid used when a resource has none yet (``prefixserving render`` of a file, a GitOps
# preview); the operator always renders objects read from the API server, which have one.
PREVIEW_UID = "00000000-0000-0000-0000-000000000000"

# Whether a child is rendered for a spec and its effective autoscaling.
ChildPredicate = Callable[[PrefixServingSpec, EffectiveAutoscaling], bool]


def _always(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return True


def _warmup(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return spec.warmup.enabled


def _inline_warmup(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return spec.warmup.enabled and spec.warmup.config_map_ref is None


def _backend(backend: str) -> ChildPredicate:
    return lambda spec, auto: auto.enabled and auto.backend == backend


def _endpoint_picker(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return spec.router.mode == PICKER_MODE


def _service_monitor(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return spec.monitoring.service_monitor


def _alerts(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> bool:
    return spec.monitoring.alerts.enabled


@dataclass(frozen=True)
class Child:
    """One row of the child table: a template, the kind it renders, its component label, and
    when it applies."""

    template: str
    kind: kinds.Kind
    component: str
    when: ChildPredicate


CHILDREN: tuple[Child, ...] = (
    Child("warmup-serviceaccount.yaml.j2", kinds.SERVICE_ACCOUNT, names.COMPONENT_WARMUP, _warmup),
    Child("warmup-role.yaml.j2", kinds.ROLE, names.COMPONENT_WARMUP, _warmup),
    Child("warmup-rolebinding.yaml.j2", kinds.ROLE_BINDING, names.COMPONENT_WARMUP, _warmup),
    Child("warmup-configmap.yaml.j2", kinds.CONFIG_MAP, names.COMPONENT_WARMUP, _inline_warmup),
    Child("engine-service.yaml.j2", kinds.SERVICE, constants.COMPONENT_ENGINE, _always),
    Child("engine-deployment.yaml.j2", kinds.DEPLOYMENT, constants.COMPONENT_ENGINE, _always),
    Child("engine-pdb.yaml.j2", kinds.POD_DISRUPTION_BUDGET, constants.COMPONENT_ENGINE, _always),
    Child("router-service.yaml.j2", kinds.SERVICE, constants.COMPONENT_ROUTER, _always),
    Child("router-deployment.yaml.j2", kinds.DEPLOYMENT, constants.COMPONENT_ROUTER, _always),
    Child("router-pdb.yaml.j2", kinds.POD_DISRUPTION_BUDGET, constants.COMPONENT_ROUTER, _always),
    Child(
        "inferencepool.yaml.j2", kinds.INFERENCE_POOL, constants.COMPONENT_ENGINE, _endpoint_picker
    ),
    Child(
        "hpa.yaml.j2", kinds.HORIZONTAL_POD_AUTOSCALER, names.COMPONENT_AUTOSCALER, _backend("hpa")
    ),
    Child(
        "scaledobject.yaml.j2", kinds.SCALED_OBJECT, names.COMPONENT_AUTOSCALER, _backend("keda")
    ),
    Child(
        "servicemonitor.yaml.j2",
        kinds.SERVICE_MONITOR,
        names.COMPONENT_MONITORING,
        _service_monitor,
    ),
    Child("prometheusrule.yaml.j2", kinds.PROMETHEUS_RULE, names.COMPONENT_MONITORING, _alerts),
)


def owner_reference(resource: PrefixServing) -> dict[str, Any]:
    """Owner reference to ``resource`` that every child carries."""
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "name": resource.metadata.name,
        "uid": resource.metadata.uid or PREVIEW_UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def render_children(
    resource: PrefixServing, policy: ScalingPolicySpec | None = None
) -> list[dict[str, Any]]:
    """The child objects of ``resource`` (with ``policy``, the ScalingPolicy its policyRef names).

    Raises SpecError when a cross-field rule fails (so an object built without
    ``parse_resource`` is never rendered either).
    """
    problems = check_rules(resource)
    if policy is not None:
        problems += check_rules(policy, "policy")
    if problems:
        raise SpecError(problems)
    auto = effective_autoscaling(resource.spec, policy)
    context = build_context(resource, auto)
    name, namespace = resource.metadata.name, resource.metadata.namespace
    owner = owner_reference(resource)
    children = []
    for child in CHILDREN:
        if not child.when(resource.spec, auto):
            continue
        obj = render_template(child.template, context)
        if (obj.get("apiVersion"), obj.get("kind")) != (child.kind.api_version, child.kind.kind):
            raise ValueError(
                f"{child.template} rendered {obj.get('apiVersion')} {obj.get('kind')}, but its "
                f"CHILDREN row names {child.kind.api_version} {child.kind.kind}"
            )
        metadata = obj.setdefault("metadata", {})
        metadata["namespace"] = namespace
        metadata["labels"] = {**metadata.get("labels", {}), **names.labels(name, child.component)}
        metadata["ownerReferences"] = [owner]
        children.append(obj)
    return children
