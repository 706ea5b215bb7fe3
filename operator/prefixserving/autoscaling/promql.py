"""The PromQL that the autoscalers, the alerts, the dashboard and the operator's status run.

Series selection
----------------
A PrefixServing's engine series are selected by the two labels that every common Prometheus
set-up attaches to a scraped pod: ``namespace`` and ``pod``. Both the ServiceMonitor the
operator renders and the usual annotation-based ``kubernetes-pods`` scrape job (the engine
pods carry ``prometheus.io/scrape``, ``prometheus.io/port`` and ``prometheus.io/path``)
produce them. Engine pods belong to the Deployment ``<name>-engine``, so their names are
``<name>-engine-<replicaset hash>-<pod hash>``; the regex below matches exactly these (PromQL
anchors regexes, and neither hash contains ``-``), so the resource ``a`` never picks up the
pods of a resource named ``a-engine-x``. Router pods are ``<name>-router-<hash>-<hash>``.

A :class:`Scope` holds the matchers of the engine and router pods a query covers: one
resource (:func:`resource_scope`), or every PrefixServing Prometheus sees (:data:`FLEET`, used
by the chart's default alerts and by the dashboard through Grafana variables). Queries that
aggregate per resource recover the resource's name from the pod name with ``label_replace``
into the label ``prefixserving``, so one expression serves both scopes.

Signals
-------
- Serving pods only: every per-pod signal below leaves out the engine pods whose warm-up is
  still running (:func:`warm_pods_only`: the sidecar's ``prefixserving_warmup_ready`` is 0).
  Such a pod is not Ready, takes no client traffic, and its engine reports the warm-up's own
  prompts: averaged in, its near-empty KV cache dilutes the serving pods' usage while the HPA
  multiplies the average by the Ready pods only (``Value`` targets); summed in, its warm-up
  prompts read as demand. Pods without the series (warm-up off, or the sidecar not scraped)
  are kept.
- KV cache usage: ``vllm:kv_cache_usage_perc`` (0..1), averaged across the engine pods.
  KEDA uses it with ``metricType: Value`` (the HPA asks for ``ceil(ready pods x value /
  target)``).
- Queue depth, honest: per pod ``vllm:num_requests_waiting`` less
  ``prefixserving:peek_held_siblings`` (PEEK keeps a held sibling in vLLM's waiting queue, but
  it costs no prefill of its own: its pioneer computes the shared blocks), floored at 0 (the two
  gauges are sampled at slightly different moments); a pod without PEEK's series (stock
  scheduler) counts its waiting requests as they are. Summed across pods; KEDA uses it with
  ``metricType: AverageValue`` so the target is requests waiting *per replica*.
- Backlog seconds: per pod, the prompt tokens the waiting requests still need computed over
  the pod's measured prefill throughput, summed across pods (``AverageValue``: seconds of
  prefill work queued per replica). Tokens: PEEK's ``prefixserving:peek_uncached_waiting_tokens``
  (each shared block once, less what running pioneers compute). A stock engine has no such
  gauge; its tokens are approximated as waiting requests times the mean uncached prompt tokens
  of the requests it finished in :data:`PREFILL_WINDOW`
  (``vllm:request_prefill_kv_computed_tokens``, which excludes cache hits), and read 0 when it
  finished none. Throughput: vLLM's own
  histograms, ``rate(vllm:request_prefill_kv_computed_tokens_sum) /
  rate(vllm:request_prefill_time_seconds_sum)`` over the same window, i.e. uncached tokens per
  second of request prefill time. Requests prefilled in the same steps share that time, so the
  figure is a lower bound of the engine's throughput and backlog seconds err on the side of
  scaling out. A pod that prefilled nothing in the window (new, or idle) is assumed to do
  ``prefillTokensPerSecond`` (spec).
- KV cache usage counts only blocks held by requests: vLLM's ``BlockPool.get_usage()``
  (``vllm/v1/core/block_pool.py``, 0.32 and 0.33) is ``1 - free / (total - 1)``, and
  ``free_blocks()`` puts a block whose last request released it (``ref_cnt == 0``) back on the
  free queue even when it keeps its hash: a cached block that no request uses is free.
- Prefix-cache hit rate: ``rate(hits) / rate(queries)`` over a window (tokens, 5m default).

prometheus-adapter (HPA backend) exposes the per-pod series as custom metrics under the names
in ``ADAPTER_METRIC_*`` (:func:`adapter_rules`, shipped in the chart); the rendered HPA asks
for them as ``Pods`` metrics, and the HPA averages them across the target's pods.

Every function is pure and returns a string (or plain data); cost is linear in the length of
the names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from prefixserving import constants
from prefixserving.peek.metrics import PEEK_HELD_SIBLINGS, PEEK_INFO, PEEK_UNCACHED_WAITING_TOKENS

# vLLM series (same names in vLLM 0.32 and 0.33).
VLLM_KV_CACHE_USAGE: Final = "vllm:kv_cache_usage_perc"
VLLM_REQUESTS_WAITING: Final = "vllm:num_requests_waiting"
VLLM_REQUESTS_RUNNING: Final = "vllm:num_requests_running"
VLLM_PREFIX_CACHE_HITS: Final = "vllm:prefix_cache_hits_total"
VLLM_PREFIX_CACHE_QUERIES: Final = "vllm:prefix_cache_queries_total"
VLLM_PREEMPTIONS: Final = "vllm:num_preemptions_total"
VLLM_TTFT: Final = "vllm:time_to_first_token_seconds"
# Per-request histograms observed when a request finishes (``_sum`` and ``_count`` used).
VLLM_PREFILL_COMPUTED_TOKENS: Final = "vllm:request_prefill_kv_computed_tokens"
VLLM_PREFILL_TIME: Final = "vllm:request_prefill_time_seconds"
# Exported by every Python process through prometheus_client (vLLM's API server included).
PROCESS_START_TIME: Final = "process_start_time_seconds"
# Router and warm-up series (prefixserving.router.exposition, prefixserving.warmup.state).
ROUTER_DECISIONS: Final = "prefixserving_router_decisions_total"
ROUTER_REQUESTS: Final = "prefixserving_router_requests_total"
ROUTER_NEW_FIRST_BLOCK_RATIO: Final = constants.METRIC_ROUTER_NEW_FIRST_BLOCK_RATIO
ROUTER_HYGIENE_CAUSE: Final = constants.METRIC_ROUTER_HYGIENE_CAUSE
ROUTER_HELD_REQUESTS: Final = constants.METRIC_ROUTER_HELD_REQUESTS
WARMUP_TIMEOUTS: Final = constants.METRIC_WARMUP_TIMEOUTS
WARMUP_READY: Final = constants.METRIC_WARMUP_READY
# kube-state-metrics series of an HPA (KEDA's HPA too); used when max replicas is unknown.
KSM_HPA_CURRENT: Final = "kube_horizontalpodautoscaler_status_current_replicas"
KSM_HPA_MAX: Final = "kube_horizontalpodautoscaler_spec_max_replicas"

# Custom-metric names that prometheus-adapter serves (custom.metrics.k8s.io) for the HPA backend.
ADAPTER_METRIC_KV_CACHE_USAGE: Final = "vllm_kv_cache_usage_perc"
ADAPTER_METRIC_REQUESTS_WAITING: Final = "vllm_num_requests_waiting"
ADAPTER_METRIC_BACKLOG_SECONDS: Final = "prefixserving_backlog_seconds"

# Default window of the hit-rate query.
HIT_RATE_WINDOW: Final = "5m"
# Window of the measured prefill throughput and of a stock engine's tokens per request.
PREFILL_WINDOW: Final = "10m"
# Label that aggregated queries carry the PrefixServing's name in.
RESOURCE_LABEL: Final = "prefixserving"
BY_RESOURCE: Final = f"namespace, {RESOURCE_LABEL}"
_HASHES: Final = "-[a-z0-9]+-[a-z0-9]+"


def engine_pod_regex(name: str) -> str:
    """Regex matching the pod names of the engine Deployment ``<name>-engine``."""
    return f"{name}-engine{_HASHES}"


def router_pod_regex(name: str) -> str:
    """Regex matching the pod names of the router Deployment ``<name>-router``."""
    return f"{name}-router{_HASHES}"


def engine_matchers(namespace: str, name: str) -> str:
    """Label matchers (no braces) selecting the engine pods of one PrefixServing."""
    return f'namespace="{namespace}",pod=~"{engine_pod_regex(name)}"'


def router_matchers(namespace: str, name: str) -> str:
    """Label matchers (no braces) selecting the router pods of one PrefixServing."""
    return f'namespace="{namespace}",pod=~"{router_pod_regex(name)}"'


def engine_selector(namespace: str, name: str) -> str:
    """Label matchers (with braces) selecting the engine pods of one PrefixServing."""
    return f"{{{engine_matchers(namespace, name)}}}"


def router_selector(namespace: str, name: str) -> str:
    """Label matchers (with braces) selecting the router pods of one PrefixServing."""
    return f"{{{router_matchers(namespace, name)}}}"


@dataclass(frozen=True)
class Scope:
    """The engine and router pods a query covers, as label matchers without braces."""

    engine: str
    router: str


def resource_scope(namespace: str, name: str) -> Scope:
    """The pods of one PrefixServing (``namespace`` and ``name`` may be Grafana variables)."""
    return Scope(engine_matchers(namespace, name), router_matchers(namespace, name))


# Every PrefixServing's pods, in every namespace.
FLEET: Final = Scope(engine=f'pod=~".+-engine{_HASHES}"', router=f'pod=~".+-router{_HASHES}"')


def series(metric: str, matchers: str, *extra: str) -> str:
    """``metric{matchers,extra...}``."""
    return f"{metric}{{{','.join((matchers, *extra))}}}"


def per_resource(expr: str, component: str = "engine") -> str:
    """``expr`` with the label ``prefixserving`` set to the resource name in its pod label."""
    return f'label_replace({expr}, "{RESOURCE_LABEL}", "$1", "pod", "(.+)-{component}{_HASHES}")'


# ------------------------------------------------------------------------------ autoscaling


def warm_pods_only(expr: str, matchers: str, by: str = "namespace, pod") -> str:
    """``expr`` (series of engine pods, carrying the labels ``by``) without the pods whose
    warm-up sidecar reports ``prefixserving_warmup_ready == 0`` (still warming up).

    ``matchers`` select the pods (no braces). A set difference (``unless``), so a pod with no
    warm-up series is kept. The gauge turns 1 when the pod turns Ready; Prometheus sees that
    one scrape later, so a just-warmed pod stays out for up to one scrape interval.
    """
    return f"({expr} unless on ({by}) ({series(WARMUP_READY, matchers)} == 0))"


def kv_cache_usage(namespace: str, name: str) -> str:
    """Average KV cache usage (0..1) across the resource's engine pods that are not warming up."""
    matchers = engine_matchers(namespace, name)
    return f"avg({warm_pods_only(series(VLLM_KV_CACHE_USAGE, matchers), matchers)})"


def _by_pod(expr: str, by: str) -> str:
    return f"sum by ({by}) ({expr})"


def honest_waiting_by_pod(matchers: str, by: str = "namespace, pod") -> str:
    """Waiting requests per engine pod, PEEK's held siblings not counted (floored at 0), for
    the pods not warming up (:func:`warm_pods_only`).

    ``matchers`` select the pods (no braces); ``by`` names the labels one pod has (the
    prometheus-adapter passes its own grouping). Pods without PEEK's gauge count all waiting.
    """
    waiting = _by_pod(series(VLLM_REQUESTS_WAITING, matchers), by)
    held = _by_pod(series(PEEK_HELD_SIBLINGS, matchers), by)
    honest = f"(clamp_min({waiting} - on ({by}) {held}, 0) or on ({by}) {waiting})"
    return warm_pods_only(honest, matchers, by)


def prefill_throughput_by_pod(matchers: str, by: str = "namespace, pod") -> str:
    """Measured prefill throughput per engine pod (uncached tokens per second of prefill)
    over :data:`PREFILL_WINDOW`; pods that finished no prefill in the window have no value."""
    tokens = _by_pod(
        f"rate({series(VLLM_PREFILL_COMPUTED_TOKENS + '_sum', matchers)}[{PREFILL_WINDOW}])", by
    )
    seconds = _by_pod(f"rate({series(VLLM_PREFILL_TIME + '_sum', matchers)}[{PREFILL_WINDOW}])", by)
    return f"({tokens} / on ({by}) {seconds} > 0)"


def uncached_waiting_tokens_by_pod(matchers: str, by: str = "namespace, pod") -> str:
    """Prompt tokens the waiting requests of each engine pod still need computed.

    PEEK's gauge where the pod exports it; otherwise (stock scheduler) waiting requests times
    the mean uncached prompt tokens of the requests finished in :data:`PREFILL_WINDOW`; 0 for a
    stock pod that finished none.
    """
    peek = _by_pod(series(PEEK_UNCACHED_WAITING_TOKENS, matchers), by)
    waiting = _by_pod(series(VLLM_REQUESTS_WAITING, matchers), by)
    computed = series(VLLM_PREFILL_COMPUTED_TOKENS + "_sum", matchers)
    finished = series(VLLM_PREFILL_COMPUTED_TOKENS + "_count", matchers)
    per_request = (
        f"({_by_pod(f'rate({computed}[{PREFILL_WINDOW}])', by)}"
        f" / on ({by}) {_by_pod(f'rate({finished}[{PREFILL_WINDOW}])', by)} >= 0)"
    )
    return f"({peek} or on ({by}) {waiting} * on ({by}) {per_request} or on ({by}) 0 * {waiting})"


def backlog_seconds_by_pod(
    matchers: str, assumed_tokens_per_s: float, by: str = "namespace, pod"
) -> str:
    """Seconds of prefill work queued on each engine pod not warming up (:func:`warm_pods_only`):
    uncached waiting tokens over the pod's measured prefill throughput, or over
    ``assumed_tokens_per_s`` where it has none."""
    tokens = uncached_waiting_tokens_by_pod(matchers, by)
    throughput = prefill_throughput_by_pod(matchers, by)
    backlog = (
        f"({tokens} / on ({by}) {throughput} or on ({by}) {tokens} / {assumed_tokens_per_s:g})"
    )
    return warm_pods_only(backlog, matchers, by)


def held_requests_total(namespace: str, name: str) -> str:
    """Requests the resource's routers hold while no engine is Ready (scale from zero: KEDA
    activates the Deployment when this is above 0)."""
    return f"sum({ROUTER_HELD_REQUESTS}{router_selector(namespace, name)})"


def queue_depth_total(namespace: str, name: str) -> str:
    """Requests waiting across all engine pods, held siblings not counted (KEDA divides by
    replicas: AverageValue)."""
    return f"sum({honest_waiting_by_pod(engine_matchers(namespace, name))})"


def queue_depth_per_replica(namespace: str, name: str) -> str:
    """Requests waiting per engine pod, held siblings not counted, averaged across pods (what
    the status reports)."""
    return f"avg({honest_waiting_by_pod(engine_matchers(namespace, name))})"


def backlog_seconds_total(namespace: str, name: str, assumed_tokens_per_s: float) -> str:
    """Backlog seconds summed across the engine pods (KEDA divides by replicas: AverageValue)."""
    matchers = engine_matchers(namespace, name)
    return f"sum({backlog_seconds_by_pod(matchers, assumed_tokens_per_s)})"


def backlog_seconds_per_replica(namespace: str, name: str, assumed_tokens_per_s: float) -> str:
    """Backlog seconds per engine pod, averaged across pods (what the status reports)."""
    matchers = engine_matchers(namespace, name)
    return f"avg({backlog_seconds_by_pod(matchers, assumed_tokens_per_s)})"


def prefix_cache_hit_rate(namespace: str, name: str, window: str = HIT_RATE_WINDOW) -> str:
    """Prefix-cache hit rate (hit tokens / queried tokens) over ``window`` across the pods."""
    selector = engine_selector(namespace, name)
    return (
        f"sum(rate({VLLM_PREFIX_CACHE_HITS}{selector}[{window}]))"
        f" / sum(rate({VLLM_PREFIX_CACHE_QUERIES}{selector}[{window}]))"
    )


def peek_engines(namespace: str, name: str) -> str:
    """Engine pods running PEEK, by the vLLM scheduler base and the fallback reason."""
    return f"count by (base, fallback) ({PEEK_INFO}{engine_selector(namespace, name)})"


def new_first_block_ratio(namespace: str, name: str) -> str:
    """Share of requests whose first prefix block was new, per model, averaged over routers."""
    return f"avg by (model) ({ROUTER_NEW_FIRST_BLOCK_RATIO}{router_selector(namespace, name)})"


def adapter_rules(assumed_tokens_per_s: float) -> list[dict[str, Any]]:
    """prometheus-adapter rules serving the per-pod custom metrics the HPA backend asks for.

    Each rule discovers the engine series (``seriesQuery``), maps the ``namespace`` and
    ``pod`` labels to Kubernetes objects, names the custom metric (custom metric names cannot
    hold a colon) and computes one value per pod with the same per-pod expressions the KEDA
    triggers sum: the mean KV cache usage, the honest waiting requests and the backlog seconds
    (``assumed_tokens_per_s`` for pods without a measured throughput), none for a pod still
    warming up (the HPA then treats it as a pod without a value). prometheus-adapter fills
    in ``<<.Series>>``, ``<<.LabelMatchers>>`` (``namespace="ns",pod=~"a|b"``) and
    ``<<.GroupBy>>`` (``pod``).
    """
    resources = {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}
    matchers, by = "<<.LabelMatchers>>", "<<.GroupBy>>"
    queries = (
        (
            VLLM_KV_CACHE_USAGE,
            ADAPTER_METRIC_KV_CACHE_USAGE,
            f"avg by ({by}) ({warm_pods_only(f'<<.Series>>{{{matchers}}}', matchers, by)})",
        ),
        (
            VLLM_REQUESTS_WAITING,
            ADAPTER_METRIC_REQUESTS_WAITING,
            honest_waiting_by_pod(matchers, by),
        ),
        (
            VLLM_REQUESTS_RUNNING,
            ADAPTER_METRIC_BACKLOG_SECONDS,
            backlog_seconds_by_pod(matchers, assumed_tokens_per_s, by),
        ),
    )
    return [
        {
            "seriesQuery": f'{metric}{{namespace!="",pod!=""}}',
            "resources": resources,
            "name": {"matches": f"^{metric}$", "as": adapter_name},
            "metricsQuery": query,
        }
        for metric, adapter_name, query in queries
    ]


# ----------------------------------------------------------------------------------- alerts


def _mature(matchers: str, grace_s: int, offset_s: int) -> str:
    """Engine pods whose process started more than ``grace_s`` before ``now - offset_s``."""
    if offset_s == 0:
        return f"(time() - {series(PROCESS_START_TIME, matchers)}) > {grace_s}"
    start = f"{series(PROCESS_START_TIME, matchers)} offset {offset_s}s"
    return f"(time() - {offset_s} - {start}) > {grace_s}"


def _mature_rate(metric: str, scope: Scope, window: str, grace_s: int, offset_s: int) -> str:
    offset = f" offset {offset_s}s" if offset_s else ""
    rate = f"rate({series(metric, scope.engine)}[{window}]{offset})"
    mature = _mature(scope.engine, grace_s, offset_s)
    return f"sum by ({BY_RESOURCE}) ({per_resource(f'{rate} and on (namespace, pod) {mature}')})"


def mature_hit_rate(scope: Scope, grace_s: int, offset_s: int = 0, window: str = "5m") -> str:
    """Hit rate per resource over ``window`` ending ``offset_s`` ago, counting only engine
    pods that had been up longer than ``grace_s`` then (a new pod's cold cache is warm-up
    noise, not a decline)."""
    hits = _mature_rate(VLLM_PREFIX_CACHE_HITS, scope, window, grace_s, offset_s)
    queries = _mature_rate(VLLM_PREFIX_CACHE_QUERIES, scope, window, grace_s, offset_s)
    return f"({hits}) / ({queries})"


def hit_rate_declining(scope: Scope, drop_fraction: float, grace_s: int, lookback_s: int) -> str:
    """The 5m hit rate is more than ``drop_fraction`` below its value ``lookback_s`` ago."""
    now = mature_hit_rate(scope, grace_s)
    then = mature_hit_rate(scope, grace_s, offset_s=lookback_s)
    return f"{now}\n< {1 - drop_fraction:g} * {then}"


def kv_cache_saturated(scope: Scope, threshold: float) -> str:
    """Mean KV cache usage per resource above ``threshold``."""
    usage = per_resource(series(VLLM_KV_CACHE_USAGE, scope.engine))
    return f"avg by ({BY_RESOURCE}) ({usage}) > {threshold:g}"


def replicas_at_max(scope: Scope, max_replicas: int | None) -> str:
    """Resources whose engine count reached the maximum.

    With ``max_replicas`` known (a rendered resource): engine pods reporting vLLM series.
    Unknown (the fleet): kube-state-metrics' view of the engine HPA, named ``<name>-engine``
    (HPA backend) or ``keda-hpa-<name>-engine`` (KEDA).
    """
    if max_replicas is not None:
        pods = f"max by (namespace, pod) ({series(VLLM_REQUESTS_WAITING, scope.engine)})"
        return f"count by ({BY_RESOURCE}) ({per_resource(pods)}) >= {max_replicas}"
    at_max = f"{KSM_HPA_CURRENT} >= {KSM_HPA_MAX}"
    return (
        f'max by ({BY_RESOURCE}) (label_replace({at_max}, "{RESOURCE_LABEL}", "$1",'
        f' "horizontalpodautoscaler", "(?:keda-hpa-)?(.+)-engine"))'
    )


def queue_growing_at_max(scope: Scope, max_replicas: int | None, window: str = "10m") -> str:
    """Waiting requests rising over ``window`` and non-zero while replicas are at max."""
    waiting = series(VLLM_REQUESTS_WAITING, scope.engine)
    rising = f"sum by ({BY_RESOURCE}) ({per_resource(f'deriv({waiting}[{window}])')}) > 0"
    queued = f"sum by ({BY_RESOURCE}) ({per_resource(waiting)}) > 0"
    at_max = replicas_at_max(scope, max_replicas)
    return f"({queued})\nand on ({BY_RESOURCE}) ({rising})\nand on ({BY_RESOURCE}) ({at_max})"


def preemptions_rising(scope: Scope, per_second: float, window: str = "5m") -> str:
    """Preemptions per second per resource above ``per_second``."""
    rate = per_resource(f"rate({series(VLLM_PREEMPTIONS, scope.engine)}[{window}])")
    return f"sum by ({BY_RESOURCE}) ({rate}) > {per_second:g}"


def target_down(scope: Scope, component: str) -> str:
    """Scrape targets of the engine or router pods that fail (``up == 0``)."""
    matchers = scope.engine if component == "engine" else scope.router
    return f"{per_resource(series('up', matchers), component)} == 0"


def too_few_up(scope: Scope, component: str, minimum: int) -> str:
    """Fewer than ``minimum`` healthy targets of one resource's engines or routers.

    Engine pods are counted by their vLLM series (a warm-up sidecar's target in the same
    pod does not count); router pods by ``up``. Absence counts as zero.
    """
    if component == "engine":
        healthy = f"max by (pod) ({series(VLLM_REQUESTS_RUNNING, scope.engine)})"
    else:
        healthy = f"{series('up', scope.router)} == 1"
    return f"(count({healthy}) or vector(0)) < {minimum}"


def first_block_new_fraction(namespace: str, name: str) -> str:
    """The largest share, over the resource's router pods and models, of requests whose first
    prefix block the router had never seen (prefix hygiene; ``status.metrics``)."""
    return f"max({ROUTER_NEW_FIRST_BLOCK_RATIO}{router_selector(namespace, name)})"


def warmup_timed_out(scope: Scope, window: str = "15m") -> str:
    """Engine pods whose warm-up timed out within ``window``.

    The counter goes 0 -> 1 once per pod; a pod is only scraped once Ready, which is after
    the timeout, so its first scraped value may already be 1: a series that is new within
    ``window`` with a value above 0 counts as well as an increase.
    """
    timeouts = series(WARMUP_TIMEOUTS, scope.engine)
    new = f"({timeouts} > 0 unless {timeouts} offset {window})"
    timed_out = f"increase({timeouts}[{window}]) > 0 or {new}"
    return f"count by ({BY_RESOURCE}) ({per_resource(timed_out)}) > 0"


def prefix_hygiene(scope: Scope, threshold: float) -> str:
    """Models whose share of never-seen first blocks is above ``threshold``, with the cause
    the router diagnosed as a label (only when the router has a verdict: not ``healthy``)."""
    by = f"{BY_RESOURCE}, model"
    ratio = per_resource(series(ROUTER_NEW_FIRST_BLOCK_RATIO, scope.router), "router")
    cause = per_resource(series(ROUTER_HYGIENE_CAUSE, scope.router, 'cause!="healthy"'), "router")
    return (
        f"(avg by ({by}) ({ratio}) > {threshold:g})\n"
        f"* on ({by}) group_left (cause)\n"
        f"topk by ({by}) (1, max by ({by}, cause) ({cause}))"
    )
