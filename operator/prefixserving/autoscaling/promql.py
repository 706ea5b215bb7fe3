"""The PromQL that the autoscalers, the alerts and the operator's status run.

Series selection
----------------
A PrefixServing's engine series are selected by the two labels that every common Prometheus
set-up attaches to a scraped pod: ``namespace`` and ``pod``. Both the ServiceMonitor the
operator renders and the usual annotation-based ``kubernetes-pods`` scrape job (the engine
pods carry ``prometheus.io/scrape``, ``prometheus.io/port`` and ``prometheus.io/path``)
produce them. Engine pods belong to the Deployment ``<name>-engine``, so their names are
``<name>-engine-<replicaset hash>-<pod hash>``; the regex below matches exactly these (PromQL
anchors regexes, and neither hash contains ``-``), so the resource ``a`` never picks up the
pods of a resource named ``a-engine-x``.

Signals
-------
- KV cache usage: ``vllm:kv_cache_usage_perc`` (0..1), averaged across the engine pods.
  KEDA uses it with ``metricType: Value`` (the HPA scales by ``current / target``).
- Queue depth: ``vllm:num_requests_waiting`` summed across pods; KEDA uses it with
  ``metricType: AverageValue`` so the target is requests waiting *per replica*.
- Prefix-cache hit rate: ``rate(hits) / rate(queries)`` over a window (tokens, 5m default).

prometheus-adapter (HPA backend) exposes the per-pod series as custom metrics under the names
in ``ADAPTER_METRIC_*``; the chart's adapter rules use exactly these names, and the rendered
HPA asks for them as ``Pods`` metrics (the HPA averages them across the target's pods).

Every function is pure and returns a string; cost is linear in the length of the names.
"""

from __future__ import annotations

from typing import Final

# vLLM series (same names in vLLM 0.32 and 0.33).
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"

# Custom-metric names that prometheus-adapter serves (custom.metrics.k8s.io) for the HPA backend.
ADAPTER_METRIC_KV_CACHE_USAGE: Final = "vllm_kv_cache_usage_perc"
ADAPTER_METRIC_REQUESTS_WAITING: Final = "vllm_num_requests_waiting"

# Default window of the hit-rate query.
HIT_RATE_WINDOW: Final = "5m"


def engine_pod_regex(name: str) -> str:
    """Regex matching the pod names of the engine Deployment ``<name>-engine``."""
    return f"{name}-engine-[a-z0-9]+-[a-z0-9]+"


def engine_selector(namespace: str, name: str) -> str:
    """Label matchers (with braces) selecting the engine pods of one PrefixServing."""
    return f'{{namespace="{namespace}",pod=~"{engine_pod_regex(name)}"}}'


def router_pod_regex(name: str) -> str:
    """Regex matching the pod names of the router Deployment ``<name>-router``."""
    return f"{name}-router-[a-z0-9]+-[a-z0-9]+"


def router_selector(namespace: str, name: str) -> str:
    """Label matchers (with braces) selecting the router pods of one PrefixServing."""
    return f'{{namespace="{namespace}",pod=~"{router_pod_regex(name)}"}}'


def kv_cache_usage(namespace: str, name: str) -> str:
    """Average KV cache usage (0..1) across the resource's engine pods."""
    return f"avg({VLLM_KV_CACHE_USAGE}{engine_selector(namespace, name)})"


def queue_depth_total(namespace: str, name: str) -> str:
    """Requests waiting across all engine pods (KEDA divides by replicas: AverageValue)."""
    return f"sum({VLLM_REQUESTS_WAITING}{engine_selector(namespace, name)})"


def queue_depth_per_replica(namespace: str, name: str) -> str:
    """Requests waiting per engine pod, averaged across pods (what the status reports)."""
    return f"avg({VLLM_REQUESTS_WAITING}{engine_selector(namespace, name)})"


def prefix_cache_hit_rate(namespace: str, name: str, window: str = HIT_RATE_WINDOW) -> str:
    """Prefix-cache hit rate (hit tokens / queried tokens) over ``window`` across the pods."""
    selector = engine_selector(namespace, name)
    return (
        f"sum(rate({VLLM_PREFIX_CACHE_HITS}{selector}[{window}]))"
        f" / sum(rate({VLLM_PREFIX_CACHE_QUERIES}{selector}[{window}]))"
    )
