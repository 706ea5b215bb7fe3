"""The Helm chart: ``helm lint --strict``, ``helm template`` output that passes the Kubernetes
schemas, values.schema.json enforcement, RBAC without wildcards (that it grants exactly the
operator's kind table: ``test_chart_rbac.py``), and operator arguments the
``prefixserving operator`` command accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_support import KUBE_VERSIONS, assert_all_valid, crd_schemas
from conftest import tool
from prefixserving import constants
from prefixserving.render.router import PICKER_PORT_NAME
from render_examples import rendered, resource_examples

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixserving-operator"

pytestmark = pytest.mark.slow  # runs the real helm binary

VARIANTS: dict[str, list[str]] = {
    "defaults": [],
    "namespaced-ha": [
        "--set",
        "replicas=2",
        "--set",
        "watchNamespaces={llm,batch}",
        "--set",
        "prometheusUrl=http://prometheus-operated.monitoring.svc:9090",
    ],
    "cluster-ha-monitored": [
        "--set",
        "replicas=3",
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "serviceMonitor.labels.release=kube-prometheus-stack",
        "--set",
        "logFormat=text",
    ],
    "observability": [
        "--set",
        "prometheusRule.enabled=true",
        "--set",
        "prometheusAdapterRules.enabled=true",
        "--set",
        "grafanaDashboard.enabled=true",
    ],
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def template(variant: str) -> list[dict[str, Any]]:
    result = helm("template", "pfx", str(CHART), "--namespace", "prefixserving", *VARIANTS[variant])
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered_variants() -> dict[str, list[dict[str, Any]]]:
    return {variant: template(variant) for variant in VARIANTS}


def test_helm_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_template_output_passes_kubernetes_schemas(
    rendered_variants: dict[str, list[dict]], variant: str, version: str
) -> None:
    assert_all_valid(rendered_variants[variant], version, extra=crd_schemas(CHART / "crds"))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_operator_deployment_is_hardened_and_probed(rendered_variants: dict) -> None:
    objects = rendered_variants["defaults"]
    container = operator_container(objects)
    assert container["image"] == f"{constants.IMAGE_REGISTRY}/operator:{constants.PROJECT_VERSION}"
    assert container["command"] == ["prefixserving", "operator"]
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (port,) = container["ports"]
    assert port["containerPort"] == constants.OPERATOR_HEALTH_PORT and probe["port"] == port["name"]


def test_chart_version_is_the_project_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == constants.PROJECT_VERSION


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_operator_command_accepts_the_chart_arguments(
    rendered_variants: dict, variant: str
) -> None:
    from prefixserving.controller.cli import operator

    args = operator_container(rendered_variants[variant])["args"]
    with operator.make_context("operator", list(args)) as ctx:
        params = ctx.params
    if variant == "namespaced-ha":
        assert params["namespaces"] == ("llm", "batch")
        assert params["peering"] == "prefixserving-operator"
    if variant == "defaults":
        assert params["all_namespaces"] and params["peering"] is None
        assert params["log_format"] == "json"


def test_disruption_budget_only_with_several_replicas(rendered_variants: dict) -> None:
    assert not by_kind(rendered_variants["defaults"], "PodDisruptionBudget")
    (pdb,) = by_kind(rendered_variants["namespaced-ha"], "PodDisruptionBudget")
    (deployment,) = by_kind(rendered_variants["namespaced-ha"], "Deployment")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]


def test_peering_objects_only_with_several_replicas(rendered_variants: dict) -> None:
    assert not by_kind(rendered_variants["defaults"], "ClusterKopfPeering")
    assert len(by_kind(rendered_variants["cluster-ha-monitored"], "ClusterKopfPeering")) == 1
    namespaced = by_kind(rendered_variants["namespaced-ha"], "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in namespaced) == ["batch", "llm"]


@pytest.mark.parametrize("variant", ["namespaced-ha", "cluster-ha-monitored"])
def test_replicas_get_distinct_peering_priorities(rendered_variants: dict, variant: str) -> None:
    """kopf pauses every peer that shares a priority, so the chart must not give the replicas
    one: no --priority (each takes its start time, see controller/settings.py), and the pod
    name as kopf's identity in the peering object (POD_ID)."""
    from prefixserving.controller.cli import operator

    objects = rendered_variants[variant]
    (deployment,) = by_kind(objects, "Deployment")
    assert deployment["spec"]["replicas"] > 1
    container = operator_container(objects)
    with operator.make_context("operator", list(container["args"])) as ctx:
        assert ctx.params["peering"] == "prefixserving-operator"
        assert ctx.params["peering_priority"] is None
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    peerings = by_kind(objects, "ClusterKopfPeering") + by_kind(objects, "KopfPeering")
    assert {p["metadata"]["name"] for p in peerings} == {"prefixserving-operator"}
    assert "env" not in operator_container(rendered_variants["defaults"])


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_has_no_wildcards_and_no_secrets(rendered_variants: dict) -> None:
    for objects in rendered_variants.values():
        for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
            for (group, resource), verbs in _rules(role).items():
                assert "*" not in verbs and resource != "*" and group != "*"
                assert resource != "secrets"
                assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}


def test_fleet_service_monitor_selects_the_children_services(rendered_variants: dict) -> None:
    (monitor,) = by_kind(rendered_variants["cluster-ha-monitored"], "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [o for name in resource_examples() for o in rendered(name) if o["kind"] == "Service"]
    assert services
    assert any(PICKER_PORT_NAME in _port_names(service) for service in services)
    for service in services:
        assert selector.items() <= service["metadata"]["labels"].items()
        ports = {e["port"] for e in monitor["spec"]["endpoints"]}
        # Every port that serves /metrics is scraped; the picker's gRPC port serves none (its
        # metrics are on the router's HTTP port).
        assert _port_names(service) - {PICKER_PORT_NAME} <= ports
        assert PICKER_PORT_NAME not in ports


def _port_names(service: dict[str, Any]) -> set[str]:
    return {port["name"] for port in service["spec"]["ports"]}


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("replicas=0", "/replicas"),
        ("logFormat=xml", "/logFormat"),
        ("watchNamespaces[0]=Bad_Name", "/watchNamespaces/0"),
        ("prometheusUrl=prometheus:9090", "/prometheusUrl"),
        ("unknownKey=1", "unknownKey"),
    ],
)
def test_values_schema_refuses_bad_values(setting: str, message: str) -> None:
    result = helm("template", "pfx", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert message in result.stderr


def test_chart_crds_include_the_kopf_peering_kinds() -> None:
    schemas = crd_schemas(CHART / "crds")
    assert ("kopf.dev/v1", "ClusterKopfPeering") in schemas
    assert ("kopf.dev/v1", "KopfPeering") in schemas
    assert (constants.API_VERSION, constants.KIND) in schemas
