"""The router's Prometheus metrics, served at ``/metrics``.

Counters and the latency histogram are updated on the request path. Per-backend load gauges
and prefix hygiene are computed at scrape time by a collector, so backends that left the pool
disappear from the exposition instead of leaving stale series.

=====================================================  =========================================
``prefixserving_router_requests_total``                backend, outcome (ok, client_error,
                                                       server_error, upstream_error,
                                                       disconnected, rejected, no_backend)
``prefixserving_router_decisions_total``               policy, decision (affinity, spilled,
                                                       fallback, balance)
``prefixserving_router_retries_total``                 reason (connect_error, server_error,
                                                       read_error)
``prefixserving_router_ejections_total``               backend
``prefixserving_router_added_latency_seconds``         histogram: time spent in the router
                                                       before the upstream request and after
                                                       its first byte
``prefixserving_router_backend_in_flight``             backend (gauge)
``prefixserving_router_backend_waiting``               backend: scraped num_requests_waiting
``prefixserving_router_backend_kv_usage``              backend: scraped kv_cache_usage_perc
``prefixserving_router_backend_healthy``               backend: 1 when not ejected
``prefixserving_router_new_first_block_ratio``         model: prefix hygiene (router.hygiene)
``prefixserving_router_prefix_hygiene_cause``          model, cause: 1 for the current cause
=====================================================  =========================================
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prefixserving import constants
from prefixserving.router.backends import BackendPool
from prefixserving.router.hygiene import PrefixHygiene

PREFIX = "prefixserving_router"
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1
)  # fmt: skip


class _StateCollector(Collector):
    """Per-backend gauges and prefix hygiene, read from the pool and hygiene at scrape time."""

    def __init__(self, pool: BackendPool, hygiene: PrefixHygiene) -> None:
        self.pool = pool
        self.hygiene = hygiene

    def collect(self) -> Iterator[Metric]:
        gauges = {
            name: GaugeMetricFamily(f"{PREFIX}_backend_{name}", doc, labels=["backend"])
            for name, doc in (
                ("in_flight", "Requests this router has in flight to the backend."),
                ("waiting", "vllm:num_requests_waiting at the last scrape."),
                ("kv_usage", "vllm:kv_cache_usage_perc at the last scrape (0..1)."),
                ("healthy", "1 when the backend takes traffic, 0 while it is ejected."),
            )
        }
        for url in self.pool.members:
            state = self.pool.state(url)
            if state is None:
                continue
            gauges["in_flight"].add_metric([url], state.in_flight)
            gauges["waiting"].add_metric([url], state.waiting)
            gauges["kv_usage"].add_metric([url], state.kv_usage)
            gauges["healthy"].add_metric([url], float(state.ejected_until is None))
        yield from gauges.values()
        ratio = GaugeMetricFamily(
            constants.METRIC_ROUTER_NEW_FIRST_BLOCK_RATIO,
            "Fraction of recent requests whose first prefix block was never seen before.",
            labels=["model"],
        )
        cause = GaugeMetricFamily(
            constants.METRIC_ROUTER_HYGIENE_CAUSE,
            "1 for the likely cause of new first blocks (healthy when the ratio is low).",
            labels=["model", "cause"],
        )
        for report in self.hygiene.report():
            ratio.add_metric([report.model], report.new_ratio)
            cause.add_metric([report.model, report.cause.value], 1.0)
        yield ratio
        yield cause


class RouterMetrics:
    """Every metric of one router instance, in its own registry (tests run several)."""

    def __init__(self, pool: BackendPool, hygiene: PrefixHygiene) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Proxied requests by backend and outcome.",
            ["backend", "outcome"],
            registry=self.registry,
        )
        self.decisions = Counter(
            f"{PREFIX}_decisions",
            "Routing decisions by policy and reason.",
            ["policy", "decision"],
            registry=self.registry,
        )
        self.retries = Counter(
            f"{PREFIX}_retries",
            "Requests retried on the next backend before the first byte.",
            ["reason"],
            registry=self.registry,
        )
        self.ejections = Counter(
            f"{PREFIX}_ejections",
            "Backends ejected after consecutive failures.",
            ["backend"],
            registry=self.registry,
        )
        self.added_latency = Histogram(
            f"{PREFIX}_added_latency_seconds",
            "Time spent in the router: before the upstream request plus after its first byte.",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(pool, hygiene))
