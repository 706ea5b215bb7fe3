"""spec.router.kvEvents.enabled renders the engines' KV event flags and ports and the routers'
subscription (the engines' ports, block size and tokenizer at the engines' revision, with what
loads the tokenizer);
off by default, nothing of it renders. The router's arguments are parsed by the router's own
command line, and the engine's event endpoints are the ones the router connects to."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from prefixserving import constants
from prefixserving.api import names
from prefixserving.api.validation import parse_resource
from prefixserving.render import render_children
from prefixserving.router.cli import RouterSettings, build_router
from router_support import router_settings

BASE: dict[str, Any] = {
    "apiVersion": constants.API_VERSION,
    "kind": constants.KIND,
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        "model": {"servedName": "qwen3-8b", "source": {"huggingFace": {"repo": "Qwen/Qwen3-8B"}}},
        "replicas": 2,
    },
}
PVC_SOURCE = {"pvc": {"claimName": "models", "subPath": "qwen3-8b"}}


def render(kv_events: dict[str, Any] | None, source: dict[str, Any] | None = None) -> dict:
    body = copy.deepcopy(BASE)
    if kv_events is not None:
        body["spec"]["router"] = {"kvEvents": kv_events}
    if source is not None:
        body["spec"]["model"]["source"] = source
    return {
        f"{o['kind']}/{o['metadata']['name']}": o for o in render_children(parse_resource(body))
    }


def pod(objects: dict, deployment: str) -> dict[str, Any]:
    return objects[f"Deployment/{deployment}"]["spec"]["template"]["spec"]


def container(objects: dict, deployment: str, name: str) -> dict[str, Any]:
    (found,) = [c for c in pod(objects, deployment)["containers"] if c["name"] == name]
    return found


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_off_by_default_nothing_renders() -> None:
    objects = render(None)
    engine = container(objects, names.engine_deployment("chat"), "engine")
    assert not any("kv-events" in arg or "hash-algo" in arg for arg in engine["args"])
    assert [p["name"] for p in engine["ports"]] == ["http"]
    routers = container(objects, names.router_deployment("chat"), "router")
    assert not router_settings(routers["args"]).kv_events
    assert "env" not in routers and "volumes" not in pod(objects, names.router_deployment("chat"))


def test_enabled_engines_publish_where_routers_subscribe() -> None:
    objects = render({"enabled": True})
    engine = container(objects, names.engine_deployment("chat"), "engine")
    config = json.loads(flag_value(engine["args"], "--kv-events-config"))
    assert config["enable_kv_cache_events"] and config["publisher"] == "zmq"
    assert flag_value(engine["args"], "--prefix-caching-hash-algo") == "sha256_cbor"
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}

    routers = container(objects, names.router_deployment("chat"), "router")
    settings = router_settings(routers["args"])
    assert settings.kv_events
    assert config["endpoint"] == f"tcp://*:{settings.kv_events_port}"
    assert config["replay_endpoint"] == f"tcp://*:{settings.kv_events_replay_port}"
    assert config["topic"] == constants.KV_EVENTS_TOPIC
    assert ports["kv-events"] == settings.kv_events_port
    assert ports["kv-replay"] == settings.kv_events_replay_port
    assert settings.kv_events_block_size == int(flag_value(engine["args"], "--block-size"))
    assert settings.tokenizer == "Qwen/Qwen3-8B"
    # The engine loads the model and its tokenizer at --revision; the router the same files.
    assert settings.tokenizer_revision == flag_value(engine["args"], "--revision") == "main"
    assert settings.model == "qwen3-8b"
    # The Hub cache is writable (the root filesystem is read-only).
    env = {e["name"]: e.get("value") for e in routers["env"]}
    (mount,) = routers["volumeMounts"]
    assert mount["mountPath"] == env["HF_HOME"]


def test_a_pvc_model_is_mounted_read_only_for_the_tokenizer() -> None:
    objects = render({"enabled": True}, PVC_SOURCE)
    router_pod = pod(objects, names.router_deployment("chat"))
    routers = container(objects, names.router_deployment("chat"), "router")
    (mount,) = routers["volumeMounts"]
    assert mount["readOnly"] and mount["subPath"] == "qwen3-8b"
    settings = router_settings(routers["args"])
    assert settings.tokenizer == mount["mountPath"] and settings.tokenizer_revision is None
    (volume,) = router_pod["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert "env" not in routers


def test_the_router_refuses_kv_events_without_a_tokenizer() -> None:
    settings = RouterSettings(backends=("http://127.0.0.1:8000",), kv_events=True)
    with pytest.raises(ValueError, match="--kv-events needs --tokenizer"):
        build_router(settings)
