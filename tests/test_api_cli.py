"""``prefixserving crd``, ``validate`` and ``render`` as a user runs them."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from prefixserving.api import crd as crd_module
from prefixserving.cli import main
from render_examples import EXAMPLES


def run(*args: str) -> object:
    return CliRunner().invoke(main, list(args))


def test_crd_prints_both_crds_and_writes_files(tmp_path: Path) -> None:
    result = run("crd")
    assert result.exit_code == 0
    kinds = [d["spec"]["names"]["kind"] for d in yaml.safe_load_all(result.stdout)]
    assert kinds == ["PrefixServing", "ScalingPolicy"]
    result = run("crd", "--out-dir", str(tmp_path))
    assert result.exit_code == 0
    for name, generated in crd_module.crds().items():
        assert (tmp_path / name).read_text() == crd_module.dump(generated)


def test_validate_accepts_every_example() -> None:
    for path in sorted(EXAMPLES.glob("*.yaml")):
        result = run("validate", "-f", str(path))
        assert result.exit_code == 0, result.output
        assert "valid" in result.stdout


def test_validate_prints_every_problem_with_path_and_hint(tmp_path: Path) -> None:
    body = yaml.safe_load((EXAMPLES / "minimal.yaml").read_text())
    body["spec"]["engine"] = {"tensorParallelSize": 0, "gpus": 2}
    body["spec"]["router"] = {"algorithm": "random"}
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(body))
    result = run("validate", "-f", str(file))
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert "invalid" in lines[0]
    for path in ("spec.engine.tensorParallelSize", "spec.engine.gpus", "spec.router.algorithm"):
        (line,) = [line for line in lines if line.strip().startswith(path + ":")]
        assert "(hint: " in line


def test_validate_reports_yaml_errors(tmp_path: Path) -> None:
    file = tmp_path / "broken.yaml"
    file.write_text("spec: [unclosed\n")
    result = run("validate", "-f", str(file))
    assert result.exit_code == 1
    assert "not valid YAML" in result.stderr
    file.write_text("- a list\n- not an object\n")
    result = run("validate", "-f", str(file))
    assert result.exit_code == 1
    assert "document 1 (line 1): invalid" in result.stderr
    assert "a list, not a Kubernetes object" in result.stderr
    result = run("validate", "-f", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 2 and "does not exist" in result.stderr


def test_validate_reads_stdin() -> None:
    text = (EXAMPLES / "minimal.yaml").read_text()
    result = CliRunner().invoke(main, ["validate", "-f", "-"], input=text)
    assert result.exit_code == 0, result.output


def test_render_prints_a_yaml_stream_and_takes_the_policy_from_a_file(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "autoscaled-hpa.yaml").read_text()))
    policy, resource = docs
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "resource.yaml").write_text(yaml.safe_dump(resource))
    result = run("render", "-f", str(tmp_path / "resource.yaml"))
    assert result.exit_code == 1
    assert "--policy" in result.stderr and result.stdout == ""
    result = run(
        "render", "-f", str(tmp_path / "resource.yaml"), "--policy", str(tmp_path / "policy.yaml")
    )
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.stdout))
    (hpa,) = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert hpa["spec"]["minReplicas"] == policy["spec"]["minReplicas"]
