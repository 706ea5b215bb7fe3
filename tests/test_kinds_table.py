"""The kind table (``prefixserving.kinds``) is the one list of child kinds: the CHILDREN rows
name its rows, a template that renders another kind is refused, and the derived views (child
kinds, optional APIs, chart rules) follow from it."""

from __future__ import annotations

import pytest

from prefixserving import constants, kinds
from prefixserving.api.validation import parse_resource
from prefixserving.render import CHILDREN, children
from prefixserving.render.children import Child, render_children
from prefixserving_lab.testing import prefixserving_body


def test_children_rows_name_exactly_the_child_kinds_of_the_table() -> None:
    assert {child.kind for child in CHILDREN} == set(kinds.CHILD_KINDS)
    assert all(kind.child for kind in kinds.CHILD_KINDS)


def test_every_rendered_object_is_the_kind_its_row_names() -> None:
    body = prefixserving_body(
        "all",
        "llm",
        warmup={"enabled": True, "prompts": [{"prompt": "hello"}]},
        monitoring={"serviceMonitor": True, "alerts": {"enabled": True}},
    )
    rendered = render_children(parse_resource(body))
    assert {kinds.kind_of(obj) for obj in rendered} <= set(kinds.CHILD_KINDS)


def test_a_template_rendering_another_kind_than_its_row_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = Child(
        "engine-service.yaml.j2",
        kinds.DEPLOYMENT,
        constants.COMPONENT_ENGINE,
        lambda spec, auto: True,
    )
    monkeypatch.setattr(children, "CHILDREN", (wrong,))
    with pytest.raises(ValueError, match=r"engine-service.yaml.j2 rendered v1 Service, but"):
        render_children(parse_resource(prefixserving_body("x", "llm")))


def test_optional_kinds_are_those_whose_own_api_may_be_missing() -> None:
    optional = {k.kind for k in kinds.KINDS.values() if k.optional}
    assert optional == {"ScaledObject", "ServiceMonitor", "PrometheusRule", "InferencePool"}
    hpa = kinds.HORIZONTAL_POD_AUTOSCALER
    assert hpa.requires is kinds.CUSTOM_METRICS and not hpa.optional  # applied, then reported
    assert "{ref}" in kinds.KEDA.missing


def test_chart_rules_split_cluster_scoped_and_namespaced_rows() -> None:
    cluster_wide = kinds.chart_rules(cluster_wide=True)
    assert cluster_wide.role == {}
    assert ("kopf.dev", "clusterkopfpeerings") in cluster_wide.cluster_role
    assert ("kopf.dev", "kopfpeerings") not in cluster_wide.cluster_role
    namespaced = kinds.chart_rules(cluster_wide=False)
    assert set(namespaced.cluster_role) == {("apiextensions.k8s.io", "customresourcedefinitions")}
    assert ("kopf.dev", "kopfpeerings") in namespaced.role
    assert namespaced.role[(constants.GROUP, f"{constants.PLURAL}/status")] == {"patch"}
    child_rules = {(k.group, k.plural) for k in kinds.CHILD_KINDS}
    assert child_rules <= set(namespaced.role)


def test_kind_paths() -> None:
    assert kinds.SERVICE.path("llm", "x") == "/api/v1/namespaces/llm/services/x"
    assert (
        kinds.PREFIX_SERVING.path("llm", "x", "status")
        == f"/apis/{constants.API_VERSION}/namespaces/llm/{constants.PLURAL}/x/status"
    )
    crd = kinds.KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")]
    assert crd.path("ignored", "y") == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/y"
