"""The resources the emulator serves: built-in kinds the operator touches, the project's CRDs,
and optional third-party APIs (KEDA, prometheus-operator, the custom metrics API, the
InferencePool CRD, kopf peering)
that a test switches on to emulate a cluster where they are installed."""

from __future__ import annotations

from .store import ResourceType

CORE: list[ResourceType] = [
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, shortnames=("ns",)),
    ResourceType("", "v1", "pods", "Pod", shortnames=("po",)),
    ResourceType("", "v1", "services", "Service", shortnames=("svc",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", status_subresource=False, shortnames=("cm",)),
    ResourceType("", "v1", "secrets", "Secret", status_subresource=False),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", status_subresource=False),
    ResourceType("rbac.authorization.k8s.io", "v1", "roles", "Role", status_subresource=False),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", status_subresource=False
    ),
    ResourceType("", "v1", "events", "Event", status_subresource=False, shortnames=("ev",)),
    ResourceType("events.k8s.io", "v1", "events", "Event", status_subresource=False),
    ResourceType("apps", "v1", "deployments", "Deployment", scale_subresource=True),
    ResourceType(
        "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", shortnames=("pdb",)
    ),
    ResourceType("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler"),
    ResourceType(
        "prefixserving.io", "v1alpha1", "prefixservings", "PrefixServing", shortnames=("pfx",)
    ),
    ResourceType("prefixserving.io", "v1alpha1", "scalingpolicies", "ScalingPolicy"),
]

KEDA: list[ResourceType] = [
    ResourceType("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject", shortnames=("so",)),
]
# The Gateway API Inference Extension's CRD (router.mode endpointPicker).
INFERENCE_EXTENSION: list[ResourceType] = [
    ResourceType("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"),
]
PROMETHEUS_OPERATOR: list[ResourceType] = [
    ResourceType("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor"),
    ResourceType("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor"),
    ResourceType("monitoring.coreos.com", "v1", "prometheusrules", "PrometheusRule"),
]
# prometheus-adapter registers the custom metrics API; its discovery lists pod metrics.
CUSTOM_METRICS: list[ResourceType] = [
    ResourceType(
        "custom.metrics.k8s.io", "v1beta1", "pods", "MetricValueList", status_subresource=False
    ),
]
KOPF_PEERING: list[ResourceType] = [
    ResourceType("kopf.dev", "v1", "kopfpeerings", "KopfPeering", status_subresource=False),
    ResourceType(
        "kopf.dev",
        "v1",
        "clusterkopfpeerings",
        "ClusterKopfPeering",
        namespaced=False,
        status_subresource=False,
    ),
]
