"""Names, labels, selectors and URLs derived from a PrefixServing's name and namespace.

Every child object's name comes from here, so the renderer, the operator (which reads the
children's state) and the PromQL (``autoscaling/promql.py`` matches ``<name>-engine-...`` pods)
agree. All functions are pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from prefixserving import constants

COMPONENT_WARMUP = "warmup"
COMPONENT_AUTOSCALER = "autoscaler"
COMPONENT_MONITORING = "monitoring"


def engine_deployment(name: str) -> str:
    """Engine Deployment: ``<name>-engine`` (its pods are ``<name>-engine-<hash>-<hash>``)."""
    return f"{name}-engine"


def engine_service(name: str) -> str:
    """Headless Service of the engine pods, which the router resolves: ``<name>-engine``."""
    return f"{name}-engine"


def router_deployment(name: str) -> str:
    """Router Deployment: ``<name>-router``."""
    return f"{name}-router"


def router_service(name: str) -> str:
    """Router Service, the endpoint clients use: ``<name>-router``."""
    return f"{name}-router"


def engine_pdb(name: str) -> str:
    """PodDisruptionBudget of the engines."""
    return f"{name}-engine"


def router_pdb(name: str) -> str:
    """PodDisruptionBudget of the router."""
    return f"{name}-router"


def autoscaler(name: str) -> str:
    """HPA or KEDA ScaledObject scaling the engine Deployment (KEDA names its HPA keda-hpa-...)."""
    return f"{name}-engine"


def inference_pool(name: str) -> str:
    """InferencePool of the engines (router.mode endpointPicker), the backendRef of a gateway's
    HTTPRoute: ``<name>``."""
    return name


def engine_service_account(name: str) -> str:
    """ServiceAccount of the engine pods (only with warm-up: its sidecar posts Events)."""
    return f"{name}-engine"


def warmup_role(name: str) -> str:
    """Role (and RoleBinding) that lets the warm-up sidecar create Events."""
    return f"{name}-warmup"


def warmup_configmap(name: str) -> str:
    """ConfigMap with the inline warm-up prompts."""
    return f"{name}-warmup"


def service_monitor(name: str) -> str:
    """ServiceMonitor of the engines and the router."""
    return name


def prometheus_rule(name: str) -> str:
    """PrometheusRule with the resource's alerts."""
    return name


def selector(name: str, component: str) -> dict[str, str]:
    """Labels that select one component's pods of one PrefixServing (immutable: no version)."""
    return {
        constants.LABEL_NAME: constants.PART_OF,
        constants.LABEL_INSTANCE: name,
        constants.LABEL_COMPONENT: component,
    }


def engine_selector(name: str) -> dict[str, str]:
    """Selector of the engine pods."""
    return selector(name, constants.COMPONENT_ENGINE)


def router_selector(name: str) -> dict[str, str]:
    """Selector of the router pods."""
    return selector(name, constants.COMPONENT_ROUTER)


def instance_selector(name: str) -> dict[str, str]:
    """Selector of every object of one PrefixServing (engine and router Services alike)."""
    return {constants.LABEL_NAME: constants.PART_OF, constants.LABEL_INSTANCE: name}


def label_selector(labels: Mapping[str, str]) -> str:
    """A label selector string matching every label of ``labels``: ``k=v`` pairs, keys sorted,
    joined by ``,`` (as ``labelSelector`` queries and ``kubectl -l`` take it)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def labels(name: str, component: str) -> dict[str, str]:
    """The ``app.kubernetes.io/*`` labels every child carries."""
    return selector(name, component) | {
        constants.LABEL_PART_OF: constants.PART_OF,
        constants.LABEL_MANAGED_BY: constants.MANAGED_BY,
        constants.LABEL_VERSION: constants.PROJECT_VERSION,
    }


def service_host(service: str, namespace: str) -> str:
    """Cluster DNS name of a Service."""
    return f"{service}.{namespace}.svc.cluster.local"


def engine_dns(name: str, namespace: str) -> str:
    """``host:port`` the router resolves to find every ready engine pod."""
    return f"{service_host(engine_service(name), namespace)}:{constants.ENGINE_PORT}"


def router_url(name: str, namespace: str) -> str:
    """URL of the router, for clients and the warm-up sidecar (status.routerEndpoint)."""
    return f"http://{service_host(router_service(name), namespace)}:{constants.ROUTER_PORT}"
