"""Every example renders, and every rendered object passes the Kubernetes schema checks
(kubernetes-validate --strict for 1.29 and 1.35; KEDA and prometheus-operator kinds against
their upstream CRD schemas)."""

from __future__ import annotations

import pytest

from api_support import KUBE_VERSIONS, assert_all_valid
from prefixserving import constants
from render_examples import REQUIRED, find, rendered, resource_examples


def test_required_examples_exist() -> None:
    assert set(REQUIRED) <= set(resource_examples())


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", resource_examples())
def test_example_children_pass_kubernetes_schemas(name: str, version: str) -> None:
    assert_all_valid(rendered(name), version)


@pytest.mark.parametrize("name", resource_examples())
def test_example_children_have_labels_and_owner(name: str) -> None:
    objects = rendered(name)
    for obj in objects:
        meta = obj["metadata"]
        assert meta["labels"][constants.LABEL_INSTANCE] == name_of(objects)
        assert meta["labels"][constants.LABEL_PART_OF] == constants.PART_OF
        assert meta["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGED_BY
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == constants.KIND and owner["controller"] is True
        assert owner["blockOwnerDeletion"] is True


def name_of(objects: list[dict]) -> str:
    return objects[0]["metadata"]["ownerReferences"][0]["name"]


def test_autoscaled_examples_use_their_backend() -> None:
    keda = rendered("autoscaled-keda")
    hpa = rendered("autoscaled-hpa")
    assert [o["kind"] for o in keda].count("ScaledObject") == 1
    assert "HorizontalPodAutoscaler" not in [o["kind"] for o in keda]
    assert [o["kind"] for o in hpa].count("HorizontalPodAutoscaler") == 1
    assert "ScaledObject" not in [o["kind"] for o in hpa]
    for objects in (keda, hpa):
        assert "replicas" not in find(objects, "Deployment", "engine")["spec"]


def test_unscaled_examples_have_no_autoscaler_and_set_replicas() -> None:
    objects = rendered("minimal")
    assert {o["kind"] for o in objects} == {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
    }
    assert find(objects, "Deployment", "engine")["spec"]["replicas"] == 2
