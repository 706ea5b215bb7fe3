"""Template values of the engine Deployment: the ``vllm serve`` command line, environment,
resources, volumes for model and adapter sources, probes and rollout settings. Pure; cost is
linear in the spec's size."""

from __future__ import annotations

import math
from typing import Any

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.api.scaling import EffectiveAutoscaling
from prefixserving.api.types import ModelSource, PrefixServingSpec
from prefixserving.render.formats import number
from prefixserving.router.kv_events import engine_flags

MODELS_DIR = "/models"
HF_HOME = "/var/cache/huggingface"
PROBE_PERIOD_S = 10
# Slack on top of model load (and warm-up) before Kubernetes calls a rollout stuck.
PROGRESS_MARGIN_S = 600


class ModelVolumes:
    """Volumes and mounts of the engine pod's model and adapter sources."""

    def __init__(self) -> None:
        self.volumes: list[dict[str, Any]] = []
        self.mounts: list[dict[str, Any]] = []
        self._claims: dict[str, str] = {}

    def pvc(self, claim: str, sub_path: str, mount_path: str) -> str:
        """Mount ``sub_path`` of ``claim`` read-only at ``mount_path``; returns the path."""
        volume = self._claims.get(claim)
        if volume is None:
            volume = f"claim-{len(self._claims)}"
            self._claims[claim] = volume
            self.volumes.append(
                {"name": volume, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
            )
        mount: dict[str, Any] = {"name": volume, "mountPath": mount_path, "readOnly": True}
        if sub_path:
            mount["subPath"] = sub_path
        self.mounts.append(mount)
        return mount_path

    def source(self, source: ModelSource, mount_path: str) -> str:
        """Path or Hub repo id vLLM loads ``source`` from."""
        if source.pvc is not None:
            return self.pvc(source.pvc.claim_name, source.pvc.sub_path, mount_path)
        assert source.hugging_face is not None  # validation: exactly one source
        return source.hugging_face.repo


def engine_args(spec: PrefixServingSpec, volumes: ModelVolumes) -> list[str]:
    """Arguments of ``vllm serve``: the model, the operator-owned flags, then extraArgs."""
    model, engine = spec.model, spec.engine
    args = [volumes.source(model.source, f"{MODELS_DIR}/base")]
    if model.source.hugging_face is not None:
        args += ["--revision", model.source.hugging_face.revision]
    args += [
        "--served-model-name",
        model.served_name,
        "--port",
        str(constants.ENGINE_PORT),
        "--tensor-parallel-size",
        str(engine.tensor_parallel_size),
        "--gpu-memory-utilization",
        number(engine.gpu_memory_utilization),
        "--block-size",
        str(engine.block_size),
        "--enable-prefix-caching",
    ]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    if engine.async_scheduling is not None:
        args.append("--async-scheduling" if engine.async_scheduling else "--no-async-scheduling")
    if spec.scheduler.policy == "peek":
        # One class for both bases: it runs on AsyncScheduler when the engine schedules
        # asynchronously (engine/vllm.py), so no rendering rule can pick the wrong one.
        args += ["--scheduler-cls", constants.PEEK_SCHEDULER_CLS]
    if model.adapters:
        modules = [
            f"{a.name}={volumes.source(a.source, f'{MODELS_DIR}/adapters/{a.name}')}"
            for a in model.adapters
        ]
        max_loras = model.max_loras if model.max_loras is not None else len(model.adapters)
        args += ["--enable-lora", "--lora-modules", *modules, "--max-loras", str(max_loras)]
    if spec.placement.numa == "aligned":
        args.append("--numa-bind")
    if spec.router.kv_events.enabled:
        args += engine_flags.engine_args()
    return args + list(spec.engine.extra_args)


def _hf_token(ref: Any) -> dict[str, Any]:
    return {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def hub_env(source: ModelSource) -> list[dict[str, Any]]:
    """``HF_HOME`` and ``HF_TOKEN`` of a container that loads ``source`` from the Hub (none for
    a PVC source)."""
    hf = source.hugging_face
    if hf is None:
        return []
    env = [{"name": "HF_HOME", "value": HF_HOME}]
    if hf.token_secret_ref is not None:
        env.append(_hf_token(hf.token_secret_ref))
    return env


def engine_env(spec: PrefixServingSpec) -> list[dict[str, Any]]:
    """Environment of the engine: Hub settings, PEEK tunables, then the spec's env."""
    env: list[dict[str, Any]] = []
    hf = spec.model.source.hugging_face
    if hf is not None or any(a.source.hugging_face for a in spec.model.adapters):
        env.append({"name": "HF_HOME", "value": HF_HOME})
    if hf is not None and hf.token_secret_ref is not None:
        env.append(_hf_token(hf.token_secret_ref))
    if spec.scheduler.policy == "peek":
        s = spec.scheduler
        env += [
            {"name": constants.ENV_MAX_SIBLING_WAIT_MS, "value": str(s.max_sibling_wait_ms)},
            {"name": constants.ENV_PIN_BUDGET_FRACTION, "value": number(s.pin_budget_fraction)},
            {"name": constants.ENV_LANES, "value": "true" if s.lanes else "false"},
            {"name": constants.ENV_MAX_OVERTAKES, "value": str(s.max_overtakes)},
        ]
        # Only when it differs from the engine's default (the spec's default): an operator
        # upgrade that added the variable to every pod template would roll every running engine.
        if s.decode_reserve_blocks != defaults.DECODE_RESERVE_BLOCKS:
            env.append(
                {"name": constants.ENV_DECODE_RESERVE_BLOCKS, "value": str(s.decode_reserve_blocks)}
            )
    return env + [e.model_dump(by_alias=True, exclude_none=True) for e in spec.engine.env]


def engine_ports(spec: PrefixServingSpec) -> list[dict[str, Any]]:
    """Container ports: the OpenAI API, plus the KV event publisher and replay ports."""
    ports = [{"name": "http", "containerPort": constants.ENGINE_PORT}]
    if spec.router.kv_events.enabled:
        ports += [
            {"name": "kv-events", "containerPort": constants.KV_EVENTS_PORT},
            {"name": "kv-replay", "containerPort": constants.KV_EVENTS_REPLAY_PORT},
        ]
    return ports


def engine_resources(spec: PrefixServingSpec) -> dict[str, Any]:
    """Requests and limits; ``numa: aligned`` makes them equal (Guaranteed QoS)."""
    engine = spec.engine
    gpus = str(engine.tensor_parallel_size)
    requests = {
        "cpu": engine.resources.cpu,
        "memory": engine.resources.memory,
        engine.gpu_resource_name: gpus,
    }
    limits = {"memory": engine.resources.memory, engine.gpu_resource_name: gpus}
    if spec.placement.numa == "aligned":
        limits = {"cpu": engine.resources.cpu, **limits}
    return {"requests": requests, "limits": limits}


def engine_context(spec: PrefixServingSpec, auto: EffectiveAutoscaling) -> dict[str, Any]:
    """Every value of the engine Deployment template."""
    engine, placement = spec.engine, spec.placement
    volumes = ModelVolumes()
    args = engine_args(spec, volumes)
    if any(a.source.hugging_face for a in spec.model.adapters) or spec.model.source.hugging_face:
        volumes.volumes.append({"name": "hf-cache", "emptyDir": {}})
        volumes.mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    replicas = spec.replicas if spec.replicas is not None else defaults.REPLICAS
    warmup_s = spec.warmup.timeout_seconds if spec.warmup.enabled else 0
    return {
        "image": engine.image,
        "pull_policy": engine.image_pull_policy,
        # Prometheus scrape annotations (the kubernetes-pods job) win over the spec's.
        "pod_annotations": engine.pod_annotations
        | {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(constants.ENGINE_PORT),
            "prometheus.io/path": "/metrics",
        },
        "args": args,
        "ports": engine_ports(spec),
        "env": engine_env(spec),
        "resources": engine_resources(spec),
        # Unset under an autoscaler, so the operator (or Argo CD) never fights it.
        "replicas": None if auto.enabled else replicas,
        "max_surge": engine.max_surge,
        "progress_deadline_s": engine.startup_timeout_seconds + warmup_s + PROGRESS_MARGIN_S,
        "startup_failure_threshold": math.ceil(engine.startup_timeout_seconds / PROBE_PERIOD_S),
        "probe_period_s": PROBE_PERIOD_S,
        "drain_s": engine.drain_seconds,
        "termination_grace_s": engine.drain_seconds + engine.termination_grace_period_seconds,
        "volumes": volumes.volumes,
        "volume_mounts": volumes.mounts,
        "shm_size": placement.shm.size_limit,
        "host_ipc": placement.ipc == "host",
        "node_selector": placement.node_selector,
        "tolerations": placement.tolerations,
        "affinity": placement.affinity,
        "topology_spread_constraints": placement.topology_spread_constraints,
        "priority_class": placement.priority_class_name,
    }
