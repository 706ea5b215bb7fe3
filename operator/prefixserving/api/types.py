"""Pydantic models of the ``PrefixServing`` and ``ScalingPolicy`` custom resources: the spec.

The CRDs in ``crds/`` are generated from these models (``api/crd.py``), so every field carries
a description (it becomes ``kubectl explain`` text), its range and its default (from
``api/defaults.py``; a description that names a default is written by ``fields.with_default``).
Python attributes are snake_case; the API uses camelCase aliases. The status models are in
``api/status.py``, the conditions in ``api/lifecycle.py``, the merge of the autoscaling layers
in ``api/scaling.py``. Cross-field rules live in ``api/validation.py`` (Python, and CEL in the
CRD).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.api.fields import ApiModel, DnsName, Duration, KubeObject, Quantity, with_default
from prefixserving.api.status import PrefixServingStatus

# Names of PrefixServings: child names append "-engine-<hash>-<hash>" and Services need a
# leading letter (DNS-1035), so a name is a DNS-1035 label of at most 42 characters.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX_LENGTH = 42


# --------------------------------------------------------------------------------------- model


class LocalObjectReference(ApiModel):
    """A reference to an object in the resource's namespace, by name."""

    name: DnsName = Field(description="Name of the object.")


class PvcSource(ApiModel):
    """Files on a PersistentVolumeClaim, mounted read-only into the engine pod."""

    claim_name: DnsName = Field(description="Name of the PersistentVolumeClaim, same namespace.")
    sub_path: str = Field(
        default="",
        max_length=1024,
        pattern=r"^([^/.][^/]*(/[^/]+)*)?$",
        description="Directory inside the claim that holds the files (relative, no '..').",
    )


class SecretKeyRef(ApiModel):
    """A key of a Secret in the resource's namespace."""

    name: DnsName = Field(description="Name of the Secret.")
    key: str = Field(
        default=defaults.HF_TOKEN_KEY,
        min_length=1,
        max_length=253,
        description="Key in the Secret.",
    )


class HuggingFaceSource(ApiModel):
    """A repository on the Hugging Face Hub, downloaded by the engine at start."""

    repo: str = Field(
        min_length=3,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Repository id, 'organisation/name'.",
    )
    revision: str = Field(
        default=defaults.HF_REVISION,
        min_length=1,
        max_length=200,
        description="Branch, tag or commit to download.",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding a Hub token, for gated or private repos."
    )


class ModelSource(ApiModel):
    """Where the weights come from: exactly one of ``pvc`` and ``huggingFace``."""

    pvc: PvcSource | None = Field(default=None, description="Weights on a PersistentVolumeClaim.")
    hugging_face: HuggingFaceSource | None = Field(
        default=None, description="Weights from a Hugging Face Hub repository."
    )


class LoraAdapter(ApiModel):
    """A LoRA adapter served next to the base model under its own name."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Name clients pass as 'model' to use this adapter.",
    )
    source: ModelSource = Field(description="Where the adapter's files come from.")


class ModelSpec(ApiModel):
    """The model to serve."""

    served_name: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$",
        description="Name clients pass as 'model' (vLLM --served-model-name).",
    )
    source: ModelSource = Field(description="Where the weights come from.")
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        le=4_194_304,
        description="Context length in tokens (vLLM --max-model-len); unset: the model's own.",
    )
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        max_length=64,
        description="LoRA adapters (vLLM --enable-lora --lora-modules).",
    )
    max_loras: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Adapters resident on the GPU at once (vLLM --max-loras); unset: all.",
    )


# -------------------------------------------------------------------------------------- engine


class EnvVar(ApiModel):
    """An environment variable of the engine container (Kubernetes EnvVar)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", description="Name."
    )
    value: str | None = Field(default=None, description="Literal value.")
    value_from: KubeObject | None = Field(
        default=None, description="Source of the value (Kubernetes EnvVarSource)."
    )


class EngineResources(ApiModel):
    """CPU and memory of the engine container (memory is also its limit)."""

    cpu: Quantity = Field(
        default=defaults.ENGINE_CPU, description=with_default("CPU request", defaults.ENGINE_CPU)
    )
    memory: Quantity = Field(
        default=defaults.ENGINE_MEMORY,
        description=with_default("Memory request and limit", defaults.ENGINE_MEMORY),
    )


class RouterResources(ApiModel):
    """CPU and memory of a router container (memory is also its limit)."""

    cpu: Quantity = Field(
        default=defaults.ROUTER_CPU, description=with_default("CPU request", defaults.ROUTER_CPU)
    )
    memory: Quantity = Field(
        default=defaults.ROUTER_MEMORY,
        description=with_default("Memory request and limit", defaults.ROUTER_MEMORY),
    )


class EngineSpec(ApiModel):
    """The vLLM engine pods."""

    image: str = Field(
        default=defaults.ENGINE_IMAGE, min_length=1, max_length=512, description="Engine image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default=defaults.IMAGE_PULL_POLICY, description="Pull policy of the engine image."
    )
    pod_annotations: dict[str, str] = Field(
        default_factory=dict,
        description="Extra annotations on the engine pods (e.g. for a service mesh or Kueue).",
    )
    tensor_parallel_size: int = Field(
        default=defaults.TENSOR_PARALLEL_SIZE,
        ge=1,
        le=64,
        description="GPUs per replica (vLLM --tensor-parallel-size).",
    )
    gpu_resource_name: str = Field(
        default=defaults.GPU_RESOURCE_NAME,
        min_length=3,
        max_length=253,
        pattern=r"^[a-z0-9.-]+/[a-z0-9._-]+$",
        description="Extended resource that exposes GPUs on the nodes.",
    )
    gpu_memory_utilization: float = Field(
        default=defaults.GPU_MEMORY_UTILIZATION,
        gt=0.0,
        le=1.0,
        description="Fraction of GPU memory vLLM may use (--gpu-memory-utilization).",
    )
    block_size: Literal[defaults.BLOCK_SIZES] = Field(  # type: ignore[valid-type]
        default=defaults.BLOCK_SIZE,
        description="Tokens per KV cache block (--block-size); the prefix cache's granularity.",
    )
    async_scheduling: bool | None = Field(
        default=None,
        description=(
            "vLLM async scheduling (--async-scheduling / --no-async-scheduling). Unset: vLLM "
            "decides (on for GPUs unless the configuration rules it out). PEEK runs on vLLM's "
            "AsyncScheduler whenever the engine schedules asynchronously, on Scheduler otherwise; "
            "status.metrics.schedulerBase says which."
        ),
    )
    resources: EngineResources = Field(
        default_factory=EngineResources, description="CPU and memory of the engine container."
    )
    env: list[EnvVar] = Field(
        default_factory=list, max_length=128, description="Extra environment variables."
    )
    extra_args: list[Annotated[str, StringConstraints(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="Extra vLLM arguments; flags the operator sets are refused.",
    )
    max_surge: int = Field(
        default=defaults.MAX_SURGE,
        ge=1,
        le=100,
        description="Extra pods in a rollout (maxUnavailable is 0: the cache stays warm).",
    )
    startup_timeout_seconds: int = Field(
        default=defaults.STARTUP_TIMEOUT_S,
        ge=60,
        le=21_600,
        description="Time allowed for model download and load before the pod restarts.",
    )
    drain_seconds: int = Field(
        default=defaults.DRAIN_S,
        ge=0,
        le=600,
        description="Seconds the pod keeps serving after removal from endpoints (preStop).",
    )
    termination_grace_period_seconds: int = Field(
        default=defaults.TERMINATION_GRACE_S,
        ge=1,
        le=3600,
        description="Time for in-flight requests to finish after the drain.",
    )


class SchedulerSpec(ApiModel):
    """The engine's request scheduler."""

    policy: Literal["peek", "fcfs"] = Field(
        default=defaults.SCHEDULER_POLICY,
        description="'peek': prefix-aware PEEK scheduler; 'fcfs': vLLM's stock scheduler.",
    )
    max_sibling_wait_ms: int = Field(
        default=defaults.MAX_SIBLING_WAIT_MS,
        ge=0,
        le=10_000,
        description="Longest a sibling waits for its pioneer's prefix to be cached.",
    )
    pin_budget_fraction: float = Field(
        default=defaults.PIN_BUDGET_FRACTION,
        ge=0.0,
        le=0.5,
        description=(
            "Fraction of KV blocks the eviction guard may hard-pin, for one step at a time, for "
            "the cached blocks the next admissions read (0: protect them by LRU order only)."
        ),
    )
    lanes: bool = Field(
        default=defaults.LANES,
        description=(
            "PEEK's lanes: under cache pressure, least uncached work first (a cached prefix costs "
            "nothing, a shared uncached one is opened once), a request whose response ratio "
            f"(waited work / its cost) reaches {defaults.PEEK_MAX_RESPONSE_RATIO:g} next, within "
            "maxOvertakes; with the eviction guard and decode headroom. false: vLLM's own "
            "arrival order (holding still applies)."
        ),
    )
    max_overtakes: int = Field(
        default=defaults.MAX_OVERTAKES,
        ge=0,
        le=100_000,
        description=(
            "Most younger requests the lanes may admit ahead of any waiting request; bounds "
            "the extra wait reordering can cause (0: arrival order)."
        ),
    )
    decode_reserve_blocks: int = Field(
        default=defaults.DECODE_RESERVE_BLOCKS,
        ge=0,
        le=64,
        description=(
            "KV blocks decode headroom keeps free for each running request, on top of what the "
            "running requests allocate next step, before the lanes admit a waiting request. "
            "0: more requests admitted at once; 1: preemptions about as rare as under vLLM's "
            "own scheduler and TPOT close to it under overload (docs/peek.md, Decode headroom)."
        ),
    )


# ----------------------------------------------------------------------------------- placement


class ShmSpec(ApiModel):
    """Memory-backed /dev/shm for NCCL and the engine's worker processes."""

    size_limit: Quantity = Field(
        default=defaults.SHM_SIZE_LIMIT, description="Size of /dev/shm (counts as pod memory)."
    )


class PlacementSpec(ApiModel):
    """Where and how the engine pods run."""

    shm: ShmSpec = Field(default_factory=ShmSpec, description="Shared memory for the engine.")
    ipc: Literal["isolated", "host"] = Field(
        default=defaults.IPC,
        description="'host' shares the node's IPC namespace (refused by Pod Security baseline).",
    )
    numa: Literal["none", "aligned"] = Field(
        default=defaults.NUMA,
        description="'aligned': Guaranteed QoS with integer CPUs and vLLM --numa-bind.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the engine pods require."
    )
    tolerations: list[KubeObject] = Field(
        default_factory=list, max_length=64, description="Tolerations (Kubernetes Toleration)."
    )
    affinity: KubeObject | None = Field(default=None, description="Kubernetes Affinity.")
    topology_spread_constraints: list[KubeObject] = Field(
        default_factory=list,
        max_length=16,
        description="Kubernetes TopologySpreadConstraints of the engine pods.",
    )
    priority_class_name: DnsName | None = Field(
        default=None, description="PriorityClass of the engine pods."
    )


# -------------------------------------------------------------------------------------- router


class EndpointPickerSpec(ApiModel):
    """The endpoint picker of router.mode endpointPicker and the InferencePool that names it."""

    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default=defaults.PICKER_FAILURE_MODE,
        description=(
            "What the gateway does while the picker does not answer (InferencePool "
            "endpointPickerRef.failureMode): 'FailOpen' sends the request to any engine of the "
            "pool, 'FailClose' answers an error."
        ),
    )
    secure_serving: bool = Field(
        default=defaults.PICKER_SECURE_SERVING,
        description=(
            "TLS with a self-signed certificate on the picker's gRPC port, as gateways expect "
            "unless configured otherwise (they do not verify it); false: plaintext, for Istio "
            "without a TLS DestinationRule or a mesh that adds mTLS itself."
        ),
    )
    shed_waiting_requests: int = Field(
        default=defaults.PICKER_SHED_WAITING_REQUESTS,
        ge=0,
        le=100_000,
        description=(
            "Answer 429 (with Retry-After) when every engine has at least this many requests "
            "waiting; 0 never sheds."
        ),
    )


class KvEventsSpec(ApiModel):
    """Exact cache state from the engines: KV cache events followed by every router replica."""

    enabled: bool = Field(
        default=False,
        description=(
            "The engines publish their KV cache events (vLLM --kv-events-config, ZMQ, with "
            "--prefix-caching-hash-algo sha256_cbor) and each router replica follows every "
            "engine's events: a request goes to the engine holding most of its leading blocks "
            "(ties and misses: the prefix ranking). The routers load the model's tokenizer."
        ),
    )


class RouterSpec(ApiModel):
    """The prefix-aware router in front of the engines."""

    mode: Literal["proxy", "endpointPicker"] = Field(
        default=defaults.ROUTER_MODE,
        description=(
            "'proxy': clients call the router (status.routerEndpoint), which forwards each "
            "request to its engine. 'endpointPicker': an inference gateway (Gateway API "
            "Inference Extension) sends the requests for the InferencePool named like this "
            "resource, and asks the router's endpoint picker which engine takes each one; no "
            "proxy runs. Needs the InferencePool CRD (inference.networking.k8s.io/v1)."
        ),
    )
    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec,
        description="The endpoint picker and its InferencePool (mode endpointPicker).",
    )
    kv_events: KvEventsSpec = Field(
        default_factory=KvEventsSpec,
        description="Route by the engines' own KV cache events (enabled: true to turn it on).",
    )
    image: str = Field(
        default=defaults.ROUTER_IMAGE, min_length=1, max_length=512, description="Router image."
    )
    replicas: int = Field(
        default=defaults.ROUTER_REPLICAS, ge=1, le=100, description="Router replicas."
    )
    algorithm: Literal["prefix-affinity", "two-choice", "round-robin", "least-loaded"] = Field(
        default=defaults.ROUTER_ALGORITHM, description="How a request picks its engine."
    )
    load_bound: float = Field(
        default=defaults.ROUTER_LOAD_BOUND,
        ge=1.0,
        le=10.0,
        description="An engine takes new prefixes only while below this multiple of mean load.",
    )
    prefix_blocks: int = Field(
        default=defaults.ROUTER_PREFIX_BLOCKS,
        ge=1,
        le=256,
        description="Leading blocks of the prompt hashed into the routing key.",
    )
    block_chars: int = Field(
        default=defaults.ROUTER_BLOCK_CHARS,
        ge=16,
        le=65_536,
        description="Characters per routing block.",
    )
    resources: RouterResources = Field(
        default_factory=RouterResources, description="CPU and memory of a router pod."
    )
    no_engine_hold_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Seconds a request waits for a Ready engine while there is none, then 503 with"
            " Retry-After (default: "
            f"{defaults.ROUTER_NO_ENGINE_HOLD_S} with autoscaling.minReplicas 0, else 0)."
        ),
    )


# --------------------------------------------------------------------------------- autoscaling


class ScalingTargets(ApiModel):
    """Per-replica targets the autoscaler holds the engines at."""

    kv_cache_usage: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description=with_default(
            "Average vllm:kv_cache_usage_perc across replicas", defaults.TARGET_KV_CACHE_USAGE
        ),
    )
    queue_depth: float | None = Field(
        default=None,
        gt=0.0,
        le=10_000.0,
        description=with_default(
            "Requests waiting per replica, PEEK's held siblings not counted",
            defaults.TARGET_QUEUE_DEPTH,
        ),
    )
    backlog_seconds: float | None = Field(
        default=None,
        gt=0.0,
        le=3600.0,
        description=with_default(
            "Seconds of uncached prompt tokens waiting per replica, at its measured prefill"
            " throughput",
            defaults.TARGET_BACKLOG_SECONDS,
        ),
    )


class ScalingRules(ApiModel):
    """Rate limits of one scaling direction (HPA behavior)."""

    stabilization_window_seconds: int | None = Field(
        default=None, ge=0, le=3600, description="Look-back window before changing replicas."
    )
    pods: int | None = Field(
        default=None, ge=1, le=1000, description="Most pods added or removed per period."
    )
    percent: int | None = Field(
        default=None, ge=1, le=1000, description="Most percent of replicas changed per period."
    )
    period_seconds: int | None = Field(
        default=None, ge=1, le=1800, description="Length of a rate-limit period."
    )


class ScalingBehaviorSpec(ApiModel):
    """Scale-up and scale-down behaviour."""

    scale_up: ScalingRules | None = Field(default=None, description="Scaling up.")
    scale_down: ScalingRules | None = Field(default=None, description="Scaling down.")


class PolicyRef(ApiModel):
    """Reference to a ScalingPolicy in the same namespace."""

    name: DnsName = Field(description="Name of the ScalingPolicy.")


class ScalingParameters(ApiModel):
    """Tunables shared by spec.autoscaling and ScalingPolicy; unset ones fall back."""

    backend: Literal["keda", "hpa"] | None = Field(
        default=None,
        description=with_default(
            "'keda': KEDA ScaledObject; 'hpa': HPA on prometheus-adapter",
            defaults.AUTOSCALING_BACKEND,
        ),
    )
    min_replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description=with_default(
            "Fewest engine replicas (0: scale to zero, KEDA backend; the router holds requests"
            " while the first engine starts)",
            defaults.MIN_REPLICAS,
        ),
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description=with_default("Most engine replicas", defaults.MAX_REPLICAS),
    )
    targets: ScalingTargets | None = Field(default=None, description="Scaling targets.")
    signals: list[Literal["kvCacheUsage", "queueDepth", "backlogSeconds"]] | None = Field(
        default=None,
        min_length=1,
        max_length=3,
        description=with_default("Signals that drive scaling", defaults.SIGNALS),
    )
    prefill_tokens_per_second: float | None = Field(
        default=None,
        gt=0.0,
        le=10_000_000.0,
        description=with_default(
            "Prefill throughput backlogSeconds assumes for a replica that prefilled nothing in"
            " the last 10 minutes (KEDA backend; the HPA backend's adapter rules use the"
            " default)",
            defaults.PREFILL_TOKENS_PER_S,
        ),
    )
    behavior: ScalingBehaviorSpec | None = Field(
        default=None, description="Scale-up and scale-down rate limits."
    )
    prometheus_url: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[^\s]+$",
        description=with_default("Prometheus that KEDA queries", defaults.PROMETHEUS_URL),
    )
    polling_interval_seconds: int | None = Field(
        default=None,
        ge=1,
        le=3600,
        description=with_default("KEDA polling interval", defaults.POLLING_INTERVAL_S),
    )
    cooldown_period_seconds: int | None = Field(
        default=None,
        ge=0,
        le=86_400,
        description=with_default("KEDA cooldown period", defaults.COOLDOWN_PERIOD_S),
    )


class AutoscalingSpec(ScalingParameters):
    """Autoscaling of the engine Deployment on KV cache usage and queue depth."""

    enabled: bool = Field(default=False, description="Let an autoscaler own the replica count.")
    policy_ref: PolicyRef | None = Field(
        default=None, description="ScalingPolicy supplying values this block leaves unset."
    )


# ------------------------------------------------------------------------------------- warm-up


class ChatMessage(ApiModel):
    """One chat message, as clients send it."""

    role: Literal["system", "user", "assistant"] = Field(description="Author of the message.")
    content: str = Field(max_length=1_000_000, description="Text of the message.")


class WarmupPrompt(ApiModel):
    """A prefix to prefill: exactly one of ``prompt`` and ``messages``."""

    prompt: str | None = Field(
        default=None, min_length=1, max_length=1_000_000, description="Completion prompt."
    )
    messages: list[ChatMessage] | None = Field(
        default=None, min_length=1, max_length=256, description="Chat messages."
    )


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the resource's namespace."""

    name: DnsName = Field(description="Name of the ConfigMap.")
    key: str = Field(
        default=defaults.WARMUP_CONFIGMAP_KEY,
        min_length=1,
        max_length=253,
        description="Key holding a JSON list of prompts.",
    )


class WarmupSpec(ApiModel):
    """Prefill prefixes into a new replica's cache before it takes traffic."""

    enabled: bool = Field(default=False, description="Run the warm-up sidecar.")
    image: str = Field(
        default=defaults.WARMUP_IMAGE, min_length=1, max_length=512, description="Sidecar image."
    )
    prompts: list[WarmupPrompt] = Field(
        default_factory=list, max_length=1000, description="Prefixes to prefill, inline."
    )
    config_map_ref: ConfigMapKeyRef | None = Field(
        default=None, description="Prefixes to prefill, from a ConfigMap (instead of inline)."
    )
    hot_prefixes: int = Field(
        default=defaults.WARMUP_HOT_PREFIXES,
        ge=0,
        le=4096,
        description="Top hot prefixes taken from the router (0: none).",
    )
    timeout_seconds: int = Field(
        default=defaults.WARMUP_TIMEOUT_S,
        ge=10,
        le=7200,
        description="The pod turns Ready after this even when warm-up has not finished.",
    )
    handover: bool = Field(
        default=True,
        description=(
            "In a rolling update, a new pod also replays the cache of the old pod it replaces,"
            " takes its routing identity (the router ranks it in that pod's place) and marks"
            " that pod to be deleted next (pod-deletion-cost); the sidecar's Role then grants"
            " list and patch on pods."
        ),
    )


# ---------------------------------------------------------------------------------- monitoring


class AlertsSpec(ApiModel):
    """A PrometheusRule with the cache and capacity alerts of this resource."""

    enabled: bool = Field(default=False, description="Render the PrometheusRule.")
    kv_saturation_threshold: float = Field(
        default=defaults.KV_SATURATION_THRESHOLD,
        gt=0.0,
        le=1.0,
        description="KV cache usage above which the cache counts as saturated.",
    )
    kv_saturation_for: Duration = Field(
        default=defaults.KV_SATURATION_FOR, description="How long saturation lasts before firing."
    )
    hit_rate_drop_fraction: float = Field(
        default=defaults.HIT_RATE_DROP_FRACTION,
        gt=0.0,
        lt=1.0,
        description="Relative drop of the 5m hit rate over 30m that fires.",
    )
    startup_grace_seconds: int = Field(
        default=defaults.STARTUP_GRACE_S,
        ge=0,
        le=7200,
        description="Pods younger than this are ignored by the hit-rate alert.",
    )
    first_block_new_threshold: float = Field(
        default=defaults.FIRST_BLOCK_NEW_THRESHOLD,
        gt=0.0,
        le=1.0,
        description="Fraction of never-seen first prefix blocks that fires (prefix hygiene).",
    )
    preemptions_per_second: float = Field(
        default=defaults.PREEMPTIONS_PER_S,
        gt=0.0,
        le=10_000.0,
        description="Preemption rate across replicas that fires.",
    )


class MonitoringSpec(ApiModel):
    """Prometheus integration."""

    service_monitor: bool = Field(
        default=False, description="Render a ServiceMonitor for the engines and the router."
    )
    alerts: AlertsSpec = Field(default_factory=AlertsSpec, description="Alerting rules.")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on the ServiceMonitor and PrometheusRule (Prometheus selectors).",
    )


# ---------------------------------------------------------------------------------------- spec


class PrefixServingSpec(ApiModel):
    """Desired state of a PrefixServing: a prefix-cached vLLM fleet behind a prefix router."""

    model: ModelSpec = Field(description="The model to serve.")
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets for pulling the engine, router and warm-up images.",
    )
    engine: EngineSpec = Field(default_factory=EngineSpec, description="The vLLM engine pods.")
    scheduler: SchedulerSpec = Field(
        default_factory=SchedulerSpec, description="The engine's scheduler."
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Placement of the engines."
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description=with_default("Engine replicas when autoscaling is off", defaults.REPLICAS)
        + " Leave unset when autoscaling is on.",
    )
    router: RouterSpec = Field(default_factory=RouterSpec, description="The prefix router.")
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec, description="Engine autoscaling."
    )
    warmup: WarmupSpec = Field(default_factory=WarmupSpec, description="Warm-up of new replicas.")
    monitoring: MonitoringSpec = Field(
        default_factory=MonitoringSpec, description="Prometheus integration."
    )


# ------------------------------------------------------------------------------------ resources


class ObjectMeta(BaseModel):
    """The parts of Kubernetes ObjectMeta the operator uses; other keys are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    name: str = Field(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        pattern=NAME_PATTERN,
        description="Name of the object.",
    )
    namespace: str = Field(default=defaults.NAMESPACE, description="Namespace of the object.")
    uid: str | None = Field(default=None, description="UID assigned by the API server.")
    generation: int | None = Field(default=None, description="Spec generation.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class PrefixServing(ApiModel):
    """A model served by a fleet of prefix-cached vLLM engines behind a prefix router."""

    api_version: Literal[constants.API_VERSION] = Field(  # type: ignore[valid-type]
        default=constants.API_VERSION, description=constants.API_VERSION
    )
    kind: Literal[constants.KIND] = Field(  # type: ignore[valid-type]
        default=constants.KIND, description=constants.KIND
    )
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: PrefixServingSpec = Field(description="Desired state.")
    status: PrefixServingStatus | None = Field(default=None, description="Observed state.")


class ScalingPolicySpec(ScalingParameters):
    """A reusable autoscaling policy, referenced by spec.autoscaling.policyRef."""


class ScalingPolicy(ApiModel):
    """Autoscaling settings kept in Git and shared by PrefixServings of a namespace."""

    api_version: Literal[constants.API_VERSION] = Field(  # type: ignore[valid-type]
        default=constants.API_VERSION, description=constants.API_VERSION
    )
    kind: Literal[constants.POLICY_KIND] = Field(  # type: ignore[valid-type]
        default=constants.POLICY_KIND, description=constants.POLICY_KIND
    )
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: ScalingPolicySpec = Field(description="Autoscaling settings.")
