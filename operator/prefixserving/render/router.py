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
from prefixserving.api.types import PrefixServing, PrefixServingSpec, RouterSpec
from prefixserving.render.engine import HF_HOME, MODELS_DIR, ModelVolumes, hub_env
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


def identity_args(spec: PrefixServingSpec) -> list[str]:
    """``--identity-port`` (the warm-up sidecar's port) when the engine pods run the warm-up
    with ``handover``: their sidecars then report each pod's routing identity, which a
    replacing pod inherits from the pod it replaces, and the router ranks by it. Empty
    otherwise (the router ranks every engine by its address)."""
    if not (spec.warmup.enabled and spec.warmup.handover):
        return []
    return ["--identity-port", str(constants.WARMUP_PORT)]


def kv_events_pod(spec: PrefixServingSpec) -> dict[str, Any]:
    """With ``router.kvEvents.enabled``: the router's KV event arguments (the engines' ports,
    block size, tokenizer and its Hub revision), and the environment and volumes that give it
    the model's tokenizer (the model's PVC mounted read-only, or the Hugging Face Hub with a
    cache). Empty lists otherwise."""
    pod: dict[str, Any] = {"args": [], "env": [], "volumes": [], "volume_mounts": []}
    if not spec.router.kv_events.enabled:
        return pod
    volumes = ModelVolumes()
    tokenizer = volumes.source(spec.model.source, f"{MODELS_DIR}/base")
    if spec.model.source.hugging_face is not None:
        volumes.volumes.append({"name": "hf-cache", "emptyDir": {}})
        volumes.mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    pod["args"] = [
        "--kv-events",
        "--kv-events-port",
        str(constants.KV_EVENTS_PORT),
        "--kv-events-replay-port",
        str(constants.KV_EVENTS_REPLAY_PORT),
        "--kv-events-block-size",
        str(spec.engine.block_size),
        "--tokenizer",
        tokenizer,
    ]
    if spec.model.source.hugging_face is not None:
        pod["args"] += ["--tokenizer-revision", spec.model.source.hugging_face.revision]
    pod["env"] = hub_env(spec.model.source)
    pod["volumes"], pod["volume_mounts"] = volumes.volumes, volumes.mounts
    return pod


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
    kv_events = kv_events_pod(spec)
    args += kv_events["args"]
    args += identity_args(spec)
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
        "env": kv_events["env"],
        "volumes": kv_events["volumes"],
        "volume_mounts": kv_events["volume_mounts"],
        "drain_s": defaults.ROUTER_DRAIN_S,
        "termination_grace_s": defaults.ROUTER_DRAIN_S
        + spec.engine.termination_grace_period_seconds,
        "inference_pool": {
            "name": names.inference_pool(name),
            "picker_port": constants.PICKER_GRPC_PORT,
            "failure_mode": picker.failure_mode,
        },
    }
