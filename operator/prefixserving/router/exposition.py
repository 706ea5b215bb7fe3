"""The router's Prometheus metrics, served at ``/metrics``.

Counters and the latency histogram are updated on the request path, so they are plain dicts
and lists (:class:`LabelledCounter`, :class:`LatencyHistogram`): one dict update or one
``bisect`` per event, no lock and no per-label child objects (the router runs on one event-loop
thread, and ``/metrics`` is rendered on that same thread). ``prometheus_client``'s ``Counter``
and ``Histogram`` cost several microseconds per update for their locks and label lookups.
Everything is exposed through one collector at scrape time; per-backend load gauges and prefix
hygiene are computed then too, so backends that left the pool disappear from the exposition
instead of leaving stale series.

=====================================================  =========================================
``prefixserving_router_requests_total``                backend, outcome (ok, client_error,
                                                       server_error, upstream_error,
                                                       disconnected, rejected, no_backend;
                                                       the endpoint picker: shed)
``prefixserving_router_decisions_total``               policy, decision (affinity, spilled,
                                                       fallback, balance; with engine
                                                       events: cached)
``prefixserving_router_retries_total``                 reason (connect_error, server_error,
                                                       read_error; the endpoint picker:
                                                       gateway)
``prefixserving_router_ejections_total``               backend
``prefixserving_router_added_latency_seconds``         histogram: time spent in the router
                                                       before the upstream request and after
                                                       its first byte (the endpoint picker:
                                                       from having the request to its pick)
``prefixserving_router_backend_in_flight``             backend (gauge)
``prefixserving_router_backend_waiting``               backend: scraped num_requests_waiting
``prefixserving_router_backend_kv_usage``              backend: scraped kv_cache_usage_perc
``prefixserving_router_backend_healthy``               backend: 1 when not ejected
``prefixserving_router_new_first_block_ratio``         model: prefix hygiene (router.hygiene)
``prefixserving_router_prefix_hygiene_cause``          model, cause: 1 for the current cause
``prefixserving_router_held_requests``                 requests waiting for a Ready engine
                                                       (router.hold; KEDA's activation)
``prefixserving_router_kv_events_lag_seconds``         backend: receipt time minus the
                                                       engine's timestamp of its last KV
                                                       event batch (router.kv_events)
``prefixserving_router_kv_events_blocks``              backend: block hashes the router
                                                       holds for the engine
``prefixserving_router_kv_events_batches_total``       backend: KV event batches applied
``prefixserving_router_kv_events_resyncs_total``       backend, outcome (replayed, cleared)
=====================================================  =========================================
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from prefixserving import constants
from prefixserving.router.backends import BackendPool
from prefixserving.router.hold import ReadyHold
from prefixserving.router.hygiene import PrefixHygiene

if TYPE_CHECKING:  # the KV event mode's dependencies are an extra: prefixserving[kv-events]
    from prefixserving.router.kv_events.subscriber import KvEventSubscriptions

PREFIX = "prefixserving_router"
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1
)  # fmt: skip


class LabelledCounter:
    """A counter with labels, kept as ``{label values: count}``; ``inc`` costs one dict update."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.values: dict[tuple[str, ...], int] = {}

    def inc(self, *label_values: str) -> None:
        """Add one to the series of ``label_values`` (in the order of ``labels``)."""
        self.values[label_values] = self.values.get(label_values, 0) + 1

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for label_values, count in self.values.items():
            family.add_metric(label_values, count)
        return family


class LatencyHistogram:
    """A histogram without labels: per-bucket counts; ``observe`` costs one ``bisect``."""

    def __init__(self, name: str, documentation: str, buckets_s: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets_s
        self.counts = [0] * (len(buckets_s) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    def family(self) -> HistogramMetricFamily:
        cumulative = 0
        buckets = []
        for bound, count in zip(
            (*map(floatToGoString, self.bounds), "+Inf"), self.counts, strict=True
        ):
            cumulative += count
            buckets.append((bound, cumulative))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self.sum_s
        )


class _Collector(Collector):
    """The request-path counters and histogram, plus per-backend gauges and prefix hygiene
    read from the pool and hygiene at scrape time."""

    def __init__(
        self,
        metrics: RouterMetrics,
        pool: BackendPool,
        hygiene: PrefixHygiene,
        hold: ReadyHold,
        kv_events: KvEventSubscriptions | None,
    ) -> None:
        self.metrics = metrics
        self.pool = pool
        self.hygiene = hygiene
        self.hold = hold
        self.kv_events = kv_events

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for counter in (m.requests, m.decisions, m.retries, m.ejections):
            yield counter.family()
        yield m.added_latency.family()
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
        yield GaugeMetricFamily(
            constants.METRIC_ROUTER_HELD_REQUESTS,
            "Requests waiting for a Ready engine (none is Ready; KEDA's activation reads it).",
            value=self.hold.held,
        )
        if self.kv_events is not None:
            yield from _kv_event_families(self.kv_events)


def _kv_event_families(kv_events: KvEventSubscriptions) -> Iterator[Metric]:
    """Per followed engine: its last batch's lag, the blocks held, batches and resyncs."""
    lag = GaugeMetricFamily(
        f"{PREFIX}_kv_events_lag_seconds",
        "Receipt time minus the engine's timestamp of its last KV event batch.",
        labels=["backend"],
    )
    blocks = GaugeMetricFamily(
        f"{PREFIX}_kv_events_blocks",
        "Block hashes the router holds for the engine (bounded per engine).",
        labels=["backend"],
    )
    batches = CounterMetricFamily(
        f"{PREFIX}_kv_events_batches", "KV event batches applied.", labels=["backend"]
    )
    resyncs = CounterMetricFamily(
        f"{PREFIX}_kv_events_resyncs",
        "Resyncs after missed KV event batches: replayed, or cleared when the replay fell short.",
        labels=["backend", "outcome"],
    )
    sizes = kv_events.index.sizes()
    for backend, feed in sorted(kv_events.feeds.items()):
        if feed.lag_s is not None:
            lag.add_metric([backend], feed.lag_s)
        blocks.add_metric([backend], sizes.get(backend, 0))
        batches.add_metric([backend], feed.batches)
        for outcome, count in sorted(feed.resyncs.items()):
            resyncs.add_metric([backend, outcome], count)
    yield from (lag, blocks, batches, resyncs)


class RouterMetrics:
    """Every metric of one router instance, in its own registry (tests run several)."""

    def __init__(
        self,
        pool: BackendPool,
        hygiene: PrefixHygiene,
        hold: ReadyHold,
        kv_events: KvEventSubscriptions | None = None,
    ) -> None:
        self.requests = LabelledCounter(
            f"{PREFIX}_requests", "Proxied requests by backend and outcome.", ("backend", "outcome")
        )
        self.decisions = LabelledCounter(
            f"{PREFIX}_decisions", "Routing decisions by policy and reason.", ("policy", "decision")
        )
        self.retries = LabelledCounter(
            f"{PREFIX}_retries",
            "Requests retried on the next backend before the first byte.",
            ("reason",),
        )
        self.ejections = LabelledCounter(
            f"{PREFIX}_ejections", "Backends ejected after consecutive failures.", ("backend",)
        )
        self.added_latency = LatencyHistogram(
            f"{PREFIX}_added_latency_seconds",
            "Time spent in the router: before the upstream request plus after its first byte.",
            LATENCY_BUCKETS_S,
        )
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self, pool, hygiene, hold, kv_events))
