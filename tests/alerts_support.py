"""Run alerting rules through ``promtool test rules`` against recorded input series.

``promtool`` evaluates the rules on its own in-memory Prometheus engine (the same PromQL
engine as the server) over series given in the expanding notation (``0+60x30``: 31 samples
from 0 rising by 60 per interval; ``_`` marks a missing sample). Annotations are templates
checked by ``promtool check rules``; the expression tests strip them so each case states only
the labels it expects.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from prefixserving.api.types import PrefixServing

NAMESPACE = "llm"
NAME = "demo"
ENGINE_PODS = ("demo-engine-7c9d8f6b5-x2k9p", "demo-engine-7c9d8f6b5-m4n7q")
ROUTER_POD = "demo-router-6b7c8d9f4-q8w2e"
# A pod of another resource in the same namespace whose name starts like ours.
OTHER_ENGINE_POD = "demo-engine-x-engine-5f6d7c8b9-z1y2x"


def promtool() -> str:
    from conftest import tool

    return tool("promtool")


def resource(**spec: Any) -> PrefixServing:
    """A PrefixServing ``llm/demo`` with alerts enabled, updated with ``spec`` (API keys)."""
    body: dict[str, Any] = {
        "model": {"servedName": "m", "source": {"pvc": {"claimName": "models"}}},
        "monitoring": {"alerts": {"enabled": True}},
    }
    body.update(spec)
    return PrefixServing.model_validate(
        {"metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": body}
    )


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
        for g in groups
    ]


def engine_series(metric: str, pod: str, values: str, **labels: str) -> dict[str, str]:
    """An input series of an engine pod, with the labels vLLM and Kubernetes discovery give
    (``up`` and ``process_start_time_seconds`` carry only the discovery labels)."""
    vllm = {"engine": "0", "model_name": "m"} if metric.startswith("vllm:") else {}
    all_labels = {
        "namespace": NAMESPACE,
        "pod": pod,
        "instance": f"{pod}:8000",
        "job": "demo-engine",
        **vllm,
        **labels,
    }
    return {"series": series_name(metric, all_labels), "values": values}


def router_series(metric: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {
        "namespace": NAMESPACE,
        "pod": ROUTER_POD,
        "instance": f"{ROUTER_POD}:8080",
        "job": "demo-router",
        **labels,
    }
    return {"series": series_name(metric, all_labels), "values": values}


def series_name(metric: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric}{{{inner}}}"


def run_promtool_test(
    tmp_path: Path,
    groups: list[dict[str, Any]],
    input_series: list[dict[str, str]],
    alert_tests: list[dict[str, Any]],
) -> None:
    """Write the rules and one test case, run ``promtool test rules``; fail with its output."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": without_annotations(groups)}, sort_keys=False))
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series, "alert_rule_test": alert_tests}],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(test, sort_keys=False))
    done = subprocess.run(
        [promtool(), "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def expect(alertname: str, at: str, *alerts: dict[str, str]) -> dict[str, Any]:
    """An ``alert_rule_test`` entry: at ``at``, exactly ``alerts`` (label sets) are firing."""
    return {
        "eval_time": at,
        "alertname": alertname,
        "exp_alerts": [{"exp_labels": labels} for labels in alerts],
    }
