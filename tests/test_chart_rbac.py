"""The chart's RBAC, as ``helm template`` renders it, grants exactly what the operator's kind
table (``prefixserving.kinds``) says: every kind it renders, reads or writes has its rule with
every verb, and no rule or verb lacks a row. Checked for a cluster-wide install (one ClusterRole)
and a namespaced one (cluster-scoped rules in the ClusterRole, the rest in each Role).

``e2e/test_apiserver_e2e.py`` asks a real API server the same (``kubectl auth can-i`` as the
operator's ServiceAccount, row by row)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import tool
from prefixserving import kinds
from prefixserving.api.validation import parse_resource
from prefixserving.render import render_children
from prefixserving_lab.testing import prefixserving_body

CHART = Path(__file__).resolve().parents[1] / "charts" / "prefixserving-operator"
NAMESPACES = ["llm", "batch"]

pytestmark = pytest.mark.slow  # runs the real helm binary


def template(*args: str) -> list[dict[str, Any]]:
    result = subprocess.run(
        [tool("helm"), "template", "pfx", str(CHART), "--namespace", "prefixserving", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rules_of(role: dict[str, Any]) -> kinds.Rules:
    """``(group, resource) -> verbs`` of a Role or ClusterRole, rules merged."""
    merged: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                merged.setdefault((group, resource), set()).update(rule["verbs"])
    return {key: frozenset(verbs) for key, verbs in merged.items()}


def differences(table: kinds.Rules, chart: kinds.Rules, where: str) -> list[str]:
    """Every way ``chart`` differs from ``table``, as sentences naming the fix."""
    found = []
    for (group, resource), verbs in sorted(table.items()):
        granted = chart.get((group, resource))
        name = f"{resource}.{group}" if group else resource
        if granted is None:
            found.append(f"{where}: no rule for {name}; add verbs {sorted(verbs)} to rbac.yaml")
        elif verbs - granted:
            found.append(f"{where}: {name} lacks verbs {sorted(verbs - granted)}")
        elif granted - verbs:
            found.append(
                f"{where}: {name} grants {sorted(granted - verbs)}, which no row of "
                "prefixserving.kinds needs; remove them or add the use to the table"
            )
    for group, resource in sorted(set(chart) - set(table)):
        found.append(
            f"{where}: rule for {resource}.{group or 'core'} has no row in prefixserving.kinds"
        )
    return found


def roles(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_cluster_wide_install_grants_exactly_the_table() -> None:
    (cluster_role,) = roles(template(), "ClusterRole")
    expected = kinds.chart_rules(cluster_wide=True)
    assert differences(expected.cluster_role, rules_of(cluster_role), "ClusterRole") == []


def test_namespaced_install_grants_exactly_the_table_per_namespace() -> None:
    objects = template("--set", f"watchNamespaces={{{','.join(NAMESPACES)}}}")
    expected = kinds.chart_rules(cluster_wide=False)
    (cluster_role,) = roles(objects, "ClusterRole")
    assert differences(expected.cluster_role, rules_of(cluster_role), "ClusterRole") == []
    namespaced = roles(objects, "Role")
    assert sorted(r["metadata"]["namespace"] for r in namespaced) == sorted(NAMESPACES)
    for role in namespaced:
        where = f"Role in {role['metadata']['namespace']}"
        assert differences(expected.role, rules_of(role), where) == []


def test_the_comparison_names_a_missing_verb_a_missing_rule_and_an_unused_rule() -> None:
    table = kinds.chart_rules(cluster_wide=True).cluster_role
    chart = dict(table)
    chart[("apps", "deployments")] = table[("apps", "deployments")] - {"delete"}
    del chart[("monitoring.coreos.com", "prometheusrules")]
    chart[("", "secrets")] = frozenset({"get"})
    chart[("", "pods")] = table[("", "pods")] | {"watch"}
    assert differences(table, chart, "ClusterRole") == [
        "ClusterRole: pods grants ['watch'], which no row of prefixserving.kinds needs; "
        "remove them or add the use to the table",
        "ClusterRole: deployments.apps lacks verbs ['delete']",
        "ClusterRole: no rule for prometheusrules.monitoring.coreos.com; add verbs "
        "['create', 'delete', 'list', 'patch', 'watch'] to rbac.yaml",
        "ClusterRole: rule for secrets.core has no row in prefixserving.kinds",
    ]


def test_the_warmup_role_grants_only_what_the_operator_holds() -> None:
    """The API server refuses a Role that grants more than its creator holds (the operator has
    no escalate verb), so the rendered warm-up Role must stay within the table."""
    body = prefixserving_body("w", "llm", warmup={"enabled": True, "prompts": [{"prompt": "hi"}]})
    held = kinds.chart_rules(cluster_wide=False).role
    (role,) = [c for c in render_children(parse_resource(body)) if c["kind"] == "Role"]
    for key, verbs in rules_of(role).items():
        assert verbs <= held.get(key, frozenset()), key
