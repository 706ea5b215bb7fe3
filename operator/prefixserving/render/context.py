"""The values the templates lay out, computed from a validated spec.

Everything that needs a decision (argument lists, resources, volumes, probe thresholds,
queries) is computed in Python, one module per part (``engine``, ``warmup``, ``autoscaling``,
``router``; the alert rules in ``autoscaling.alerts``); the templates only place these
values. ``build_context`` is pure; its cost is linear in the spec's size.
"""

from __future__ import annotations

from typing import Any

from prefixserving import constants
from prefixserving.api import names
from prefixserving.api.scaling import EffectiveAutoscaling
from prefixserving.api.types import PrefixServing
from prefixserving.autoscaling import alerts
from prefixserving.render.autoscaling import autoscaling_context
from prefixserving.render.engine import engine_context
from prefixserving.render.router import router_context
from prefixserving.render.warmup import warmup_context


def build_context(resource: PrefixServing, auto: EffectiveAutoscaling) -> dict[str, Any]:
    """Every value the templates use, for one PrefixServing and its effective autoscaling."""
    spec, name, namespace = resource.spec, resource.metadata.name, resource.metadata.namespace
    return {
        "namespace": namespace,
        "names": {
            "engine_deployment": names.engine_deployment(name),
            "engine_service": names.engine_service(name),
            "engine_pdb": names.engine_pdb(name),
            "router_deployment": names.router_deployment(name),
            "router_service": names.router_service(name),
            "router_pdb": names.router_pdb(name),
            "autoscaler": names.autoscaler(name),
            "warmup_configmap": names.warmup_configmap(name),
            "engine_service_account": names.engine_service_account(name),
            "warmup_role": names.warmup_role(name),
            "service_monitor": names.service_monitor(name),
            "prometheus_rule": names.prometheus_rule(name),
        },
        "selectors": {
            "engine": names.engine_selector(name),
            "router": names.router_selector(name),
            "instance": names.instance_selector(name),
        },
        "ports": {
            "engine": constants.ENGINE_PORT,
            "router": constants.ROUTER_PORT,
        },
        "engine": engine_context(spec, auto),
        "warmup": warmup_context(resource),
        "router": router_context(resource, auto),
        "nonroot_uid": constants.IMAGE_UID,
        "image_pull_secrets": [ref.model_dump() for ref in spec.image_pull_secrets],
        "autoscaling": autoscaling_context(resource, auto),
        "monitoring": {
            "labels": spec.monitoring.labels,
            # Engine Service ports scraped: the engine, and the warm-up sidecar's metrics.
            "ports": ["http", "warmup"] if spec.warmup.enabled else ["http"],
            "alert_groups": alerts.resource_groups(resource, auto),
        },
    }
