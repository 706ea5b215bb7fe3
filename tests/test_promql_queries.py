"""The PromQL module without a server: series selection, the scalers' use of it, the adapter
rules' naming, and that every expression parses (``promtool check rules``)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from alerts_support import promtool
from prefixserving.api import defaults
from prefixserving.api.types import PrefixServing
from prefixserving.autoscaling import alerts, dashboard, promql
from prefixserving.render import render_children


def resource(name: str, namespace: str, backend: str) -> PrefixServing:
    return PrefixServing.model_validate(
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "model": {"servedName": "m", "source": {"pvc": {"claimName": "models"}}},
                "autoscaling": {"enabled": True, "backend": backend},
            },
        }
    )


def child(backend: str, kind: str, name: str = "chat", namespace: str = "team-a") -> dict:
    (obj,) = [o for o in render_children(resource(name, namespace, backend)) if o["kind"] == kind]
    return obj


def regex_of(matchers: str) -> str:
    """The pod regex of matchers like ``namespace="x",pod=~"..."``."""
    (found,) = re.findall(r'pod=~"([^"]+)"', matchers)
    return found


@pytest.mark.parametrize(
    ("pod", "selected"),
    [
        ("chat-engine-7c9d8f6b5-x2k9p", True),
        ("chat-engine-x-engine-7c9d8f6b5-x2k9p", False),  # resource "chat-engine-x"
        ("chat-router-7c9d8f6b5-x2k9p", False),
        ("other-chat-engine-7c9d8f6b5-x2k9p", False),
        ("chat-engine-7c9d8f6b5", False),  # not a Deployment's pod
    ],
)
def test_engine_pods_of_one_resource(pod: str, selected: bool) -> None:
    # Prometheus anchors label regexes: fullmatch is what it does.
    regex = regex_of(promql.resource_scope("team-a", "chat").engine)
    assert bool(re.fullmatch(regex, pod)) == selected


@pytest.mark.parametrize(
    ("pod", "component", "resource_name"),
    [
        ("chat-engine-7c9d8f6b5-x2k9p", "engine", "chat"),
        ("chat-engine-x-engine-7c9d8f6b5-x2k9p", "engine", "chat-engine-x"),
        ("a-b-router-6b7c8d9f4-q8w2e", "router", "a-b"),
    ],
)
def test_fleet_recovers_the_resource_name(pod: str, component: str, resource_name: str) -> None:
    fleet = promql.FLEET.engine if component == "engine" else promql.FLEET.router
    assert re.fullmatch(regex_of(fleet), pod)
    (pattern,) = re.findall(r'"pod", "([^"]+)"\)$', promql.per_resource("x", component))
    match = re.fullmatch(pattern, pod)
    assert match is not None and match.group(1) == resource_name


def test_scaled_object_runs_the_status_queries() -> None:
    """KEDA scales on the same KV query the status shows, on the total honest queue and on
    the total backlog seconds (the default signals, with the default assumed throughput)."""
    triggers = {t["name"]: t for t in child("keda", "ScaledObject")["spec"]["triggers"]}
    assert set(triggers) == {"kv-cache-usage", "queue-depth", "backlog-seconds"}
    kv, queue, backlog = (
        triggers["kv-cache-usage"],
        triggers["queue-depth"],
        triggers["backlog-seconds"],
    )
    assert kv["metadata"]["query"] == promql.kv_cache_usage("team-a", "chat")
    assert kv["metricType"] == "Value"
    assert queue["metadata"]["query"] == promql.queue_depth_total("team-a", "chat")
    assert queue["metricType"] == "AverageValue"
    assumed = defaults.PREFILL_TOKENS_PER_S
    assert backlog["metadata"]["query"] == promql.backlog_seconds_total("team-a", "chat", assumed)
    assert backlog["metricType"] == "AverageValue"
    assert backlog["metadata"]["threshold"] == f"{defaults.TARGET_BACKLOG_SECONDS:g}"


def test_every_hpa_metric_is_served_by_one_adapter_rule() -> None:
    """prometheus-adapter names each discovered series by its rule; the HPA must ask for
    exactly those names, as Pods metrics."""
    rules = promql.adapter_rules(defaults.PREFILL_TOKENS_PER_S)
    metrics = child("hpa", "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert {m["type"] for m in metrics} == {"Pods"}
    served = {}
    for rule in rules:
        (series,) = re.findall(r"^([a-z_:]+)\{", rule["seriesQuery"])
        assert re.search(rule["name"]["matches"], series)
        served[re.sub(rule["name"]["matches"], rule["name"]["as"], series)] = series
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
        for variable in ("<<.LabelMatchers>>", "<<.GroupBy>>"):
            assert variable in rule["metricsQuery"]
    assert {m["pods"]["metric"]["name"] for m in metrics} == set(served)
    assert served == {
        promql.ADAPTER_METRIC_KV_CACHE_USAGE: promql.VLLM_KV_CACHE_USAGE,
        promql.ADAPTER_METRIC_REQUESTS_WAITING: promql.VLLM_REQUESTS_WAITING,
        promql.ADAPTER_METRIC_BACKLOG_SECONDS: promql.VLLM_REQUESTS_RUNNING,
    }


def every_expression() -> list[str]:
    """Each query of the module, the alerts and the dashboard (Grafana variables filled in)."""
    exprs = [
        promql.kv_cache_usage("ns", "a"),
        promql.queue_depth_total("ns", "a"),
        promql.queue_depth_per_replica("ns", "a"),
        promql.backlog_seconds_total("ns", "a", defaults.PREFILL_TOKENS_PER_S),
        promql.backlog_seconds_per_replica("ns", "a", defaults.PREFILL_TOKENS_PER_S),
        promql.prefix_cache_hit_rate("ns", "a"),
        promql.new_first_block_ratio("ns", "a"),
    ]
    for rule in promql.adapter_rules(defaults.PREFILL_TOKENS_PER_S):
        exprs.append(
            rule["metricsQuery"]
            .replace("<<.Series>>", promql.VLLM_KV_CACHE_USAGE)
            .replace("<<.LabelMatchers>>", 'namespace="ns",pod=~"p1|p2"')
            .replace("<<.GroupBy>>", "pod")
        )
    exprs += [r["expr"] for g in alerts.fleet_groups() for r in g["rules"]]
    exprs += [
        q.replace(dashboard.NAMESPACE_VAR, "ns").replace(dashboard.RESOURCE_VAR, "a")
        for q in dashboard.queries()
    ]
    return exprs


@pytest.mark.slow
def test_every_expression_parses(tmp_path: Path) -> None:
    exprs = every_expression()
    rules = [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
    path = tmp_path / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in done.stdout
