"""Every Kubernetes kind the operator reads or writes, in one table: the one place to add a kind.

A row (:class:`Kind`) says where the kind is served (apiVersion, plural, scope), the verbs the
operator's ServiceAccount needs on it and why, whether it is a rendered child of a
PrefixServing, and the optional API it depends on. Everything else is derived from ``KINDS``:

- rendering: each ``render.children.CHILDREN`` row names the :class:`Kind` its template makes;
- pruning and the drift watch: :data:`CHILD_KINDS` (one kopf ``on.event`` per child kind);
- the optional-API skip: :attr:`Kind.requires` (a child whose own API is not served is skipped,
  one whose dependency is missing is applied and reported);
- RBAC: the chart's ``templates/rbac.yaml`` stays a Helm template, and a test compares its
  ``helm template`` output with :func:`rbac_rules` (a missing rule, a missing verb, or a rule
  with no use in this table fails it);
- docs: ``docs/reference/kinds.md`` (``make docs``).

To add a child kind: add a row here (``child=True``), a template in ``templates/`` and a row
to ``CHILDREN``, the rule to ``charts/prefixserving-operator/templates/rbac.yaml``, then run
``make docs``.

The rows marked "kopf" are what the framework itself needs: the resources it watches, the
Events it posts, the peering objects of active-passive HA. kopf uses no Leases. In a
namespaced install kopf also tries to list Namespaces; the chart does not grant that (kopf
falls back to the namespaces it was given and logs a warning).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prefixserving import constants

# Verbs of server-side apply: it creates the object when missing and patches it otherwise.
APPLY = frozenset({"create", "patch"})
# What the drift watch (kopf lists, then watches) and pruning (list, delete) need on a child.
CHILD_VERBS = APPLY | {"list", "watch", "delete"}


class Install(enum.Enum):
    """Which installs of the chart grant a row: every install, or only one scope of it."""

    ANY = "any"
    CLUSTER_WIDE = "cluster-wide"  # watchNamespaces empty: one ClusterRole
    NAMESPACED = "namespaced"  # watchNamespaces set: one Role per namespace


@dataclass(frozen=True)
class OptionalApi:
    """An API some clusters lack (a CRD or an aggregated API), and what its absence means.

    ``missing`` is the ``Degraded`` message of its absence (``{ref}`` is the child,
    ``Kind/name``; the reason is ``InferencePoolMissing`` for the InferencePool CRD,
    ``ScalerMissing`` for the others); empty when the absence is only listed as skipped in the
    ``Degraded`` message.
    """

    api_version: str
    plural: str
    provider: str
    missing: str = ""


@dataclass(frozen=True)
class Subresource:
    """Verbs on a subresource (``<plural>/<name>``) and why the operator needs them."""

    name: str
    verbs: frozenset[str]
    why: str


@dataclass(frozen=True)
class Kind:
    """One row: where a kind is served, what the operator does with it, and why."""

    api_version: str
    kind: str
    plural: str
    verbs: frozenset[str]
    why: str
    namespaced: bool = True
    child: bool = False
    requires: OptionalApi | None = None
    subresources: tuple[Subresource, ...] = ()
    install: Install = Install.ANY

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def optional(self) -> bool:
        """Whether the kind itself may be missing (its own API is the one it requires)."""
        return self.requires is not None and (self.requires.api_version, self.requires.plural) == (
            self.api_version,
            self.plural,
        )

    def path(self, namespace: str | None, name: str | None = None, subresource: str = "") -> str:
        """The API path of the collection, an object, or an object's subresource."""
        root = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        parts = [root]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


KEDA = OptionalApi(
    "keda.sh/v1alpha1",
    "scaledobjects",
    "KEDA",
    missing=(
        "KEDA is not installed: scaledobjects.keda.sh is not served, so {ref} cannot be "
        "created. Install KEDA (helm install keda kedacore/keda -n keda --create-namespace) or "
        "set autoscaling.backend: hpa."
    ),
)
CUSTOM_METRICS = OptionalApi(
    "custom.metrics.k8s.io/v1beta1",
    "pods",
    "prometheus-adapter",
    missing=(
        "the custom metrics API (custom.metrics.k8s.io/v1beta1) is not served, so the HPA "
        "cannot read vLLM metrics. Install prometheus-adapter with the chart's rules (helm "
        "upgrade <release> prefixserving/prefixserving-operator --set "
        "prometheusAdapterRules.enabled=true) or set autoscaling.backend: keda."
    ),
)
INFERENCE_POOLS = OptionalApi(
    "inference.networking.k8s.io/v1",
    "inferencepools",
    "Gateway API Inference Extension",
    missing=(
        "the InferencePool CRD (inferencepools.inference.networking.k8s.io, v1) is not served, "
        "so {ref} cannot be created and no gateway can reach the endpoint picker. Install it "
        "(kubectl apply -f https://github.com/kubernetes-sigs/gateway-api-inference-extension/"
        "releases/download/v1.6.0/manifests.yaml) or set router.mode: proxy."
    ),
)
SERVICE_MONITORS = OptionalApi("monitoring.coreos.com/v1", "servicemonitors", "prometheus-operator")
PROMETHEUS_RULES = OptionalApi("monitoring.coreos.com/v1", "prometheusrules", "prometheus-operator")

_ROWS: tuple[Kind, ...] = (
    # ---- the operator's own resources
    Kind(
        constants.API_VERSION,
        constants.KIND,
        constants.PLURAL,
        frozenset({"get", "list", "watch", "patch"}),
        "kopf watches them and patches its progress annotations (and removes the finalizer "
        "of earlier operator builds); the operator reads the owner of a drifted child",
        subresources=(
            Subresource("status", frozenset({"patch"}), "conditions, replicas, metrics"),
            Subresource(
                "finalizers",
                frozenset({"update"}),
                "children carry blockOwnerDeletion owner references, which the API server "
                "accepts only from a client that may update the owner's finalizers",
            ),
        ),
    ),
    Kind(
        constants.API_VERSION,
        constants.POLICY_KIND,
        constants.POLICY_PLURAL,
        frozenset({"get", "list", "watch"}),
        "spec.autoscaling.policyRef; a change re-reconciles the resources that reference it",
    ),
    # ---- rendered children
    Kind(
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        CHILD_VERBS,
        "identity of the warm-up sidecar",
        child=True,
    ),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "Role",
        "roles",
        CHILD_VERBS,
        "lets the warm-up sidecar create Events (the operator holds that right itself)",
        child=True,
    ),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "rolebindings",
        CHILD_VERBS,
        "binds the warm-up Role to its ServiceAccount",
        child=True,
    ),
    Kind("v1", "ConfigMap", "configmaps", CHILD_VERBS, "inline warm-up prompts", child=True),
    Kind("v1", "Service", "services", CHILD_VERBS, "engine and router Services", child=True),
    Kind(
        "apps/v1",
        "Deployment",
        "deployments",
        CHILD_VERBS | {"get"},
        "engine and router Deployments; read back for the status",
        child=True,
    ),
    Kind(
        "policy/v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        CHILD_VERBS,
        "engine and router disruption budgets",
        child=True,
    ),
    Kind(
        "autoscaling/v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        CHILD_VERBS,
        "autoscaling.backend: hpa (reads vLLM metrics through the custom metrics API)",
        child=True,
        requires=CUSTOM_METRICS,
    ),
    Kind(
        KEDA.api_version,
        "ScaledObject",
        KEDA.plural,
        CHILD_VERBS,
        "autoscaling.backend: keda",
        child=True,
        requires=KEDA,
    ),
    Kind(
        INFERENCE_POOLS.api_version,
        "InferencePool",
        INFERENCE_POOLS.plural,
        CHILD_VERBS,
        "router.mode: endpointPicker (the pool of engines a gateway asks the picker about)",
        child=True,
        requires=INFERENCE_POOLS,
    ),
    Kind(
        SERVICE_MONITORS.api_version,
        "ServiceMonitor",
        SERVICE_MONITORS.plural,
        CHILD_VERBS,
        "monitoring.serviceMonitor",
        child=True,
        requires=SERVICE_MONITORS,
    ),
    Kind(
        PROMETHEUS_RULES.api_version,
        "PrometheusRule",
        PROMETHEUS_RULES.plural,
        CHILD_VERBS,
        "monitoring.alerts",
        child=True,
        requires=PROMETHEUS_RULES,
    ),
    # ---- read or written, not children
    Kind(
        "v1",
        "Pod",
        "pods",
        frozenset({"list", "patch"}),
        "engine pods' readiness under warm-up; patch only so that the warm-up Role may grant "
        "the rolling-update handover (the operator never patches pods)",
    ),
    Kind(
        "v1",
        "Event",
        "events",
        frozenset({"create"}),
        "Events of the operator and of kopf; also what the warm-up Role grants",
    ),
    # ---- kopf
    Kind(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        frozenset({"list", "watch"}),
        "kopf: notices CRDs installed later (KEDA, prometheus-operator) and starts watching",
        namespaced=False,
    ),
    Kind(
        "kopf.dev/v1",
        "ClusterKopfPeering",
        "clusterkopfpeerings",
        frozenset({"get", "list", "watch", "patch"}),
        "kopf: active-passive peering of a cluster-wide operator (keep-alives in status); the "
        "periodic jobs read it to run only on the active replica",
        namespaced=False,
        install=Install.CLUSTER_WIDE,
    ),
    Kind(
        "kopf.dev/v1",
        "KopfPeering",
        "kopfpeerings",
        frozenset({"get", "list", "watch", "patch"}),
        "kopf: active-passive peering of a namespaced operator (keep-alives in status); the "
        "periodic jobs read it to run only on the active replica",
        install=Install.NAMESPACED,
    ),
)

KINDS: dict[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in _ROWS}
# Kinds the renderer may produce: pruned when a spec stops rendering them, watched for drift.
CHILD_KINDS: tuple[Kind, ...] = tuple(k for k in _ROWS if k.child)

PREFIX_SERVING = KINDS[(constants.API_VERSION, constants.KIND)]
SCALING_POLICY = KINDS[(constants.API_VERSION, constants.POLICY_KIND)]
SERVICE_ACCOUNT = KINDS[("v1", "ServiceAccount")]
ROLE = KINDS[("rbac.authorization.k8s.io/v1", "Role")]
ROLE_BINDING = KINDS[("rbac.authorization.k8s.io/v1", "RoleBinding")]
CONFIG_MAP = KINDS[("v1", "ConfigMap")]
SERVICE = KINDS[("v1", "Service")]
DEPLOYMENT = KINDS[("apps/v1", "Deployment")]
POD_DISRUPTION_BUDGET = KINDS[("policy/v1", "PodDisruptionBudget")]
HORIZONTAL_POD_AUTOSCALER = KINDS[("autoscaling/v2", "HorizontalPodAutoscaler")]
SCALED_OBJECT = KINDS[(KEDA.api_version, "ScaledObject")]
INFERENCE_POOL = KINDS[(INFERENCE_POOLS.api_version, "InferencePool")]
SERVICE_MONITOR = KINDS[(SERVICE_MONITORS.api_version, "ServiceMonitor")]
PROMETHEUS_RULE = KINDS[(PROMETHEUS_RULES.api_version, "PrometheusRule")]
POD = KINDS[("v1", "Pod")]
EVENT = KINDS[("v1", "Event")]


def kind_of(obj: Mapping[str, Any]) -> Kind:
    """The :class:`Kind` of an object dict; KeyError for kinds the operator never handles."""
    return KINDS[(obj["apiVersion"], obj["kind"])]


Rules = dict[tuple[str, str], frozenset[str]]


def rbac_rules(rows: Iterable[Kind]) -> Rules:
    """``(API group, resource) -> verbs`` for ``rows``, subresources as ``plural/name``."""
    rules: Rules = {}
    for row in rows:
        rules[(row.group, row.plural)] = row.verbs
        for sub in row.subresources:
            rules[(row.group, f"{row.plural}/{sub.name}")] = sub.verbs
    return rules


@dataclass(frozen=True)
class RoleRules:
    """What one install of the chart must grant: the ClusterRole, and each namespace's Role."""

    cluster_role: Rules
    role: Rules = field(default_factory=dict)


def chart_rules(cluster_wide: bool) -> RoleRules:
    """The rules the chart's RBAC must hold for a cluster-wide install (everything in the
    ClusterRole) or a namespaced one (cluster-scoped kinds in the ClusterRole, the namespaced
    ones in a Role per watched namespace)."""
    install = Install.CLUSTER_WIDE if cluster_wide else Install.NAMESPACED
    rows = [k for k in _ROWS if k.install in (Install.ANY, install)]
    if cluster_wide:
        return RoleRules(cluster_role=rbac_rules(rows))
    return RoleRules(
        cluster_role=rbac_rules(k for k in rows if not k.namespaced),
        role=rbac_rules(k for k in rows if k.namespaced),
    )


def reference_page() -> str:
    """``docs/reference/kinds.md``: the table as operators read it."""
    lines = [
        "# Kinds the operator reads and writes",
        "",
        "<!-- Generated by `make docs` from prefixserving.kinds. Do not edit. -->",
        "",
        "One table in the code (`operator/prefixserving/kinds.py`) drives rendering, pruning, "
        "the drift watch, the optional-API checks and this page; the chart's "
        "`templates/rbac.yaml` must grant exactly these verbs (a test compares them). "
        "Check an install with "
        "`kubectl auth can-i --as=system:serviceaccount:<namespace>:<service account> "
        "<verb> <resource>`.",
        "",
        "| apiVersion | kind | resource | scope | verbs | child | needs | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in _ROWS:
        scope = "namespaced" if row.namespaced else "cluster"
        if row.install is not Install.ANY:
            scope += f" ({row.install.value} installs)"
        needs = f"{row.requires.provider} (`{row.requires.api_version}`)" if row.requires else ""
        entries = [(row.plural, row.verbs, row.why)] + [
            (f"{row.plural}/{sub.name}", sub.verbs, sub.why) for sub in row.subresources
        ]
        for resource, verbs, why in entries:
            lines.append(
                f"| `{row.api_version}` | {row.kind} | `{resource}` | {scope} "
                f"| {', '.join(sorted(verbs))} | {'yes' if row.child else ''} | {needs} | {why} |"
            )
    return "\n".join(lines) + "\n"
