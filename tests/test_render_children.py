"""What render_children produces for each spec feature: engine flags, placement, warm-up
sidecar, LoRA, router, autoscalers, monitoring; determinism and ownership."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from api_support import KUBE_VERSIONS, assert_all_valid
from prefixserving import constants
from prefixserving.api import defaults, names
from prefixserving.api.validation import parse_resource, parse_scaling_policy
from prefixserving.autoscaling import promql
from prefixserving.render import CHILDREN, render_children
from render_examples import find, load, rendered

BASE: dict[str, Any] = {
    "apiVersion": "prefixserving.io/v1alpha1",
    "kind": "PrefixServing",
    "metadata": {"name": "chat", "namespace": "llm", "uid": "1234-abcd"},
    "spec": {
        "model": {"servedName": "chat-model", "source": {"huggingFace": {"repo": "org/model"}}},
    },
}


def render(spec_patch: dict[str, Any], policy: dict[str, Any] | None = None) -> list[dict]:
    body = copy.deepcopy(BASE)
    body["spec"].update(spec_patch)
    policy_spec = None
    if policy is not None:
        policy_body = {"kind": "ScalingPolicy", "metadata": {"name": "p"}, "spec": policy}
        policy_spec = parse_scaling_policy(policy_body).spec
    return render_children(parse_resource(body), policy_spec)


def engine_pod(objects: list[dict]) -> dict[str, Any]:
    return find(objects, "Deployment", "engine")["spec"]["template"]["spec"]


def engine_container(objects: list[dict]) -> dict[str, Any]:
    (container,) = engine_pod(objects)["containers"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_rendering_is_deterministic_and_in_table_order() -> None:
    spec = {"autoscaling": {"enabled": True}, "warmup": {"enabled": True}}
    first, second = render(spec), render(spec)
    assert first == second
    order = [c.template for c in CHILDREN]
    kinds = [o["kind"] for o in first]
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "ScaledObject",
    ]
    assert order.index("scaledobject.yaml.j2") > order.index("engine-deployment.yaml.j2")


def test_owner_reference_comes_from_the_resource_metadata() -> None:
    for obj in render({}):
        assert obj["metadata"]["namespace"] == "llm"
        assert obj["metadata"]["ownerReferences"] == [
            {
                "apiVersion": constants.API_VERSION,
                "kind": constants.KIND,
                "name": "chat",
                "uid": "1234-abcd",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]


def test_engine_runs_vllm_with_the_operator_owned_flags_and_peek() -> None:
    spec = {
        "engine": {
            "tensorParallelSize": 2,
            "gpuMemoryUtilization": 0.85,
            "blockSize": 32,
            "extraArgs": ["--max-num-seqs", "64"],
        },
        "model": {
            "servedName": "chat-model",
            "source": {"huggingFace": {"repo": "org/model", "revision": "v2"}},
            "maxModelLen": 8192,
        },
        "scheduler": {"maxSiblingWaitMs": 75, "pinBudgetFraction": 0.2, "lanes": False},
    }
    container = engine_container(render(spec))
    assert container["command"] == ["vllm", "serve"]
    assert container["args"] == [
        "org/model",
        "--revision",
        "v2",
        "--served-model-name",
        "chat-model",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.85",
        "--block-size",
        "32",
        "--enable-prefix-caching",
        "--max-model-len",
        "8192",
        "--scheduler-cls",
        constants.PEEK_SCHEDULER_CLS,
        "--max-num-seqs",
        "64",
    ]
    env = env_of(container)
    assert env[constants.ENV_MAX_SIBLING_WAIT_MS] == "75"
    assert env[constants.ENV_PIN_BUDGET_FRACTION] == "0.2"
    assert env[constants.ENV_LANES] == "false"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert constants.ENV_DECODE_RESERVE_BLOCKS not in env  # default: the engine's own


@pytest.mark.parametrize("blocks", [0, 2])
def test_a_decode_reserve_reaches_the_engine_and_the_engine_reads_it(blocks: int) -> None:
    """Rendered only when it differs from the default (adding it to every template would roll
    every engine on an operator upgrade); the engine reads the rendered value."""
    from prefixserving.peek.settings import PeekSettings

    env = env_of(engine_container(render({"scheduler": {"decodeReserveBlocks": blocks}})))
    assert env[constants.ENV_DECODE_RESERVE_BLOCKS] == str(blocks)
    assert PeekSettings.from_env(env).decode_reserve_blocks == blocks


def test_fcfs_scheduler_has_no_peek_flag_or_env() -> None:
    container = engine_container(render({"scheduler": {"policy": "fcfs"}}))
    assert "--scheduler-cls" not in container["args"]
    assert not any(name.startswith("PREFIXSERVING_") for name in env_of(container))


def test_engine_pod_has_shm_probes_drain_and_scrape_annotations() -> None:
    objects = render({"placement": {"shm": {"sizeLimit": "24Gi"}}, "engine": {"drainSeconds": 30}})
    deployment = find(objects, "Deployment", "engine")
    pod = engine_pod(objects)
    container = engine_container(objects)
    (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "24Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert "hostIPC" not in pod
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "30"]
    assert pod["terminationGracePeriodSeconds"] == 30 + 120
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(constants.ENGINE_PORT)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # A rollout is not "stuck" while a new pod loads the model (default 1800 s).
    assert deployment["spec"]["progressDeadlineSeconds"] > 1800


def test_router_pod_drains_before_it_stops_and_outlives_the_streams_it_proxies() -> None:
    """A terminating router keeps accepting while Services and gateways drop it (preStop), then
    finishes its in-flight requests (uvicorn's graceful shutdown) within the engines' grace: a
    router stopped at once fails the requests sent before its endpoints update."""
    objects = render({"engine": {"terminationGracePeriodSeconds": 300}})
    pod = find(objects, "Deployment", "router")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "sleep",
        str(defaults.ROUTER_DRAIN_S),
    ]
    assert pod["terminationGracePeriodSeconds"] == defaults.ROUTER_DRAIN_S + 300


def test_engine_pod_names_match_the_promql_pod_regex() -> None:
    """The scalers select pods by name: the Deployment's pods must match that regex."""
    import re

    deployment = find(render({}), "Deployment", "engine")
    pod_name = f"{deployment['metadata']['name']}-7d9c5b6f4-x2x7k"
    assert re.fullmatch(promql.engine_pod_regex("chat"), pod_name)
    assert not re.fullmatch(promql.engine_pod_regex("chat"), "chat-engine-x-engine-7d9c5-x2x7k")


def test_pull_secrets_reach_every_pod_and_annotations_keep_scraping() -> None:
    objects = render(
        {
            "imagePullSecrets": [{"name": "registry"}],
            "engine": {"podAnnotations": {"sidecar.istio.io/inject": "false"}},
            "warmup": {"enabled": True},
        }
    )
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["imagePullSecrets"] == [{"name": "registry"}]
    annotations = find(objects, "Deployment", "engine")["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert annotations["sidecar.istio.io/inject"] == "false"
    assert annotations["prometheus.io/scrape"] == "true"
    assert "imagePullSecrets" not in engine_pod(render({}))


def test_ipc_host_only_on_request() -> None:
    assert engine_pod(render({"placement": {"ipc": "host"}}))["hostIPC"] is True


def test_numa_aligned_gives_guaranteed_qos_and_numa_bind() -> None:
    objects = render(
        {
            "placement": {"numa": "aligned"},
            "engine": {"resources": {"cpu": "16", "memory": "128Gi"}},
            "warmup": {"enabled": True},
        }
    )
    pod = engine_pod(objects)
    assert "--numa-bind" in engine_container(objects)["args"]
    for container in pod["containers"] + pod["initContainers"]:
        requests, limits = container["resources"]["requests"], container["resources"]["limits"]
        for resource in ("cpu", "memory"):
            assert requests[resource] == limits[resource], (container["name"], resource)
    assert engine_container(objects)["resources"]["limits"]["cpu"] == "16"


def test_numa_none_leaves_cpu_unlimited() -> None:
    container = engine_container(render({}))
    assert "cpu" not in container["resources"]["limits"]
    assert "--numa-bind" not in container["args"]


def test_placement_fields_reach_the_pod() -> None:
    placement = {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        "affinity": {"nodeAffinity": {}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        ],
        "priorityClassName": "inference",
    }
    pod = engine_pod(render({"placement": placement}))
    assert pod["nodeSelector"] == {"gpu": "h100"}
    assert pod["tolerations"] == placement["tolerations"]
    assert pod["affinity"] == {"nodeAffinity": {}}
    assert pod["topologySpreadConstraints"] == placement["topologySpreadConstraints"]
    assert pod["priorityClassName"] == "inference"


def test_pvc_model_and_lora_adapters() -> None:
    objects = rendered("lora-adapters")
    container = engine_container(objects)
    args = container["args"]
    assert args[0] == "/models/base"
    i = args.index("--lora-modules")
    assert args[i + 1 : i + 4] == [
        "sql-lora=/models/adapters/sql-lora",
        "legal-lora=/models/adapters/legal-lora",
        "medical-lora=example-org/llama-3.1-8b-medical-lora",
    ]
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"
    volumes = {v["name"]: v for v in engine_pod(objects)["volumes"]}
    claims = sorted(
        v["persistentVolumeClaim"]["claimName"]
        for v in volumes.values()
        if "persistentVolumeClaim" in v
    )
    assert claims == ["adapters", "model-weights"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models/base"]["subPath"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert mounts["/models/adapters/sql-lora"]["subPath"] == "sql"
    assert all(m["readOnly"] for path, m in mounts.items() if path.startswith("/models"))


def test_hugging_face_token_comes_from_the_secret() -> None:
    resource, _ = load("autoscaled-keda")
    container = engine_container(rendered("autoscaled-keda"))
    ref = resource.spec.model.source.hugging_face.token_secret_ref
    assert env_of(container)["HF_TOKEN"] == {"secretKeyRef": {"name": ref.name, "key": "token"}}


def test_warmup_sidecar_is_a_native_sidecar_gating_readiness() -> None:
    objects = rendered("warmup")
    pod = engine_pod(objects)
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["command"] == ["prefixserving", "warmup"]
    assert sidecar["args"] == [
        "--engine-url",
        "http://127.0.0.1:8000",
        "--prompts-file",
        "/etc/prefixserving/warmup/prompts.json",
        "--router-url",
        "http://support-bot-router.llm.svc.cluster.local:8080",
        "--hot-prefixes",
        "64",
        "--timeout-s",
        "300",
        "--self-url",
        "http://$(POD_IP):8000",
        "--port",
        "8090",
        "--model",
        "qwen2.5-14b-instruct",
        "--handover-selector",
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=support-bot,"
        "app.kubernetes.io/name=prefixserving",
    ]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in sidecar[
        "env"
    ]
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "warmup"}
    assert sidecar["ports"] == [{"name": "warmup", "containerPort": constants.WARMUP_PORT}]
    startup = sidecar["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"  # process up, not warm: the engine must start
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    configmap = find(objects, "ConfigMap")
    assert configmap["metadata"]["name"] == names.warmup_configmap("support-bot")
    prompts = json.loads(configmap["data"]["prompts.json"])
    resource, _ = load("warmup")
    assert prompts == [
        p.model_dump(by_alias=True, exclude_none=True) for p in resource.spec.warmup.prompts
    ]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "warmup-prompts"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]


def test_only_the_warmup_sidecar_gets_an_api_token_with_the_verbs_it_uses() -> None:
    objects = rendered("warmup")
    pod = engine_pod(objects)
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == names.engine_service_account("support-bot")
    (token,) = [v for v in pod["volumes"] if v["name"] == "warmup-token"]
    sources = token["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["path"] == "token"
    (sidecar,) = pod["initContainers"]
    sidecar_mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert sidecar_mounts["warmup-token"] == "/var/run/secrets/kubernetes.io/serviceaccount"
    assert "warmup-token" not in {m["name"] for m in engine_container(objects)["volumeMounts"]}
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in sidecar["env"]}
    assert env[constants.ENV_POD_UID] == "metadata.uid"
    assert find(objects, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]
    assert env[constants.ENV_POD_TEMPLATE_HASH] == "metadata.labels['pod-template-hash']"
    role, binding = find(objects, "Role"), find(objects, "RoleBinding")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "llm"}
    ]


def test_without_the_handover_the_sidecar_may_only_create_events() -> None:
    objects = render({"warmup": {"enabled": True, "handover": False}})
    (sidecar,) = engine_pod(objects)["initContainers"]
    assert "--handover-selector" not in sidecar["args"]
    role = find(objects, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_the_handover_selector_selects_exactly_the_engine_pods() -> None:
    objects = rendered("warmup")
    (sidecar,) = engine_pod(objects)["initContainers"]
    selector = sidecar["args"][sidecar["args"].index("--handover-selector") + 1]
    labels = dict(pair.split("=") for pair in selector.split(","))
    deployment = find(objects, "Deployment", constants.COMPONENT_ENGINE)
    assert labels == deployment["spec"]["selector"]["matchLabels"]


def test_without_warmup_there_is_no_service_account_or_role() -> None:
    objects = render({})
    assert not {"ServiceAccount", "Role", "RoleBinding"} & {o["kind"] for o in objects}
    assert "serviceAccountName" not in engine_pod(objects)


def test_warmup_from_a_user_configmap_renders_no_configmap() -> None:
    objects = render(
        {"warmup": {"enabled": True, "configMapRef": {"name": "my-prompts", "key": "p.json"}}}
    )
    assert "ConfigMap" not in [o["kind"] for o in objects]
    (volume,) = [v for v in engine_pod(objects)["volumes"] if v["name"] == "warmup-prompts"]
    assert volume["configMap"] == {
        "name": "my-prompts",
        "items": [{"key": "p.json", "path": "prompts.json"}],
    }


def test_warmup_off_has_no_sidecar() -> None:
    assert "initContainers" not in engine_pod(render({}))


def test_router_args_and_security() -> None:
    spec = {
        "router": {
            "replicas": 3,
            "algorithm": "least-loaded",
            "loadBound": 1.5,
            "prefixBlocks": 4,
            "blockChars": 256,
        }
    }
    objects = render(spec)
    deployment = find(objects, "Deployment", "router")
    assert deployment["spec"]["replicas"] == 3
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["prefixserving", "router"]
    assert container["args"] == [
        "--port",
        "8080",
        "--dns",
        "chat-engine.llm.svc.cluster.local:8000",
        "--policy",
        "least-loaded",
        "--load-bound",
        "1.5",
        "--prefix-blocks",
        "4",
        "--block-chars",
        "256",
        "--model",
        "chat-model",
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    engine_service = find(objects, "Service", "engine")
    assert engine_service["spec"]["clusterIP"] == "None"
    assert engine_service["metadata"]["name"] == names.engine_service("chat")
    assert find(objects, "Service", "router")["spec"]["ports"][0]["port"] == constants.ROUTER_PORT


def test_keda_scaled_object_runs_the_promql_queries() -> None:
    objects = rendered("autoscaled-keda")
    scaled = find(objects, "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"]["name"] == names.engine_deployment("mistral-support")
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (2, 8)
    triggers = {t["name"]: t for t in scaled["triggers"]}
    kv, queue = triggers["kv-cache-usage"], triggers["queue-depth"]
    assert kv["metadata"]["query"] == promql.kv_cache_usage("llm", "mistral-support")
    assert kv["metricType"] == "Value" and kv["metadata"]["threshold"] == "0.75"
    assert queue["metadata"]["query"] == promql.queue_depth_total("llm", "mistral-support")
    assert queue["metricType"] == "AverageValue" and queue["metadata"]["threshold"] == "4"
    backlog = triggers["backlog-seconds"]
    assumed = defaults.PREFILL_TOKENS_PER_S
    assert backlog["metadata"]["query"] == promql.backlog_seconds_total(
        "llm", "mistral-support", assumed
    )
    assert backlog["metricType"] == "AverageValue" and backlog["metadata"]["threshold"] == "3"
    assert {t["metadata"]["ignoreNullValues"] for t in triggers.values()} == {"false"}
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert "replicas" not in find(objects, "Deployment", "engine")["spec"]


def test_hpa_merges_spec_over_policy_over_defaults() -> None:
    hpa = find(rendered("autoscaled-hpa"), "HorizontalPodAutoscaler")["spec"]
    assert hpa["minReplicas"] == 2  # policy
    assert hpa["maxReplicas"] == 10  # spec overrides the policy's 6
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["metrics"]}
    assert metrics == {
        promql.ADAPTER_METRIC_KV_CACHE_USAGE: {"type": "AverageValue", "averageValue": "800m"},
        promql.ADAPTER_METRIC_REQUESTS_WAITING: {"type": "AverageValue", "averageValue": "5"},
        promql.ADAPTER_METRIC_BACKLOG_SECONDS: {"type": "AverageValue", "averageValue": "1"},
    }
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 900  # policy
    assert hpa["behavior"]["scaleUp"]["stabilizationWindowSeconds"] == 0  # default


def test_signals_select_the_metrics() -> None:
    objects = render(
        {"autoscaling": {"enabled": True, "backend": "hpa", "signals": ["queueDepth"]}}
    )
    (metric,) = find(objects, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == promql.ADAPTER_METRIC_REQUESTS_WAITING


def test_policy_backend_applies_when_the_spec_leaves_it_unset() -> None:
    objects = render(
        {"autoscaling": {"enabled": True}}, policy={"backend": "hpa", "maxReplicas": 3}
    )
    assert find(objects, "HorizontalPodAutoscaler")["spec"]["maxReplicas"] == 3


def test_invalid_policy_is_refused() -> None:
    from prefixserving.api.types import ScalingPolicySpec
    from prefixserving.api.validation import SpecError

    policy = ScalingPolicySpec.model_construct(min_replicas=5, max_replicas=1)
    body = copy.deepcopy(BASE)
    with pytest.raises(SpecError, match=r"policy\.maxReplicas"):
        render_children(parse_resource(body), policy)


def test_service_monitor_and_alerts_when_enabled() -> None:
    objects = rendered("autoscaled-keda")
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"] == names.instance_selector("mistral-support")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"]
    warm_monitor = find(rendered("warmup"), "ServiceMonitor")
    assert [e["port"] for e in warm_monitor["spec"]["endpoints"]] == ["http", "warmup"]
    warm_service = find(rendered("warmup"), "Service", "engine")
    assert [p["name"] for p in warm_service["spec"]["ports"]] == ["http", "warmup"]
    # Both Services name their port "http" and carry the instance selector labels.
    for service in (o for o in objects if o["kind"] == "Service"):
        assert service["spec"]["ports"][0]["name"] == "http"
        labels = service["metadata"]["labels"]
        assert names.instance_selector("mistral-support").items() <= labels.items()
    assert find(objects, "PrometheusRule")["metadata"]["name"] == "mistral-support"
    assert "ServiceMonitor" not in [o["kind"] for o in render({})]
    assert "PrometheusRule" not in [o["kind"] for o in render({})]


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_feature_combinations_pass_kubernetes_schemas(version: str) -> None:
    objects = render(
        {
            "placement": {"ipc": "host", "numa": "aligned"},
            "warmup": {"enabled": True, "configMapRef": {"name": "p"}},
            "autoscaling": {"enabled": True, "backend": "hpa"},
            "monitoring": {"serviceMonitor": True, "alerts": {"enabled": True}},
            "scheduler": {"policy": "fcfs"},
        }
    )
    assert_all_valid(objects, version)
