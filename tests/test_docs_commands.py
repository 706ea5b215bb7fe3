"""Every command in README.md, docs/ and the chart's README runs as written here, or, where it
needs a cluster, uses only names that exist (``docs_support`` says how commands are found and
what is checked). A failure names the doc file, the line and the command.

- Fast: the names each command uses (chart values, CLI flags and choices, make targets, files,
  resource types, CRD fields, rendered objects and containers, Event reasons, adapter
  metrics); every ``prefixserving`` command runs (``validate``/``render``/``crd`` as written,
  against the repo's examples where the doc names the user's own file; the others, which start
  a server or a long run, with ``--help``).
- Slow (real helm): every ``helm install|upgrade|template`` of this chart renders with
  ``helm template`` and the same flags (values.schema.json enforced), and every flag of every
  helm command exists in ``helm SUBCOMMAND --help``. Other projects' charts (KEDA,
  prometheus-adapter) cannot be fetched here: their values are not checked.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import tool
from docs_support import (
    CHART,
    OUR_CHARTS,
    REPO_DIRS,
    ROOT,
    Command,
    commands_in_line,
    doc_commands,
    helm_chart,
    helm_flags,
    helm_split,
    is_placeholder,
    resolve_cli,
    static_problems,
)
from prefixserving.cli import main

COMMANDS = doc_commands()
# Subcommands that finish quickly and touch nothing: run as the docs write them.
RUN_AS_WRITTEN = ("validate", "render", "crd")
# What a doc's own placeholder file (my-model.yaml, resource.yaml) stands for.
STAND_IN = "examples/minimal.yaml"
# Commands the docs show failing on purpose: (file, command as written) -> why. They must fail.
MEANT_TO_FAIL: dict[tuple[str, str], str] = {
    ("charts/prefixserving-operator/README.md", "--set replica=2"): "the typo the schema refuses",
}


def meant_to_fail(cmd: Command) -> bool:
    return (cmd.file, cmd.text) in MEANT_TO_FAIL


def label(cmd: Command) -> str:
    text = cmd.text if len(cmd.text) <= 60 else cmd.text[:57] + "..."
    return f"{cmd.file}:{cmd.line} {text}"


def validate_file(path: str) -> list[str]:
    result = CliRunner().invoke(main, ["validate", "-f", str(ROOT / path)])
    return [] if result.exit_code == 0 else [f"prefixserving validate: {result.output.strip()}"]


def test_the_docs_have_commands_of_every_kind() -> None:
    """The extraction finds what the docs hold (a parser that finds nothing checks nothing)."""
    programs = {cmd.program for cmd in COMMANDS}
    assert {"helm", "kubectl", "prefixserving", "make", "python"} <= programs
    assert len(COMMANDS) > 60
    assert any(cmd.file == "README.md" and "--set" in cmd.argv for cmd in COMMANDS)


# Wrong names each check must catch: (command, fragment of the problem it reports).
WRONG = [
    (
        "helm install p charts/prefixserving-operator --set prometheus.url=x",
        "no value 'prometheus'",
    ),
    ("helm upgrade p charts/prefixserving-operator --set image.tags=1", "no value 'image.tags'"),
    ("prefixserving router --wrokers 2", "has no option --wrokers"),
    ("prefixserving router --policy lifo", "'lifo' is not one of"),
    ("prefixserving rooter", "no subcommand 'rooter'"),
    ("make deploy", "no make target 'deploy'"),
    ("make vllm-contract RELEAS=0.33.0", "the Makefile sets no variable 'RELEAS'"),
    ("python bench/missing.py", "bench/missing.py does not exist"),
    ("kubectl apply -f examples/missing.yaml", "examples/missing.yaml does not exist"),
    ("kubectl get pfxs", "no resource type 'pfxs'"),
    ("kubectl get pfx a -o jsonpath='{.status.hitRate}'", "no field 'status.hitRate'"),
    (
        "kubectl get pfx a -o jsonpath='{.status.conditions[?(@.kind==\"R\")]}'",
        "'status.conditions.kind'",
    ),
    ("kubectl explain pfx.spec.engin", "no field 'spec.engin'"),
    (
        'kubectl patch pfx a --type merge -p \'{"spec":{"scheduler":{"policy":"lifo"}}}\'',
        "'lifo' is not one of",
    ),
    ("kubectl logs deploy/my-model-engines", "no Deployment"),
    ("kubectl logs deploy/my-model-engine -c sidecar", "no container 'sidecar'"),
    ("kubectl get events --field-selector reason=WarmupLate", "reason WarmupLate"),
    ("kubectl get --raw /apis/custom.metrics.k8s.io/v1beta1/namespaces/a/pods/*/kv", "metric 'kv'"),
    ("vllm serve M --scheduler-cls prefixserving.Peek", "is not prefixserving.engine.vllm"),
    ("wget http://x", "no check for 'wget'"),
]


@pytest.mark.parametrize(("text", "fragment"), WRONG)
def test_the_checks_catch_wrong_names(text: str, fragment: str) -> None:
    (cmd,) = commands_in_line("wrong.md", 1, text)
    problems = static_problems(cmd, validate_file)
    assert any(fragment in p for p in problems), problems
    assert all(p.startswith("wrong.md:1: `") for p in problems)


def test_a_resource_file_that_does_not_validate_is_reported(tmp_path: Path) -> None:
    (cmd,) = commands_in_line("wrong.md", 3, "kubectl apply -f examples/minimal.yaml")
    problems = static_problems(cmd, lambda path: [f"{path} is invalid"])
    assert problems == [
        "wrong.md:3: `kubectl apply -f examples/minimal.yaml`: examples/minimal.yaml is invalid"
    ]


@pytest.mark.parametrize("cmd", COMMANDS, ids=label)
def test_names_used_by_doc_commands_exist(cmd: Command) -> None:
    problems = static_problems(cmd, validate_file)
    if meant_to_fail(cmd):
        assert problems, f"{cmd} should fail ({MEANT_TO_FAIL[cmd.file, cmd.text]}) but passes"
        return
    assert not problems, "\n".join(problems)


def as_run_here(cmd: Command, tmp_path: Path) -> list[str]:
    """The arguments to run: as written for quick subcommands (the user's own files replaced
    by an example, output folders by ``tmp_path``), else the subcommand's ``--help`` (also
    for a subcommand named without arguments, a mention in prose)."""
    _, path, rest = resolve_cli(list(cmd.argv[1:]))
    if path[-1] not in RUN_AS_WRITTEN or not rest:
        return [*path, "--help"]
    args = []
    for i, word in enumerate(rest):
        previous = rest[i - 1] if i else ""
        if previous == "--out-dir":
            word = str(tmp_path)
        elif word.endswith((".yaml", ".yml")) and (
            is_placeholder(word) or word.split("/", 1)[0] not in REPO_DIRS
        ):
            word = STAND_IN
        args.append(str(ROOT / word) if word.split("/", 1)[0] in REPO_DIRS else word)
    return [*path, *args]


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.program == "prefixserving"], ids=label)
def test_prefixserving_commands_run(cmd: Command, tmp_path: Path) -> None:
    args = as_run_here(cmd, tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, (
        f"{cmd}: `prefixserving {' '.join(args)}` exited {result.exit_code}:\n{result.output}"
    )


HELM_COMMANDS = [c for c in COMMANDS if c.program == "helm" and len(c.argv) > 1]


@functools.cache
def helm_help(subcommand: str) -> dict[str, bool]:
    result = subprocess.run(
        [tool("helm"), *subcommand.split(), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return helm_flags(result.stdout)


def helm_subcommand(cmd: Command) -> str:
    return " ".join(cmd.argv[1:3]) if cmd.argv[1] == "repo" else cmd.argv[1]


@pytest.mark.slow  # runs helm
@pytest.mark.parametrize("cmd", HELM_COMMANDS, ids=label)
def test_helm_flags_exist(cmd: Command) -> None:
    flags = helm_help(helm_subcommand(cmd))
    _, options = helm_split(cmd, flags)
    unknown = [o[0].split("=")[0] for o in options if o[0].split("=")[0] not in flags]
    assert not unknown, f"{cmd}: `helm {helm_subcommand(cmd)}` has no flag {', '.join(unknown)}"


@pytest.mark.slow  # runs helm
@pytest.mark.parametrize(
    "cmd", [c for c in HELM_COMMANDS if helm_chart(c) in OUR_CHARTS], ids=label
)
def test_helm_commands_of_this_chart_render(cmd: Command) -> None:
    """``helm template`` with the command's flags (those ``helm template`` has) against the
    local chart: what ``helm install`` would check before it talks to the cluster."""
    template_flags = helm_help("template")
    positional, options = helm_split(cmd, helm_help(cmd.argv[1]))
    kept = [word for o in options if o[0].split("=")[0] in template_flags for word in o]
    args = ["template", positional[0], str(CHART), *kept]
    result = subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if meant_to_fail(cmd):
        assert result.returncode != 0, f"{cmd} should fail ({MEANT_TO_FAIL[cmd.file, cmd.text]})"
        return
    assert result.returncode == 0, f"{cmd}: `helm {' '.join(args)}` failed:\n{result.stderr}"
