"""Property tests: any combination of spec features renders objects that pass the Kubernetes
schemas and keep the invariants the operator relies on."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_support import CrdValidator, assert_all_valid
from prefixserving import constants
from prefixserving.api import crd
from prefixserving.api.validation import parse_resource
from prefixserving.render import render_children
from prefixserving.render.formats import number, quantity

BASE: dict[str, Any] = {
    "apiVersion": "prefixserving.io/v1alpha1",
    "kind": "PrefixServing",
    "metadata": {"name": "prop", "namespace": "ns", "uid": "u-1"},
    "spec": {"model": {"servedName": "m", "source": {"pvc": {"claimName": "w", "subPath": "m"}}}},
}

adapters = st.lists(st.sampled_from(["a", "b", "c"]), unique=True, max_size=3).map(
    lambda names: [{"name": n, "source": {"huggingFace": {"repo": f"o/{n}"}}} for n in names]
)

specs = st.fixed_dictionaries(
    {
        "engine": st.fixed_dictionaries(
            {
                "tensorParallelSize": st.integers(1, 8),
                "blockSize": st.sampled_from([16, 32, 64, 128]),
                "gpuMemoryUtilization": st.floats(0.1, 1.0),
                "maxSurge": st.integers(1, 3),
                "resources": st.fixed_dictionaries(
                    {"cpu": st.integers(1, 64).map(str), "memory": st.just("256Gi")}
                ),
            }
        ),
        "scheduler": st.fixed_dictionaries({"policy": st.sampled_from(["peek", "fcfs"])}),
        "placement": st.fixed_dictionaries(
            {
                "ipc": st.sampled_from(["isolated", "host"]),
                "numa": st.sampled_from(["none", "aligned"]),
            }
        ),
        "router": st.fixed_dictionaries(
            {
                "algorithm": st.sampled_from(
                    ["prefix-affinity", "two-choice", "round-robin", "least-loaded"]
                ),
                "loadBound": st.floats(1.0, 4.0),
            }
        ),
        "autoscaling": st.fixed_dictionaries(
            {
                "enabled": st.booleans(),
                "backend": st.sampled_from(["keda", "hpa"]),
                "signals": st.sampled_from(
                    [["kvCacheUsage"], ["queueDepth"], ["kvCacheUsage", "queueDepth"]]
                ),
                "targets": st.fixed_dictionaries({"kvCacheUsage": st.floats(0.05, 1.0)}),
            }
        ),
        "warmup": st.fixed_dictionaries(
            {"enabled": st.booleans(), "hotPrefixes": st.integers(0, 100)}
        ),
        "monitoring": st.fixed_dictionaries(
            {
                "serviceMonitor": st.booleans(),
                "alerts": st.fixed_dictionaries({"enabled": st.booleans()}),
            }
        ),
        "adapters": adapters,
    }
)


VALIDATOR = CrdValidator(crd.prefixserving_crd())


def body_of(spec: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    spec = dict(spec)
    body["spec"]["model"]["adapters"] = spec.pop("adapters")
    body["spec"].update(spec)
    if not spec["autoscaling"]["enabled"]:
        body["spec"]["replicas"] = 2
    return body


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs)
def test_any_feature_combination_renders_valid_objects(spec: dict[str, Any]) -> None:
    body = body_of(spec)
    assert VALIDATOR.errors(body) == []
    objects = render_children(parse_resource(body))
    assert_all_valid(objects, "1.29")
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), "two children with the same kind and name"
    for obj in objects:
        assert obj["metadata"]["labels"][constants.LABEL_INSTANCE] == "prop"
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    (engine,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "prop-engine"
    ]
    autoscaled = spec["autoscaling"]["enabled"]
    assert ("replicas" in engine["spec"]) is not autoscaled
    scalers = {o["kind"] for o in objects} & {"HorizontalPodAutoscaler", "ScaledObject"}
    assert len(scalers) == int(autoscaled)
    assert render_children(parse_resource(body)) == objects


@given(st.floats(0.001, 1000.0))
def test_quantity_and_number_round_trip(value: float) -> None:
    text = quantity(value)
    parsed = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    assert abs(parsed - value) <= 0.0005 + 1e-9
    assert float(number(value)) == float(f"{value:g}")
