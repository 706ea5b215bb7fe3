"""Template values of the router Deployment and Service, and of the InferencePool when the
router runs as an endpoint picker (``spec.router.mode: endpointPicker``). Pure.

In both modes the router keeps its names (``<name>-router``), labels and HTTP port (metrics,
hot prefixes for warm-up, health), so dashboards, alerts, PromQL, warm-up and the status job
work the same. The picker adds its gRPC port (``constants.PICKER_GRPC_PORT``), which the
InferencePool's ``endpointPickerRef`` names; the InferencePool selects the engine pods on the
engine port.
"""

from __future__ import annotations

from typing import Any

from prefixserving import constants
from prefixserving.api import defaults, names
from prefixserving.api.scaling import EffectiveAutoscaling
from prefixserving.api.types import PrefixServing, RouterSpec
from prefixserving.render.formats import number

PICKER_MODE = "endpointPicker"
# The Service port name gateways (Istio's protocol selection) read as gRPC.
PICKER_PORT_NAME = "grpc-ext-proc"


def no_engine_hold_s(router: RouterSpec, auto: EffectiveAutoscaling) -> int:
    """How long the router holds a request while no engine is Ready: the spec's value, else
    the default when the autoscaler may scale the engines to zero, else 0 (503 at once)."""
    if router.no_engine_hold_seconds is not None:
        return router.no_engine_hold_seconds
    scales_to_zero = auto.enabled and auto.min_replicas == 0
    return defaults.ROUTER_NO_ENGINE_HOLD_S if scales_to_zero else 0


def router_context(resource: PrefixServing, auto: EffectiveAutoscaling) -> dict[str, Any]:
    """Values of the router Deployment and Service (both modes) and of the InferencePool."""
    spec, name, namespace = resource.spec, resource.metadata.name, resource.metadata.namespace
    router = spec.router
    picker = router.endpoint_picker
    args = [
        "--port",
        str(constants.ROUTER_PORT),
        "--dns",
        names.engine_dns(name, namespace),
        "--policy",
        router.algorithm,
        "--load-bound",
        number(router.load_bound),
        "--prefix-blocks",
        str(router.prefix_blocks),
        "--block-chars",
        str(router.block_chars),
        "--model",
        spec.model.served_name,
    ]
    hold_s = no_engine_hold_s(router, auto)
    if hold_s:
        args += ["--no-engine-hold-seconds", str(hold_s)]
    ports = [{"name": "http", "port": constants.ROUTER_PORT}]
    if router.mode == PICKER_MODE:
        args += ["--mode", "endpoint-picker", "--grpc-port", str(constants.PICKER_GRPC_PORT)]
        if not picker.secure_serving:
            args.append("--no-secure-serving")
        if picker.shed_waiting_requests:
            args += ["--shed-waiting-requests", str(picker.shed_waiting_requests)]
        ports.append({"name": PICKER_PORT_NAME, "port": constants.PICKER_GRPC_PORT})
    return {
        "image": router.image,
        "replicas": router.replicas,
        "args": args,
        "ports": ports,
        "resources": {"cpu": router.resources.cpu, "memory": router.resources.memory},
        "drain_s": defaults.ROUTER_DRAIN_S,
        "termination_grace_s": defaults.ROUTER_DRAIN_S
        + spec.engine.termination_grace_period_seconds,
        "inference_pool": {
            "name": names.inference_pool(name),
            "picker_port": constants.PICKER_GRPC_PORT,
            "failure_mode": picker.failure_mode,
        },
    }
