"""Plain functions of the operator: settings, the CLI's flags, conditions, drift detection."""

from __future__ import annotations

import time
from typing import Any

import kopf
import pytest
from click.testing import CliRunner

from prefixserving.controller import cli, settings
from prefixserving.controller.drift import drifted


def test_settings_defaults_and_environment() -> None:
    default = settings.load({})
    assert default.all_namespaces and default.health_port == 8081 and default.log_format == "text"
    custom = settings.load(
        {
            "PREFIXSERVING_NAMESPACES": "llm, llm-staging",
            "PREFIXSERVING_PROMETHEUS_URL": "http://prom:9090",
            "PREFIXSERVING_LOG_FORMAT": "json",
            "PREFIXSERVING_PEERING": "prefixserving",
        }
    )
    assert custom.namespaces == ("llm", "llm-staging") and not custom.all_namespaces
    assert (custom.prometheus_url, custom.log_format, custom.peering) == (
        "http://prom:9090",
        "json",
        "prefixserving",
    )
    assert settings.load(settings.to_environ(custom)) == custom
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        settings.load({"PREFIXSERVING_LOG_FORMAT": "xml"})


def test_peering_priority_is_explicit_or_the_start_time() -> None:
    explicit = settings.load({"PREFIXSERVING_PEERING": "ha", "PREFIXSERVING_PEERING_PRIORITY": "7"})
    assert explicit.peering_priority == 7
    assert settings.load(settings.to_environ(explicit)) == explicit
    kopf_settings = kopf.OperatorSettings()
    settings.configure_kopf(kopf_settings, explicit)
    assert kopf_settings.peering.priority == 7
    assert kopf_settings.peering.lifetime == settings.PEERING_LIFETIME_S
    chart = settings.load({"PREFIXSERVING_PEERING": "ha"})  # what the chart passes
    assert chart.peering_priority is None
    before = time.time_ns() // 1000
    settings.configure_kopf(kopf_settings, chart)
    assert before <= kopf_settings.peering.priority <= time.time_ns() // 1000 < 2**53
    with pytest.raises(ValueError, match="PEERING_PRIORITY must be an integer"):
        settings.load({"PREFIXSERVING_PEERING_PRIORITY": "high"})


def run_cli(monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Any, settings.Settings | None]:
    captured: dict[str, settings.Settings] = {}
    monkeypatch.setattr(cli, "run", lambda s, verbose=False: captured.setdefault("s", s))
    for key in settings.to_environ(settings.Settings()):
        monkeypatch.setenv(key, "")  # recorded, so the CLI's exports are undone afterwards
    result = CliRunner().invoke(cli.operator, list(args))
    return result, captured.get("s")


def test_cli_flags_become_settings_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    result, chosen = run_cli(
        monkeypatch,
        "--namespace",
        "a",
        "--namespace",
        "b",
        "--prometheus-url",
        "http://p:9090",
        "--log-format",
        "json",
        "--peering",
        "ha",
        "--priority",
        "3",
        "--health-port",
        "9000",
    )
    assert result.exit_code == 0, result.output
    assert chosen == settings.Settings(
        namespaces=("a", "b"),
        prometheus_url="http://p:9090",
        log_format="json",
        peering="ha",
        peering_priority=3,
        health_port=9000,
    )
    import os

    assert settings.load(os.environ) == chosen  # what kopf's handlers module will read


def test_cli_all_namespaces_and_conflicts(monkeypatch: pytest.MonkeyPatch) -> None:
    result, chosen = run_cli(monkeypatch, "--all-namespaces")
    assert result.exit_code == 0 and chosen is not None and chosen.all_namespaces
    result, chosen = run_cli(monkeypatch, "--all-namespaces", "--namespace", "x")
    assert result.exit_code == 2 and chosen is None and "either --namespace" in result.output


def test_drift_ignores_what_others_add_and_finds_what_changed() -> None:
    desired = {
        "metadata": {"labels": {"a": "1"}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    actual = {
        "metadata": {"labels": {"a": "1", "argo": "y"}, "annotations": {"flux": "z"}},
        "spec": {
            "replicas": 5,
            "containers": [{"name": "c", "image": "x", "imagePullPolicy": "IfNotPresent"}],
        },
        "status": {"readyReplicas": 1},
    }
    assert drifted(desired, actual) == []
    actual["spec"]["containers"][0]["image"] = "evil"
    assert drifted(desired, actual) == ["spec.containers[0].image"]
    actual["spec"]["containers"].append({"name": "sidecar"})
    assert drifted(desired, actual) == ["spec.containers"]
    assert drifted(desired, {"spec": {}}) == ["metadata", "spec.containers"]


def test_every_flag_the_chart_passes_exists(repo_root: Any) -> None:
    import re

    template = (repo_root / "charts/prefixserving-operator/templates/deployment.yaml").read_text()
    assert 'command: ["prefixserving", "operator"]' in template
    passed = set(re.findall(r"^\s*- (--[a-z-]+)", template, flags=re.MULTILINE))
    accepted = {opt for param in cli.operator.params for opt in param.opts}
    assert passed and passed <= accepted, passed - accepted
