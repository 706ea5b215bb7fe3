"""Every name the project shares across components: API group, kinds, labels, ports, images,
handler ids, environment variables, router paths and metric names read by other components.
Handler ids are never renamed: kopf stores progress under them. Condition types and reasons
are in ``prefixserving.api.lifecycle``, API defaults in ``prefixserving.api.defaults``."""

from __future__ import annotations

from typing import Final

GROUP: Final = "prefixserving.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PrefixServing"
PLURAL: Final = "prefixservings"
SINGULAR: Final = "prefixserving"
SHORT_NAME: Final = "pfx"
POLICY_KIND: Final = "ScalingPolicy"
POLICY_PLURAL: Final = "scalingpolicies"
POLICY_SINGULAR: Final = "scalingpolicy"

PROJECT_VERSION: Final = "0.1.0"
IMAGE_REGISTRY: Final = "ghcr.io/prefixserving"
ENGINE_IMAGE: Final = f"{IMAGE_REGISTRY}/engine:{PROJECT_VERSION}"
ROUTER_IMAGE: Final = f"{IMAGE_REGISTRY}/router:{PROJECT_VERSION}"
OPERATOR_IMAGE: Final = f"{IMAGE_REGISTRY}/operator:{PROJECT_VERSION}"
# The non-root user the router (also the warm-up sidecar) and operator images run as: their
# Dockerfiles' ``useradd --uid`` and ``USER``, the rendered pods' ``runAsUser`` and the chart's
# operator Deployment (tests/test_images.py compares them).
IMAGE_UID: Final = 65532

# Labels on every child object.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_VERSION: Final = "app.kubernetes.io/version"
# Set by the Deployment controller on each pod: the revision (ReplicaSet) it belongs to.
LABEL_POD_TEMPLATE_HASH: Final = "pod-template-hash"
PART_OF: Final = "prefixserving"
MANAGED_BY: Final = "prefixserving-operator"
COMPONENT_ENGINE: Final = "engine"
COMPONENT_ROUTER: Final = "router"

# Ports.
ENGINE_PORT: Final = 8000
ROUTER_PORT: Final = 8080
# The endpoint picker's gRPC port (ext_proc and health), the Gateway API Inference Extension's
# convention; its HTTP port (metrics, hot prefixes) is ROUTER_PORT.
PICKER_GRPC_PORT: Final = 9002
# Engine KV cache events (vLLM --kv-events-config, ZMQ): the engines publish on
# KV_EVENTS_PORT and answer replay requests on KV_EVENTS_REPLAY_PORT; routers subscribe.
KV_EVENTS_PORT: Final = 5557
KV_EVENTS_REPLAY_PORT: Final = 5558
KV_EVENTS_TOPIC: Final = "kv-events"
# The block hash the engines must use so that routers can recompute it: SHA-256 over
# canonical CBOR (vLLM --prefix-caching-hash-algo), the first block's parent derived from
# KV_EVENTS_HASH_SEED (vLLM reads it from PYTHONHASHSEED; its own default is the same value).
KV_EVENTS_HASH_ALGO: Final = "sha256_cbor"
KV_EVENTS_HASH_SEED: Final = "vllm-none-hash"
WARMUP_PORT: Final = 8090
# Where the warm-up sidecar serves its pod's routing identity, on WARMUP_PORT (the router asks).
WARMUP_IDENTITY_PATH: Final = "/identity"
OPERATOR_HEALTH_PORT: Final = 8081

# The router's prefix key: blocks of this many characters (a quarter as many token ids), this
# many blocks deep (4 KiB of leading text), so long system prompts still separate by what follows.
ROUTER_BLOCK_CHARS: Final = 128
ROUTER_PREFIX_BLOCKS: Final = 32
# The router's load bound: the largest load relative to the mean a backend may reach before a
# prefix spills to its next backend (``--load-bound``, ``spec.router.loadBound``).
ROUTER_LOAD_BOUND: Final = 1.25
# The endpoint picker: TLS on its gRPC port (``--secure-serving``), and the requests waiting on
# every engine at which it answers 429, 0 for never (``--shed-waiting-requests``).
PICKER_SECURE_SERVING: Final = True
PICKER_SHED_WAITING_REQUESTS: Final = 0

# The scheduler class vLLM loads through --scheduler-cls when policy is "peek".
PEEK_SCHEDULER_CLS: Final = "prefixserving.engine.vllm.PeekScheduler"

# Server-side apply field manager of the operator.
FIELD_MANAGER: Final = "prefixserving-operator"

# kopf handler ids.
HANDLER_RECONCILE: Final = "reconcile"
HANDLER_STATUS: Final = "status"
HANDLER_METRICS: Final = "metrics"
HANDLER_RESYNC: Final = "resync"
HANDLER_DRIFT: Final = "drift"
HANDLER_POLICY: Final = "policy"

# Environment variables that carry the spec's scheduler block into the engine process
# (read by prefixserving.engine.vllm.PeekScheduler).
ENV_MAX_SIBLING_WAIT_MS: Final = "PREFIXSERVING_MAX_SIBLING_WAIT_MS"
ENV_PIN_BUDGET_FRACTION: Final = "PREFIXSERVING_PIN_BUDGET_FRACTION"
ENV_LANES: Final = "PREFIXSERVING_LANES"
ENV_MAX_OVERTAKES: Final = "PREFIXSERVING_MAX_OVERTAKES"
ENV_DECODE_RESERVE_BLOCKS: Final = "PREFIXSERVING_DECODE_RESERVE_BLOCKS"
# Not in the spec: expert knobs of the lanes, set through spec.engine.env.
ENV_MAX_RESPONSE_RATIO: Final = "PREFIXSERVING_MAX_RESPONSE_RATIO"
ENV_CACHE_SHARE: Final = "PREFIXSERVING_CACHE_SHARE"
ENV_REORDER_ON_BACKLOG: Final = "PREFIXSERVING_REORDER_ON_BACKLOG"
ENV_FCFS_BOUND: Final = "PREFIXSERVING_FCFS_BOUND"

# Router endpoints and metrics read by other components (warm-up sidecar, status, alerts).
ROUTER_HOT_PREFIXES_PATH: Final = "/v1/prefixserving/hot-prefixes"
ROUTER_HYGIENE_PATH: Final = "/v1/prefixserving/hygiene"
METRIC_ROUTER_NEW_FIRST_BLOCK_RATIO: Final = "prefixserving_router_new_first_block_ratio"
METRIC_ROUTER_HYGIENE_CAUSE: Final = "prefixserving_router_prefix_hygiene_cause"
METRIC_ROUTER_HELD_REQUESTS: Final = "prefixserving_router_held_requests"

# Warm-up sidecar: the Event reason it emits on timeout, the Downward API environment the
# engine pod template sets for it (with the pod's revision, for the rolling-update handover),
# the path of the prompts file it reads, and the metrics it exports (prefixserving.warmup.state;
# read by alerts and the dashboard), as exposed.
REASON_WARMUP_TIMED_OUT: Final = "WarmupTimedOut"
ENV_POD_NAME: Final = "POD_NAME"
ENV_POD_NAMESPACE: Final = "POD_NAMESPACE"
ENV_POD_UID: Final = "POD_UID"
ENV_POD_IP: Final = "POD_IP"
ENV_POD_TEMPLATE_HASH: Final = "POD_TEMPLATE_HASH"
WARMUP_PROMPTS_FILE: Final = "/etc/prefixserving/warmup/prompts.json"
METRIC_WARMUP_READY: Final = "prefixserving_warmup_ready"
METRIC_WARMUP_PREFIXES_PLANNED: Final = "prefixserving_warmup_prefixes_planned"
METRIC_WARMUP_PREFIXES_WARMED: Final = "prefixserving_warmup_prefixes_warmed_total"
METRIC_WARMUP_TOKENS_WARMED: Final = "prefixserving_warmup_tokens_warmed_total"
METRIC_WARMUP_FAILURES: Final = "prefixserving_warmup_failures_total"
METRIC_WARMUP_TIMEOUTS: Final = "prefixserving_warmup_timeouts_total"
METRIC_WARMUP_DURATION: Final = "prefixserving_warmup_duration_seconds"
