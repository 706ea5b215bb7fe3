"""The scaling signals evaluated by Prometheus' own engine (``promtool test rules``) on series
shaped like vLLM's and PEEK's: honest queue depth, backlog seconds for PEEK and stock engines,
KV cache usage, each without the pods still warming up, and the prometheus-adapter rules
computing the same per-pod values.

What a double misses here: the series are written by hand in the engines' label layout
(``namespace``, ``pod``, ``engine``, ``model_name``); ``tests/test_promql_real.py`` checks the
same queries against real vLLM engines scraped by a real Prometheus.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts_support import promtool
from prefixserving.autoscaling import promql
from prefixserving.peek.metrics import PEEK_HELD_SIBLINGS, PEEK_UNCACHED_WAITING_TOKENS

NAMESPACE, NAME = "llm", "chat"
ASSUMED_TOKENS_PER_S = 4000.0
PEEK_POD = "chat-engine-7c9d8f6b5-aaaaa"  # PEEK, measured throughput 2000 tokens/s
STOCK_POD = "chat-engine-7c9d8f6b5-bbbbb"  # FCFS, 500 uncached tokens/request, 1000 tokens/s
NEW_POD = "chat-engine-7c9d8f6b5-ccccc"  # PEEK, no prefill finished yet: assumed throughput
BURST_POD = "chat-engine-7c9d8f6b5-ddddd"  # PEEK, same-prefix burst: 50 waiting, 49 held
SKEW_POD = "chat-engine-7c9d8f6b5-eeeee"  # PEEK, held sampled above waiting
WARMING_POD = "chat-engine-7c9d8f6b5-ggggg"  # PEEK, warm-up still running: never counted
OTHER_POD = "chat-x-engine-7c9d8f6b5-fffff"  # another resource: never counted
EVAL_AT = "15m"


def labels(pod: str) -> str:
    return f'namespace="{NAMESPACE}",pod="{pod}",engine="0",model_name="m"'


def gauge(metric: str, pod: str, value: float) -> dict[str, str]:
    return {"series": f"{metric}{{{labels(pod)}}}", "values": f"{value:g}x20"}


def warmup_ready(pod: str, value: int) -> dict[str, str]:
    """The warm-up sidecar's gauge, scraped from its own port (other labels than the engine's)."""
    series = f'{promql.WARMUP_READY}{{namespace="{NAMESPACE}",pod="{pod}",container="warmup"}}'
    return {"series": series, "values": f"{value}x20"}


def counter(metric: str, pod: str, per_minute: float) -> dict[str, str]:
    return {"series": f"{metric}{{{labels(pod)}}}", "values": f"0+{per_minute:g}x20"}


def prefill(pod: str, tokens_per_s: float, seconds_per_s: float, requests_per_s: float) -> list:
    """vLLM's prefill histograms of ``pod`` growing at the given rates (1m samples)."""
    return [
        counter(promql.VLLM_PREFILL_COMPUTED_TOKENS + "_sum", pod, tokens_per_s * 60),
        counter(promql.VLLM_PREFILL_COMPUTED_TOKENS + "_count", pod, requests_per_s * 60),
        counter(promql.VLLM_PREFILL_TIME + "_sum", pod, seconds_per_s * 60),
        counter(promql.VLLM_PREFILL_TIME + "_count", pod, requests_per_s * 60),
    ]


def fleet() -> list[dict[str, str]]:
    waiting = promql.VLLM_REQUESTS_WAITING
    return [
        *(gauge(promql.VLLM_KV_CACHE_USAGE, pod, usage) for pod, usage in KV_USAGE.items()),
        gauge(promql.VLLM_KV_CACHE_USAGE, WARMING_POD, 0.05),
        gauge(promql.VLLM_KV_CACHE_USAGE, OTHER_POD, 1),
        warmup_ready(PEEK_POD, 1),  # warm-up finished: counted like a pod without warm-up
        gauge(waiting, PEEK_POD, 10),
        gauge(PEEK_HELD_SIBLINGS, PEEK_POD, 7),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, PEEK_POD, 8000),
        *prefill(PEEK_POD, tokens_per_s=2000, seconds_per_s=1, requests_per_s=2),
        gauge(waiting, STOCK_POD, 3),
        *prefill(STOCK_POD, tokens_per_s=500, seconds_per_s=0.5, requests_per_s=1),
        gauge(waiting, NEW_POD, 2),
        gauge(PEEK_HELD_SIBLINGS, NEW_POD, 0),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, NEW_POD, 6000),
        gauge(waiting, BURST_POD, 50),
        gauge(PEEK_HELD_SIBLINGS, BURST_POD, 49),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, BURST_POD, 2000),
        *prefill(BURST_POD, tokens_per_s=2000, seconds_per_s=1, requests_per_s=1),
        gauge(waiting, SKEW_POD, 1),
        gauge(PEEK_HELD_SIBLINGS, SKEW_POD, 2),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, SKEW_POD, 0),
        warmup_ready(WARMING_POD, 0),
        gauge(waiting, WARMING_POD, 4),
        gauge(PEEK_HELD_SIBLINGS, WARMING_POD, 0),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, WARMING_POD, 9000),
        *prefill(WARMING_POD, tokens_per_s=1000, seconds_per_s=1, requests_per_s=1),
        gauge(waiting, OTHER_POD, 100),
        gauge(PEEK_UNCACHED_WAITING_TOKENS, OTHER_POD, 100_000),
    ]


# Per serving pod: KV usage, waiting less held (floored at 0), uncached tokens over throughput.
KV_USAGE = {PEEK_POD: 0.6, STOCK_POD: 0.4, NEW_POD: 0.1, BURST_POD: 0.9, SKEW_POD: 0.5}
HONEST_WAITING = {PEEK_POD: 3, STOCK_POD: 3, NEW_POD: 2, BURST_POD: 1, SKEW_POD: 0}
BACKLOG_S = {
    PEEK_POD: 8000 / 2000,
    STOCK_POD: 3 * 500 / 1000,  # stock: waiting x mean uncached tokens per request
    NEW_POD: 6000 / ASSUMED_TOKENS_PER_S,
    BURST_POD: 2000 / 2000,
    SKEW_POD: 0,
}


def run_expr_tests(tmp_path: Path, cases: list[tuple[str, list[dict[str, Any]]]]) -> None:
    """Evaluate each ``(expr, expected samples)`` at :data:`EVAL_AT` with promtool, rounded to
    1e-6 (``rate()`` extrapolation leaves float noise; promtool compares exactly)."""
    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": fleet(),
                "promql_expr_test": [
                    {"expr": f"round({expr}, 1e-6)", "eval_time": EVAL_AT, "exp_samples": samples}
                    for expr, samples in cases
                ],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def per_pod(values: dict[str, float], by: str) -> list[dict[str, Any]]:
    keys = [k.strip() for k in by.split(",")]
    return [
        {
            "labels": "{"
            + ",".join(f'{k}="{ {"namespace": NAMESPACE, "pod": p}[k] }"' for k in keys)
            + "}",
            "value": v,
        }
        for p, v in values.items()
    ]


def adapter_query(rule: dict[str, Any], pods: list[str]) -> str:
    """A rule's metricsQuery as prometheus-adapter fills it in for ``pods``."""
    matchers = f'namespace="{NAMESPACE}",pod=~"{"|".join(pods)}"'
    series = rule["seriesQuery"].split("{")[0]
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", matchers)
        .replace("<<.GroupBy>>", "pod")
    )


@pytest.mark.slow
def test_signals_per_pod_and_totals(tmp_path: Path) -> None:
    matchers = promql.engine_matchers(NAMESPACE, NAME)
    replicas = len(HONEST_WAITING)
    run_expr_tests(
        tmp_path,
        [
            (promql.honest_waiting_by_pod(matchers), per_pod(HONEST_WAITING, "namespace, pod")),
            (
                promql.backlog_seconds_by_pod(matchers, ASSUMED_TOKENS_PER_S),
                per_pod(BACKLOG_S, "namespace, pod"),
            ),
            (
                promql.kv_cache_usage(NAMESPACE, NAME),
                [{"value": sum(KV_USAGE.values()) / replicas}],
            ),
            (promql.queue_depth_total(NAMESPACE, NAME), [{"value": sum(HONEST_WAITING.values())}]),
            (
                promql.queue_depth_per_replica(NAMESPACE, NAME),
                [{"value": sum(HONEST_WAITING.values()) / replicas}],
            ),
            (
                promql.backlog_seconds_total(NAMESPACE, NAME, ASSUMED_TOKENS_PER_S),
                [{"value": sum(BACKLOG_S.values())}],
            ),
            (
                promql.backlog_seconds_per_replica(NAMESPACE, NAME, ASSUMED_TOKENS_PER_S),
                [{"value": sum(BACKLOG_S.values()) / replicas}],
            ),
        ],
    )


@pytest.mark.slow
def test_adapter_rules_compute_the_same_per_pod_values(tmp_path: Path) -> None:
    rules = {r["name"]["as"]: r for r in promql.adapter_rules(ASSUMED_TOKENS_PER_S)}
    pods = [*HONEST_WAITING, WARMING_POD]  # the HPA asks for every pod of the Deployment
    run_expr_tests(
        tmp_path,
        [
            (
                adapter_query(rules[promql.ADAPTER_METRIC_KV_CACHE_USAGE], pods),
                per_pod(KV_USAGE, "pod"),
            ),
            (
                adapter_query(rules[promql.ADAPTER_METRIC_REQUESTS_WAITING], pods),
                per_pod(HONEST_WAITING, "pod"),
            ),
            (
                adapter_query(rules[promql.ADAPTER_METRIC_BACKLOG_SECONDS], pods),
                per_pod(BACKLOG_S, "pod"),
            ),
        ],
    )
