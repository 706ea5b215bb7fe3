"""spec.router.mode: endpointPicker renders the InferencePool (valid against the upstream CRD,
CEL rules included) and runs the router as its picker; warm-up keeps asking the router
Service; the gateway examples point at what the operator renders."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_support import KUBE_VERSIONS, SHARED_SCHEMAS, CrdValidator, assert_all_valid
from prefixserving import constants
from prefixserving.api import names
from prefixserving.api.validation import SpecError, parse_resource
from prefixserving.render import render_children
from render_examples import EXAMPLES, rendered

BASE: dict[str, Any] = {
    "apiVersion": constants.API_VERSION,
    "kind": constants.KIND,
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        "model": {"servedName": "qwen3-8b", "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B"}}},
        "replicas": 2,
    },
}
GATEWAY_EXAMPLES = EXAMPLES / "gateway"


def render(router: dict[str, Any], **spec: Any) -> dict[str, dict[str, Any]]:
    body = copy.deepcopy(BASE)
    body["spec"]["router"] = router
    body["spec"].update(spec)
    return {
        f"{o['kind']}/{o['metadata']['name']}": o for o in render_children(parse_resource(body))
    }


def router_container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    deployment = objects[f"Deployment/{names.router_deployment('chat')}"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def pool_crd() -> dict[str, Any]:
    path = SHARED_SCHEMAS / "inference.networking.k8s.io_inferencepools.yaml"
    return yaml.safe_load(path.read_text())


def test_proxy_mode_renders_no_pool_and_no_picker_port() -> None:
    objects = render({})
    assert not [k for k in objects if k.startswith("InferencePool/")]
    container = router_container(objects)
    assert "--mode" not in container["args"]
    assert [p["name"] for p in container["ports"]] == ["http"]


def test_picker_mode_renders_a_pool_that_names_the_router_service_and_the_engines() -> None:
    objects = render({"mode": "endpointPicker"})
    pool = objects["InferencePool/chat"]
    engine = objects[f"Deployment/{names.engine_deployment('chat')}"]
    pod_labels = engine["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["spec"]["targetPorts"] == [{"number": constants.ENGINE_PORT}]
    ref = pool["spec"]["endpointPickerRef"]
    service = objects[f"Service/{names.router_service('chat')}"]
    assert ref["name"] == service["metadata"]["name"] and ref["kind"] == "Service"
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    grpc_port = next(p for p in service_ports.values() if p["port"] == ref["port"]["number"])
    container = router_container(objects)
    assert grpc_port["targetPort"] in {p["name"] for p in container["ports"]}
    args = container["args"]
    assert args[args.index("--mode") + 1] == "endpoint-picker"
    assert args[args.index("--grpc-port") + 1] == str(ref["port"]["number"])
    assert "--no-secure-serving" not in args
    assert ref["failureMode"] == "FailOpen"
    assert pool["metadata"]["ownerReferences"][0]["kind"] == constants.KIND


def test_picker_settings_reach_the_pool_and_the_command() -> None:
    objects = render(
        {
            "mode": "endpointPicker",
            "endpointPicker": {
                "failureMode": "FailClose",
                "secureServing": False,
                "shedWaitingRequests": 16,
            },
        }
    )
    assert objects["InferencePool/chat"]["spec"]["endpointPickerRef"]["failureMode"] == (
        "FailClose"
    )
    args = router_container(objects)["args"]
    assert "--no-secure-serving" in args
    assert args[args.index("--shed-waiting-requests") + 1] == "16"


@pytest.mark.parametrize("failure_mode", ["FailOpen", "FailClose"])
def test_the_pool_passes_the_upstream_crd_schema_and_its_cel_rules(failure_mode: str) -> None:
    pool = render({"mode": "endpointPicker", "endpointPicker": {"failureMode": failure_mode}})[
        "InferencePool/chat"
    ]
    assert CrdValidator(pool_crd()).errors(pool) == []


def test_the_upstream_crd_check_catches_a_broken_pool() -> None:
    """The check above can fail: a pool without its picker port breaks the CRD's CEL rule."""
    pool = render({"mode": "endpointPicker"})["InferencePool/chat"]
    del pool["spec"]["endpointPickerRef"]["port"]
    assert any("port is required" in e for e in CrdValidator(pool_crd()).errors(pool))


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_picker_mode_children_pass_kubernetes_schemas(version: str) -> None:
    objects = render(
        {"mode": "endpointPicker"},
        warmup={"enabled": True},
        monitoring={"serviceMonitor": True, "alerts": {"enabled": True}},
    )
    assert_all_valid(list(objects.values()), version)


def test_warm_up_asks_the_router_service_for_hot_prefixes_in_picker_mode() -> None:
    objects = render({"mode": "endpointPicker"}, warmup={"enabled": True})
    engine = objects[f"Deployment/{names.engine_deployment('chat')}"]
    pod = engine["spec"]["template"]["spec"]
    sidecar = next(c for c in pod.get("initContainers", []) if c["name"] == "warmup")
    url = sidecar["args"][sidecar["args"].index("--router-url") + 1]
    assert url == names.router_url("chat", "llm")
    service = objects[f"Service/{names.router_service('chat')}"]
    port = int(url.rsplit(":", 1)[1])
    http = next(p for p in service["spec"]["ports"] if p["port"] == port)
    assert http["name"] == "http"  # the picker's HTTP port, where hot prefixes are served


@pytest.mark.parametrize(
    ("router", "field"),
    [
        ({"mode": "gateway"}, "spec.router.mode"),
        ({"endpointPicker": {"failureMode": "Open"}}, "spec.router.endpointPicker.failureMode"),
        ({"endpointPicker": {"shedWaitingRequests": -1}}, "spec.router.endpointPicker"),
    ],
)
def test_bad_picker_settings_name_the_field(router: dict[str, Any], field: str) -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["router"] = router
    with pytest.raises(SpecError) as error:
        parse_resource(body)
    assert field in str(error.value)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.mark.parametrize("gateway", ["istio", "kgateway", "agentgateway"])
def test_each_gateway_example_routes_to_the_rendered_pool(gateway: str) -> None:
    pool = next(o for o in rendered("endpoint-picker") if o["kind"] == "InferencePool")
    docs = {d["kind"]: d for d in _documents(GATEWAY_EXAMPLES / f"{gateway}.yaml")}
    assert docs["Gateway"]["spec"]["gatewayClassName"] == gateway
    route = docs["HTTPRoute"]
    assert route["metadata"]["namespace"] == pool["metadata"]["namespace"]
    (parent,) = route["spec"]["parentRefs"]
    assert parent["name"] == docs["Gateway"]["metadata"]["name"]
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "chat"}
    ]
    assert pool["metadata"]["name"] == "chat"
    if gateway == "istio":
        rule_tls = docs["DestinationRule"]["spec"]
        namespace = pool["metadata"]["namespace"]
        ref = pool["spec"]["endpointPickerRef"]
        assert rule_tls["host"] == names.service_host(ref["name"], namespace)
        (setting,) = rule_tls["trafficPolicy"]["portLevelSettings"]
        assert setting["port"]["number"] == ref["port"]["number"]
        assert setting["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}


def test_the_llm_d_picker_values_select_the_engines_and_use_defined_plugins() -> None:
    (values,) = _documents(GATEWAY_EXAMPLES / "llm-d-epp-values.yaml")
    engine = next(
        o
        for o in rendered("endpoint-picker")
        if o["kind"] == "Deployment" and o["metadata"]["name"] == names.engine_deployment("chat")
    )
    pod_labels = engine["spec"]["template"]["metadata"]["labels"]
    pool = values["inferencePool"]
    assert pool["modelServers"]["matchLabels"].items() <= pod_labels.items()
    assert pool["targetPortNumber"] == constants.ENGINE_PORT
    extension = values["inferenceExtension"]
    config = yaml.safe_load(extension["pluginsCustomConfig"][extension["pluginsConfigFile"]])
    assert config["kind"] == "EndpointPickerConfig"
    defined = {p.get("name", p["type"]) for p in config["plugins"]}
    used = {p["pluginRef"] for profile in config["schedulingProfiles"] for p in profile["plugins"]}
    sources = {s["pluginRef"] for s in config["data"]["sources"]}
    extractors = {e["pluginRef"] for s in config["data"]["sources"] for e in s["extractors"]}
    assert used | sources | extractors <= defined
