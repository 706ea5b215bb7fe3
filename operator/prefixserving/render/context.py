"""The values the templates lay out, computed from a validated spec.

Everything that needs a decision (argument lists, resources, volumes, probe thresholds,
queries) is computed here in Python; the templates only place these values. ``build_context``
is pure; its cost is linear in the spec's size.
"""

from __future__ import annotations

import json
import math
from typing import Any

from prefixserving import constants
from prefixserving.api import defaults, names
from prefixserving.api.defaults import EffectiveAutoscaling, ScalingBehavior
from prefixserving.api.types import ModelSource, PrefixServing, PrefixServingSpec
from prefixserving.autoscaling import alerts, promql

MODELS_DIR = "/models"
HF_HOME = "/var/cache/huggingface"
# The warm-up sidecar reads its prompts from this file (mounted from a ConfigMap).
WARMUP_DIR, WARMUP_FILE = constants.WARMUP_PROMPTS_FILE.rsplit("/", 1)
PROBE_PERIOD_S = 10
PROGRESS_MARGIN_S = 600
WARMUP_CPU = "100m"
WARMUP_MEMORY = "256Mi"
# Where in-cluster clients (the warm-up sidecar's Event) look for the service account token.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_S = 3600
# Non-root user of the project's slim images (router, warm-up, operator).
NONROOT_UID = 65532


def quantity(value: float) -> str:
    """A Kubernetes quantity for a metric target: 5 -> '5', 0.8 -> '800m'."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def number(value: float) -> str:
    """Shortest text of a number for a command-line flag or a KEDA threshold."""
    return f"{value:g}"


class _Volumes:
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


def engine_args(spec: PrefixServingSpec, volumes: _Volumes) -> list[str]:
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
    if spec.scheduler.policy == "peek":
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
    return args + list(spec.engine.extra_args)


def engine_env(spec: PrefixServingSpec) -> list[dict[str, Any]]:
    """Environment of the engine: Hub settings, PEEK tunables, then the spec's env."""
    env: list[dict[str, Any]] = []
    hf = spec.model.source.hugging_face
    if hf is not None or any(a.source.hugging_face for a in spec.model.adapters):
        env.append({"name": "HF_HOME", "value": HF_HOME})
    if hf is not None and hf.token_secret_ref is not None:
        ref = hf.token_secret_ref
        env.append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
        )
    if spec.scheduler.policy == "peek":
        s = spec.scheduler
        env += [
            {"name": constants.ENV_MAX_SIBLING_WAIT_MS, "value": str(s.max_sibling_wait_ms)},
            {"name": constants.ENV_PIN_BUDGET_FRACTION, "value": number(s.pin_budget_fraction)},
            {"name": constants.ENV_LANES, "value": str(s.lanes)},
        ]
    return env + [e.model_dump(by_alias=True, exclude_none=True) for e in spec.engine.env]


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


def _warmup(resource: PrefixServing) -> dict[str, Any] | None:
    spec, name = resource.spec, resource.metadata.name
    warmup = spec.warmup
    if not warmup.enabled:
        return None
    ref = warmup.config_map_ref
    prompts = [p.model_dump(by_alias=True, exclude_none=True) for p in warmup.prompts]
    return {
        "image": warmup.image,
        "args": [
            "--engine-url",
            f"http://127.0.0.1:{constants.ENGINE_PORT}",
            "--prompts-file",
            constants.WARMUP_PROMPTS_FILE,
            "--router-url",
            names.router_url(name, resource.metadata.namespace),
            "--hot-prefixes",
            str(warmup.hot_prefixes),
            "--timeout-s",
            str(warmup.timeout_seconds),
            "--self-url",
            f"http://$(POD_IP):{constants.ENGINE_PORT}",
            "--port",
            str(constants.WARMUP_PORT),
            "--model",
            spec.model.served_name,
        ],
        "env": [
            {"name": env, "valueFrom": {"fieldRef": {"fieldPath": path}}}
            for env, path in (
                (constants.ENV_POD_IP, "status.podIP"),
                (constants.ENV_POD_NAME, "metadata.name"),
                (constants.ENV_POD_NAMESPACE, "metadata.namespace"),
                (constants.ENV_POD_UID, "metadata.uid"),
            )
        ],
        "service_account_dir": SERVICE_ACCOUNT_DIR,
        "token_expiration_s": TOKEN_EXPIRATION_S,
        "port": constants.WARMUP_PORT,
        "inline": ref is None,
        "configmap": ref.name if ref is not None else names.warmup_configmap(name),
        "configmap_key": ref.key if ref is not None else WARMUP_FILE,
        "prompts_json": json.dumps(prompts, indent=2, sort_keys=True, ensure_ascii=False),
        "mount_path": WARMUP_DIR,
        "file": WARMUP_FILE,
        "resources": {"cpu": WARMUP_CPU, "memory": WARMUP_MEMORY},
    }


def _behavior(rules: ScalingBehavior, select: str) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_s,
        "selectPolicy": select,
        "policies": [
            {"type": "Pods", "value": rules.pods, "periodSeconds": rules.period_s},
            {"type": "Percent", "value": rules.percent, "periodSeconds": rules.period_s},
        ],
    }


def _autoscaling(resource: PrefixServing, auto: EffectiveAutoscaling) -> dict[str, Any]:
    name, namespace = resource.metadata.name, resource.metadata.namespace
    # Scale up by the larger allowed step, down by the smaller one.
    behavior = {
        "scaleUp": _behavior(auto.scale_up, "Max"),
        "scaleDown": _behavior(auto.scale_down, "Min"),
    }
    signals = []
    if "kvCacheUsage" in auto.signals:
        signals.append(
            {
                "trigger": "kv-cache-usage",
                "query": promql.kv_cache_usage(namespace, name),
                "metric_type": "Value",
                "adapter_metric": promql.ADAPTER_METRIC_KV_CACHE_USAGE,
                "target": auto.target_kv_cache_usage,
            }
        )
    if "queueDepth" in auto.signals:
        signals.append(
            {
                "trigger": "queue-depth",
                "query": promql.queue_depth_total(namespace, name),
                "metric_type": "AverageValue",
                "adapter_metric": promql.ADAPTER_METRIC_REQUESTS_WAITING,
                "target": auto.target_queue_depth,
            }
        )
    for signal in signals:
        signal["threshold"] = number(signal["target"])
        signal["average_value"] = quantity(signal["target"])
    return {
        "enabled": auto.enabled,
        "backend": auto.backend,
        "min_replicas": auto.min_replicas,
        "max_replicas": auto.max_replicas,
        "prometheus_url": auto.prometheus_url,
        "polling_interval_s": auto.polling_interval_s,
        "cooldown_period_s": auto.cooldown_period_s,
        "behavior": behavior,
        "signals": signals,
    }


def _replicas(spec: PrefixServingSpec) -> int:
    return spec.replicas if spec.replicas is not None else defaults.REPLICAS


def build_context(resource: PrefixServing, auto: EffectiveAutoscaling) -> dict[str, Any]:
    """Every value the templates use, for one PrefixServing and its effective autoscaling."""
    spec, name, namespace = resource.spec, resource.metadata.name, resource.metadata.namespace
    engine, placement, router = spec.engine, spec.placement, spec.router
    volumes = _Volumes()
    args = engine_args(spec, volumes)
    if any(a.source.hugging_face for a in spec.model.adapters) or spec.model.source.hugging_face:
        volumes.volumes.append({"name": "hf-cache", "emptyDir": {}})
        volumes.mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    return {
        "name": name,
        "namespace": namespace,
        "names": {
            "engine_deployment": names.engine_deployment(name),
            "engine_service": names.engine_service(name),
            "engine_pdb": names.engine_pdb(name),
            "router_deployment": names.router_deployment(name),
            "router_service": names.router_service(name),
            "router_pdb": names.router_pdb(name),
            "autoscaler": names.autoscaler(name),
            "warmup_configmap": names.warmup_configmap(name),
            "engine_service_account": names.engine_service_account(name),
            "warmup_role": names.warmup_role(name),
            "service_monitor": names.service_monitor(name),
            "prometheus_rule": names.prometheus_rule(name),
        },
        "selectors": {
            "engine": names.engine_selector(name),
            "router": names.router_selector(name),
            "instance": names.instance_selector(name),
        },
        "ports": {
            "engine": constants.ENGINE_PORT,
            "router": constants.ROUTER_PORT,
        },
        "engine": {
            "image": engine.image,
            "pull_policy": engine.image_pull_policy,
            "args": args,
            "env": engine_env(spec),
            "resources": engine_resources(spec),
            "replicas": None if auto.enabled else _replicas(spec),
            "max_surge": engine.max_surge,
            # A rollout waits for model load and warm-up before Kubernetes calls it stuck.
            "progress_deadline_s": engine.startup_timeout_seconds
            + (spec.warmup.timeout_seconds if spec.warmup.enabled else 0)
            + PROGRESS_MARGIN_S,
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
        },
        "warmup": _warmup(resource),
        "router": {
            "image": router.image,
            "replicas": router.replicas,
            "args": [
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
            ],
            "resources": {"cpu": router.resources.cpu, "memory": router.resources.memory},
        },
        "nonroot_uid": NONROOT_UID,
        "autoscaling": _autoscaling(resource, auto),
        "monitoring": {
            "labels": spec.monitoring.labels,
            # Engine Service ports scraped: the engine, and the warm-up sidecar's metrics.
            "ports": ["http", "warmup"] if spec.warmup.enabled else ["http"],
            "alerts": spec.monitoring.alerts.model_dump(by_alias=True),
            "alert_groups": alerts.resource_groups(resource, auto),
        },
        "promql": {
            "engine_selector": promql.engine_selector(namespace, name),
            "router_selector": promql.router_selector(namespace, name),
            "kv_cache_usage": promql.kv_cache_usage(namespace, name),
            "queue_depth_per_replica": promql.queue_depth_per_replica(namespace, name),
            "hit_rate": promql.prefix_cache_hit_rate(namespace, name),
        },
    }
