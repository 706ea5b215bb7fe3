"""Plain functions of the operator: settings, the CLI's flags, conditions, drift detection."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from prefixserving import constants
from prefixserving.controller import cli, settings
from prefixserving.controller import conditions as cond
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
        "--health-port",
        "9000",
    )
    assert result.exit_code == 0, result.output
    assert chosen == settings.Settings(
        namespaces=("a", "b"),
        prometheus_url="http://p:9090",
        log_format="json",
        peering="ha",
        health_port=9000,
    )
    import os

    assert settings.load(os.environ) == chosen  # what kopf's handlers module will read


def test_cli_all_namespaces_and_conflicts(monkeypatch: pytest.MonkeyPatch) -> None:
    result, chosen = run_cli(monkeypatch, "--all-namespaces")
    assert result.exit_code == 0 and chosen is not None and chosen.all_namespaces
    result, chosen = run_cli(monkeypatch, "--all-namespaces", "--namespace", "x")
    assert result.exit_code == 2 and chosen is None and "either --namespace" in result.output


def test_condition_transitions_keep_time_when_status_holds() -> None:
    first, transitions = cond.apply(
        [], [cond.Condition(constants.COND_READY, False, "EngineUnavailable", "0/2")], 1, "t1"
    )
    assert [t.warning for t in transitions] == [True]
    second, transitions = cond.apply(
        first, [cond.Condition(constants.COND_READY, False, "EngineUnavailable", "1/2")], 1, "t2"
    )
    assert transitions == [] and second[0]["lastTransitionTime"] == "t1"
    assert second[0]["message"] == "1/2"
    third, transitions = cond.apply(
        second,
        [
            cond.Condition(constants.COND_READY, True, "AllReplicasReady"),
            cond.Condition(constants.COND_DEGRADED, False, "Reconciled"),
        ],
        2,
        "t3",
    )
    assert [(t.condition.type, t.warning) for t in transitions] == [
        (constants.COND_READY, False),
        (constants.COND_DEGRADED, False),
    ]
    assert [c["type"] for c in third] == [constants.COND_READY, constants.COND_DEGRADED]
    assert third[0]["lastTransitionTime"] == "t3" and third[0]["observedGeneration"] == 2


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
