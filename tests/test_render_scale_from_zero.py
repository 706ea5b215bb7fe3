"""Scale from zero in the rendered objects: ``minReplicas: 0`` is valid with KEDA, renders a
ScaledObject that KEDA activates on the routers' held requests, and a router that holds
requests while no engine is Ready; an HPA backend with 0 is refused with the field named.

What this misses: KEDA's and the HPA's behaviour in a cluster; ``e2e/`` covers that where a
cluster is available, ``tests/test_router_hold.py`` the router's side for real.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixserving.api import defaults
from prefixserving.api.validation import SpecError, parse_resource
from prefixserving.autoscaling import promql
from prefixserving.render import render_children


def body(autoscaling: dict[str, Any], router: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"servedName": "m", "source": {"pvc": {"claimName": "models"}}},
        "autoscaling": {"enabled": True, **autoscaling},
    }
    if router is not None:
        spec["router"] = router
    return {
        "apiVersion": "prefixserving.io/v1alpha1",
        "kind": "PrefixServing",
        "metadata": {"name": "chat", "namespace": "llm"},
        "spec": spec,
    }


def rendered(kind: str, component: str | None = None, **spec: Any) -> dict[str, Any]:
    objects = render_children(parse_resource(body(**spec)))
    (found,) = [
        o
        for o in objects
        if o["kind"] == kind and (component is None or o["metadata"]["name"].endswith(component))
    ]
    return found


def router_args(**spec: Any) -> list[str]:
    deployment = rendered("Deployment", "-router", **spec)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def test_min_replicas_zero_activates_on_the_routers_held_requests() -> None:
    scaled = rendered("ScaledObject", autoscaling={"minReplicas": 0})["spec"]
    assert scaled["minReplicaCount"] == 0
    triggers = {t["name"]: t for t in scaled["triggers"]}
    held = triggers["held-requests"]
    assert held["metadata"]["query"] == promql.held_requests_total("llm", "chat")
    assert held["metadata"]["activationThreshold"] == "0"
    assert held["metricType"] == "AverageValue"
    # The engine triggers are still there for scaling beyond one replica.
    assert {"kv-cache-usage", "queue-depth", "backlog-seconds"} <= set(triggers)


def test_min_replicas_zero_makes_the_router_hold_by_default() -> None:
    args = router_args(autoscaling={"minReplicas": 0})
    at = args.index("--no-engine-hold-seconds")
    assert args[at + 1] == str(defaults.ROUTER_NO_ENGINE_HOLD_S)


def test_without_scale_to_zero_nothing_is_held_or_added() -> None:
    assert "--no-engine-hold-seconds" not in router_args(autoscaling={"minReplicas": 1})
    scaled = rendered("ScaledObject", autoscaling={"minReplicas": 1})["spec"]
    assert "held-requests" not in {t["name"] for t in scaled["triggers"]}
    assert all("activationThreshold" not in t["metadata"] for t in scaled["triggers"])


@pytest.mark.parametrize(("hold", "expected"), [(30, "30"), (0, None)])
def test_the_spec_sets_the_hold(hold: int, expected: str | None) -> None:
    args = router_args(autoscaling={"minReplicas": 0}, router={"noEngineHoldSeconds": hold})
    if expected is None:
        assert "--no-engine-hold-seconds" not in args
    else:
        assert args[args.index("--no-engine-hold-seconds") + 1] == expected


def test_min_replicas_zero_with_the_hpa_backend_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        parse_resource(body({"minReplicas": 0, "backend": "hpa"}))
    message = str(caught.value)
    assert "spec.autoscaling.minReplicas" in message and "keda" in message
