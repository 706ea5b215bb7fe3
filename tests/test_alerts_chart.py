"""The PrometheusRules (per resource and the chart's fleet defaults): schema, ``promtool check
rules``, annotation templates, and the fleet expressions on recorded series."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts_support import (
    ENGINE_PODS,
    NAMESPACE,
    engine_series,
    expect,
    promtool,
    resource,
    run_promtool_test,
    series_name,
)
from api_support import assert_all_valid
from conftest import ROOT, tool
from prefixserving.autoscaling import alerts, chart, promql
from prefixserving.render import render_children

CHART = ROOT / "charts" / "prefixserving-operator"
ALL_ALERTS = {
    "PrefixServingHitRateDeclining",
    "PrefixServingKVCacheSaturated",
    "PrefixServingQueueGrowingAtMax",
    "PrefixServingPreemptionsRising",
    "PrefixServingEngineDown",
    "PrefixServingRouterDown",
    "PrefixServingWarmupTimedOut",
    "PrefixServingPrefixHygiene",
}
SPECS = {
    "fixed replicas": {"replicas": 3},
    "autoscaled": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 6}},
    "scaled to zero": {"replicas": 0},
}


def helm_objects(*sets: str) -> list[dict[str, Any]]:
    args = [tool("helm"), "template", "pfx", str(CHART), "--namespace", "ops"]
    for value in sets:
        args += ["--set", value]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def check_rules(tmp_path: Path, groups: list[dict[str, Any]]) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def rendered_rule(**spec: Any) -> dict[str, Any]:
    (rule,) = [o for o in render_children(resource(**spec)) if o["kind"] == "PrometheusRule"]
    return rule


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(SPECS))
def test_resource_rule_is_valid(tmp_path: Path, variant: str) -> None:
    rule = rendered_rule(**SPECS[variant])
    assert_all_valid([rule], "1.35")
    check_rules(tmp_path, rule["spec"]["groups"])
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert names >= ALL_ALERTS
    # No engines expected: no "too few engines" alert, but the routers are still watched.
    assert ("PrefixServingEnginesMissing" in names) == (variant != "scaled to zero")
    assert "PrefixServingRoutersMissing" in names


@pytest.mark.slow
def test_no_rule_unless_enabled() -> None:
    off = resource(monitoring={"alerts": {"enabled": False}})
    assert not [o for o in render_children(off) if o["kind"] == "PrometheusRule"]
    defaults = helm_objects()
    assert not [o for o in defaults if o["kind"] == "PrometheusRule"]


@pytest.mark.slow
def test_chart_rule_is_valid_and_generated(tmp_path: Path) -> None:
    assert chart.drifted(CHART) == [], "run `prefixserving monitoring`"
    (rule,) = [
        o
        for o in helm_objects("prometheusRule.enabled=true", "prometheusRule.labels.release=kps")
        if o["kind"] == "PrometheusRule"
    ]
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == "ops"
    assert_all_valid([rule], "1.35")
    assert rule["spec"]["groups"] == alerts.fleet_groups()
    check_rules(tmp_path, rule["spec"]["groups"])
    assert {r["alert"] for r in rule["spec"]["groups"][0]["rules"]} == ALL_ALERTS


@pytest.mark.slow
def test_annotations_render(tmp_path: Path) -> None:
    """Annotations as Alertmanager receives them: the resource, the value, the fix."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rendered_rule()["spec"]["groups"]}))
    series = [engine_series(promql.VLLM_KV_CACHE_USAGE, pod, "0.95x20") for pod in ENGINE_PODS]
    fleet_rules = alerts.fleet_groups()[0]["rules"]
    (kv_rule,) = [r for r in fleet_rules if r["alert"] == "PrefixServingKVCacheSaturated"]
    description = kv_rule["annotations"]["description"].replace(
        "{{ $value | humanizePercentage }}", "95%"
    )
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "15m",
                        "alertname": "PrefixServingKVCacheSaturated",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "namespace": NAMESPACE,
                                    "prefixserving": "demo",
                                    "severity": "warning",
                                },
                                "exp_annotations": {
                                    "summary": "KV cache of llm/demo is saturated",
                                    "description": description,
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [promtool(), "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout
    assert "95%" in description


# ---------------------------------------------------------------- fleet rules on series


@pytest.mark.slow
def test_fleet_alerts_separate_resources(tmp_path: Path) -> None:
    """One rule set for every resource: each alert names the resource it is about."""
    series = [
        engine_series(promql.VLLM_KV_CACHE_USAGE, "demo-engine-7c9d8f6b5-x2k9p", "0.95x20"),
        engine_series(promql.VLLM_KV_CACHE_USAGE, "chat-engine-5b6c7d8e9-a1b2c", "0.30x20"),
        engine_series(
            promql.VLLM_KV_CACHE_USAGE, "chat-engine-5b6c7d8e9-d3e4f", "0.95x20", namespace="b"
        ),
    ]
    run_promtool_test(
        tmp_path,
        alerts.fleet_groups(),
        series,
        [
            expect(
                "PrefixServingKVCacheSaturated",
                "15m",
                {"namespace": NAMESPACE, "prefixserving": "demo", "severity": "warning"},
                {"namespace": "b", "prefixserving": "chat", "severity": "warning"},
            )
        ],
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hpa", "current", "fires"),
    [
        ("keda-hpa-demo-engine", 4, True),  # KEDA's HPA at its max
        ("demo-engine", 4, True),  # the HPA backend's own HPA at its max
        ("demo-engine", 3, False),  # room to scale
        ("keda-hpa-other-engine", 4, False),  # another resource at max
    ],
)
def test_fleet_queue_growing_uses_the_hpa(
    tmp_path: Path, hpa: str, current: int, fires: bool
) -> None:
    ksm = {"namespace": NAMESPACE, "horizontalpodautoscaler": hpa, "job": "kube-state-metrics"}
    series = [
        engine_series(promql.VLLM_REQUESTS_WAITING, ENGINE_PODS[0], "0+1x20"),
        {"series": series_name(promql.KSM_HPA_CURRENT, ksm), "values": f"{current}x20"},
        {"series": series_name(promql.KSM_HPA_MAX, ksm), "values": "4x20"},
    ]
    labels = {"namespace": NAMESPACE, "prefixserving": "demo", "severity": "warning"}
    run_promtool_test(
        tmp_path,
        alerts.fleet_groups(),
        series,
        [expect("PrefixServingQueueGrowingAtMax", "15m", *([labels] if fires else []))],
    )


def test_monitoring_command_writes_and_checks(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from prefixserving.cli import main

    runner = CliRunner()
    missing = runner.invoke(main, ["monitoring", "--chart-dir", str(tmp_path)])
    assert missing.exit_code == 2 and "Chart.yaml not found" in missing.output
    (tmp_path / "Chart.yaml").write_text("name: x\n")
    assert runner.invoke(main, ["monitoring", "--chart-dir", str(tmp_path)]).exit_code == 0
    assert (
        runner.invoke(main, ["monitoring", "--chart-dir", str(tmp_path), "--check"]).exit_code == 0
    )
    alerts_file = tmp_path / chart.ALERTS_FILE
    alerts_file.write_text(alerts_file.read_text().replace("0.9", "0.8"))
    stale = runner.invoke(main, ["monitoring", "--chart-dir", str(tmp_path), "--check"])
    assert stale.exit_code == 1
    assert chart.ALERTS_FILE in stale.output
