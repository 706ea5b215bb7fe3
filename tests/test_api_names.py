"""Child names, selectors and URLs."""

from __future__ import annotations

from prefixserving import constants
from prefixserving.api import names


def test_child_names() -> None:
    assert names.engine_deployment("a") == names.engine_service("a") == "a-engine"
    assert names.router_deployment("a") == names.router_service("a") == "a-router"
    assert names.warmup_configmap("a") == "a-warmup"


def test_selectors_are_subsets_of_labels_and_carry_no_version() -> None:
    for component in (constants.COMPONENT_ENGINE, constants.COMPONENT_ROUTER):
        selector = names.selector("a", component)
        assert selector.items() <= names.labels("a", component).items()
        assert constants.LABEL_VERSION not in selector
    assert names.instance_selector("a").items() <= names.engine_selector("a").items()
    assert names.instance_selector("a").items() <= names.router_selector("a").items()
    assert names.engine_selector("a") != names.router_selector("a")


def test_urls() -> None:
    assert names.engine_dns("a", "ns") == "a-engine.ns.svc.cluster.local:8000"
    assert names.router_url("a", "ns") == "http://a-router.ns.svc.cluster.local:8080"


def test_label_selector_sorts_keys() -> None:
    assert names.label_selector({}) == ""
    assert names.label_selector({"b": "2", "a": "1"}) == "a=1,b=2"
    assert names.label_selector(names.engine_selector("chat")) == (
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=chat,"
        "app.kubernetes.io/name=prefixserving"
    )
