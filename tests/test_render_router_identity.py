"""The router's ``--identity-port``: rendered when the engine pods run the warm-up with
``handover`` (their sidecars then report routing identities), and it names the port the
sidecar listens on. The router's arguments are parsed by the router's own command line."""

from __future__ import annotations

from typing import Any

import pytest

from prefixserving import constants
from prefixserving.api import names
from prefixserving.api.validation import parse_resource
from prefixserving.render import render_children
from router_support import router_settings


def rendered(warmup: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The pod specs of the rendered Deployments, by name."""
    spec: dict[str, Any] = {"model": {"servedName": "m", "source": {"pvc": {"claimName": "x"}}}}
    if warmup is not None:
        spec["warmup"] = warmup
    body = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "chat", "namespace": "llm"},
        "spec": spec,
    }
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in render_children(parse_resource(body))
        if o["kind"] == "Deployment"
    }


def identity_port(pods: dict[str, dict[str, Any]]) -> int | None:
    """The ``--identity-port`` the router runs with (the router's own parser)."""
    (container,) = pods[names.router_deployment("chat")]["containers"]
    return router_settings(container["args"]).identity_port


def test_handover_makes_the_router_ask_the_sidecars_port() -> None:
    pods = rendered({"enabled": True})  # handover is on by default
    (sidecar,) = pods[names.engine_deployment("chat")]["initContainers"]
    (port,) = [p["containerPort"] for p in sidecar["ports"] if p["name"] == "warmup"]
    assert sidecar["args"][sidecar["args"].index("--port") + 1] == str(port)
    assert identity_port(pods) == port


@pytest.mark.parametrize(
    "warmup",
    [None, {"enabled": True, "handover": False}, {"enabled": False, "handover": True}],
    ids=["default", "without-handover", "warmup-off"],
)
def test_without_handover_the_router_ranks_by_address(warmup: dict[str, Any] | None) -> None:
    assert identity_port(rendered(warmup)) is None
