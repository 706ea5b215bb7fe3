"""status.metrics from a real Prometheus (Debian package) scraping exporters that serve vLLM's
metric names with known values; with Prometheus stopped the reconcile still works and only the
MetricsAvailable condition says why."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest

from prefixserving.api import lifecycle
from prefixserving.controller import status_metrics
from prefixserving.controller.kube import DEPLOYMENT
from prefixserving.peek.metrics import PEEK_INFO
from prefixserving_lab.runners.stack.prometheus import running_prometheus
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.operator_harness import Harness

NAMESPACE, NAME = "t-metrics", "chat"
POD = f"{NAME}-engine-7d9f8c6b5-x2k4p"  # what the Deployment's pods are called
ENGINE_PODS = (POD, f"{NAME}-engine-7d9f8c6b5-m4n8q")  # one per engine: queue depth is per pod
ROUTER_POD = f"{NAME}-router-5c8d7b9f4-q7w2z"


class Exporter:
    """One fake engine: vLLM's series with fixed gauges and counters growing at a fixed ratio."""

    def __init__(
        self,
        engine: str,
        kv_usage: float,
        waiting: float,
        hit_ratio: float,
        peek: tuple[str, str] = ("AsyncScheduler", ""),
    ) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        labels = {"engine": engine, "model_name": "tiny-llama"}
        gauge = prometheus_client.Gauge
        counter = prometheus_client.Counter
        info = gauge(PEEK_INFO, "PEEK", [*labels, "base", "fallback"], registry=self.registry)
        info.labels(**labels, base=peek[0], fallback=peek[1]).set(1)
        kv = gauge("vllm:kv_cache_usage_perc", "KV usage", list(labels), registry=self.registry)
        kv.labels(**labels).set(kv_usage)
        queue = gauge("vllm:num_requests_waiting", "waiting", list(labels), registry=self.registry)
        queue.labels(**labels).set(waiting)
        self.queries = counter(
            "vllm:prefix_cache_queries", "q", list(labels), registry=self.registry
        ).labels(**labels)
        self.hits = counter(
            "vllm:prefix_cache_hits", "h", list(labels), registry=self.registry
        ).labels(**labels)
        self.hit_ratio = hit_ratio
        self.server, self.thread = prometheus_client.start_http_server(
            0, "127.0.0.1", self.registry
        )
        self.address = f"127.0.0.1:{self.server.server_port}"

    def tick(self, tokens: float) -> None:
        self.queries.inc(tokens)
        self.hits.inc(tokens * self.hit_ratio)

    def close(self) -> None:
        self.server.shutdown()


class RouterExporter:
    """One fake router whose prefix hygiene found timestamps before the shared prefix."""

    def __init__(self, new_first_block_ratio: float, cause: str) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        ratio = prometheus_client.Gauge(
            "prefixserving_router_new_first_block_ratio", "r", ["model"], registry=self.registry
        )
        ratio.labels(model="tiny-llama").set(new_first_block_ratio)
        causes = prometheus_client.Gauge(
            "prefixserving_router_prefix_hygiene_cause", "c", ["model", "cause"],
            registry=self.registry,
        )  # fmt: skip
        causes.labels(model="tiny-llama", cause=cause).set(1)
        self.server, self.thread = prometheus_client.start_http_server(
            0, "127.0.0.1", self.registry
        )
        self.address = f"127.0.0.1:{self.server.server_port}"


@pytest.fixture
def router_exporter() -> Iterator[RouterExporter]:
    exporter = RouterExporter(0.97, "timestamp")
    yield exporter
    exporter.server.shutdown()


@pytest.fixture
def exporters() -> Iterator[list[Exporter]]:
    running = [
        Exporter("0", 0.5, 4, 0.75),
        Exporter("1", 0.3, 2, 0.25, peek=("Scheduler", "hybrid KV cache layout (a, b)")),
    ]
    stop = threading.Event()

    def traffic() -> None:  # both engines see the same token rate; hit ratios 0.75 and 0.25
        while not stop.wait(0.05):
            for exporter in running:
                exporter.tick(100)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    yield running
    stop.set()
    thread.join()
    for exporter in running:
        exporter.close()


def metrics_of(h: Harness) -> dict:
    return (h.prefixserving(NAMESPACE, NAME).get("status") or {}).get("metrics") or {}


@pytest.mark.slow
def test_status_metrics_from_prometheus_then_prometheus_down(
    exporters: list[Exporter], router_exporter: RouterExporter, tmp_path: Path
) -> None:
    targets = [e.address for e in exporters] + [router_exporter.address]
    with running_prometheus(
        targets,
        extra_labels={"namespace": NAMESPACE, "pod": POD},
        target_labels={
            router_exporter.address: {"pod": ROUTER_POD},
            **{e.address: {"pod": pod} for e, pod in zip(exporters, ENGINE_PODS, strict=True)},
        },
    ) as prom:
        harness = Harness(tmp_path, env={"PREFIXSERVING_PROMETHEUS_URL": prom.url})
        try:
            harness.start_operator()
            harness.create(resource(NAME, NAMESPACE))
            # Each engine's own hit ratio is exact at any time; the fleet's (0.75 and 0.25 at
            # equal token rates: 0.5) converges as the 5m window fills with samples.
            figures = wait_for(
                lambda: (
                    (m := metrics_of(harness)).get("hitRate") is not None
                    and abs(m["hitRate"] - 0.5) < 0.03
                    and m
                ),
                timeout_s=90,
                what="status.metrics with the fleet hit rate",
            )
            assert figures["kvCacheUsage"] == pytest.approx(0.4, abs=1e-6)
            assert figures["queueDepth"] == pytest.approx(3.0, abs=1e-6)
            assert figures["asOf"]
            # Prefix hygiene from the router: the share and a hint naming the cause.
            assert figures["firstBlockNewFraction"] == pytest.approx(0.97, abs=1e-6)
            peek_hint, hint = harness.prefixserving(NAMESPACE, NAME)["status"]["hints"]
            assert "97%" in hint and "timestamp" in hint and "tiny-llama" in hint
            # Which vLLM scheduler PEEK runs on, and why an engine keeps vLLM's order.
            assert figures["schedulerBase"] == "AsyncScheduler (1), Scheduler (1)"
            assert "1 engine(s)" in peek_hint and "hybrid KV cache layout" in peek_hint
            available = harness.condition(NAMESPACE, NAME, lifecycle.COND_METRICS)
            assert available is not None and available["status"] == "True"

            prom.stop()
            down = wait_for(
                lambda: (
                    (c := harness.condition(NAMESPACE, NAME, lifecycle.COND_METRICS))
                    and c["status"] == "False"
                    and c
                ),
                timeout_s=30,
                what="MetricsAvailable=False",
            )
            assert down["reason"] == lifecycle.REASON_PROMETHEUS_UNAVAILABLE
            assert prom.url in down["message"]

            # The reconcile is unaffected: a spec change still rolls out.
            harness.patch_spec(NAMESPACE, NAME, {"replicas": 3})
            wait_for(
                lambda: (
                    (harness.get(DEPLOYMENT, NAMESPACE, f"{NAME}-engine") or {})
                    .get("spec", {})
                    .get("replicas")
                    == 3
                ),
                what="rollout with Prometheus down",
            )
            wait_for(
                lambda: (
                    (b := harness.prefixserving(NAMESPACE, NAME))["status"]["observedGeneration"]
                    == b["metadata"]["generation"]
                ),
                what="observedGeneration with Prometheus down",
            )
            degraded = harness.condition(NAMESPACE, NAME, lifecycle.COND_DEGRADED)
            assert degraded is not None and degraded["status"] == "False"
            assert metrics_of(harness)["kvCacheUsage"] == pytest.approx(0.4, abs=1e-6)
        finally:
            harness.close()


def test_slow_prometheus_is_reported_within_the_timeout() -> None:
    answer = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        """A Prometheus that answers only when the test lets it (the condition under test)."""

        def do_GET(self) -> None:
            answer.wait(timeout=60)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        started = time.monotonic()
        with pytest.raises(status_metrics.MetricsUnavailable, match=r"did not answer within 0\.5s"):
            status_metrics.query(url, NAMESPACE, NAME, timeout_s=0.5)
        # Far from the 60 s the server holds its answer: the query gave up at its timeout.
        assert time.monotonic() - started < 30
    finally:
        answer.set()
        server.shutdown()
        server.server_close()


def test_unreachable_prometheus_names_the_address() -> None:
    with pytest.raises(status_metrics.MetricsUnavailable, match=r"127\.0\.0\.1:9 is unreachable"):
        status_metrics.query("http://127.0.0.1:9", NAMESPACE, NAME, timeout_s=1)
