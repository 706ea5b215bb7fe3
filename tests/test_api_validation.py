"""Invalid PrefixServings are refused with the field named, by Python and by the CRD alike, and
nothing is rendered for them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from api_support import CrdValidator
from prefixserving.api import crd
from prefixserving.api.types import PrefixServing
from prefixserving.api.validation import (
    OWNED_FLAGS,
    RULES,
    SpecError,
    check_rules,
    parse_resource,
    parse_scaling_policy,
)
from prefixserving.render import render_children
from prefixserving.render.cli import render

ROOT = Path(__file__).resolve().parents[1]

BASE: dict[str, Any] = {
    "apiVersion": "prefixserving.io/v1alpha1",
    "kind": "PrefixServing",
    "metadata": {"name": "chat", "namespace": "llm"},
    "spec": {
        "model": {"servedName": "chat", "source": {"huggingFace": {"repo": "org/model"}}},
        "replicas": 2,
    },
}


def body_with(path: str, value: Any) -> dict[str, Any]:
    """BASE with ``value`` at the dotted ``path`` (None deletes the key)."""
    body = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return body


AUTOSCALED = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}

# (case id, dotted path to set, value, field the problem must name, CRD refuses it too)
INVALID: list[tuple[str, str, Any, str, bool]] = [
    # with router.kvEvents.enabled (_case_body): the operator owns the hash and the events
    (
        "kv-events-own-hash-algo",
        "spec.engine",
        {"extraArgs": ["--prefix-caching-hash-algo=sha256"]},
        "spec.router.kvEvents.enabled",
        True,
    ),
    (
        "kv-events-hash-seed",
        "spec.engine",
        {"env": [{"name": "PYTHONHASHSEED", "value": "0"}]},
        "spec.router.kvEvents.enabled",
        True,
    ),
    # ... and the router tokenizes with the model's own tokenizer and chat template
    (
        "kv-events-chat-template",
        "spec.engine",
        {"extraArgs": ["--chat-template", "/templates/chat.jinja"]},
        "spec.router.kvEvents.enabled",
        True,
    ),
    (
        "kv-events-tokenizer-revision",
        "spec.engine",
        {"extraArgs": ["--tokenizer_revision=v2"]},
        "spec.router.kvEvents.enabled",
        True,
    ),
    # ... and follows one event publisher per engine pod
    (
        "kv-events-data-parallel",
        "spec.engine",
        {"extraArgs": ["-dp", "2"]},
        "spec.router.kvEvents.enabled",
        True,
    ),
    ("replicas-wrong-type", "spec.replicas", "two", "spec.replicas", True),
    ("unknown-field", "spec.engine", {"gpus": 2}, "spec.engine.gpus", True),
    ("min-above-max", "spec.autoscaling", AUTOSCALED, "spec.autoscaling.maxReplicas", True),
    (
        "tensor-parallel-0",
        "spec.engine",
        {"tensorParallelSize": 0},
        "spec.engine.tensorParallelSize",
        True,
    ),
    ("block-size-17", "spec.engine", {"blockSize": 17}, "spec.engine.blockSize", True),
    ("block-size-8", "spec.engine", {"blockSize": 8}, "spec.engine.blockSize", True),
    (
        "shm-negative",
        "spec.placement",
        {"shm": {"sizeLimit": "-1Gi"}},
        "spec.placement.shm.sizeLimit",
        True,
    ),
    (
        "shm-absurd",
        "spec.placement",
        {"shm": {"sizeLimit": "40Ti"}},
        "spec.placement.shm.sizeLimit",
        False,
    ),
    ("memory-zero", "spec.engine", {"resources": {"memory": "0"}}, "spec.engine.resources", False),
    (
        "sibling-wait-negative",
        "spec.scheduler",
        {"maxSiblingWaitMs": -5},
        "spec.scheduler.maxSiblingWaitMs",
        True,
    ),
    (
        "sibling-wait-absurd",
        "spec.scheduler",
        {"maxSiblingWaitMs": 10**9},
        "spec.scheduler.maxSiblingWaitMs",
        True,
    ),
    (
        "pin-budget-absurd",
        "spec.scheduler",
        {"pinBudgetFraction": 0.9},
        "spec.scheduler.pinBudgetFraction",
        True,
    ),
    ("served-name-empty", "spec.model.servedName", "", "spec.model.servedName", True),
    ("model-missing", "spec.model", None, "spec.model", True),
    ("source-empty", "spec.model.source", {}, "spec.model.source", True),
    (
        "source-both",
        "spec.model.source",
        {"huggingFace": {"repo": "a/b"}, "pvc": {"claimName": "w"}},
        "spec.model.source",
        True,
    ),
    (
        "extra-arg-owned",
        "spec.engine",
        {"extraArgs": ["--block-size=32"]},
        "spec.engine.extraArgs",
        True,
    ),
    (
        "extra-arg-owned-underscore",
        "spec.engine",
        {"extraArgs": ["--max-num-seqs", "64", "--max_model_len", "9"]},
        "spec.engine.extraArgs",
        True,
    ),
    (
        "env-owned",
        "spec.engine",
        {"env": [{"name": "PREFIXSERVING_LANES", "value": "64"}]},
        "spec.engine.env",
        True,
    ),
    (
        "gpu-memory-zero",
        "spec.engine",
        {"gpuMemoryUtilization": 0},
        "spec.engine.gpuMemoryUtilization",
        True,
    ),
    (
        "gpu-memory-above-1",
        "spec.engine",
        {"gpuMemoryUtilization": 1.5},
        "spec.engine.gpuMemoryUtilization",
        True,
    ),
    ("router-algorithm", "spec.router", {"algorithm": "random"}, "spec.router.algorithm", True),
    ("router-load-bound", "spec.router", {"loadBound": 0.5}, "spec.router.loadBound", True),
    ("ipc-unknown", "spec.placement", {"ipc": "shared"}, "spec.placement.ipc", True),
    ("replicas-with-autoscaling", "spec.autoscaling", {"enabled": True}, "spec.replicas", True),
    (
        "numa-fractional-cpu",
        "spec.placement",
        {"numa": "aligned"},
        "spec.engine.resources.cpu",
        False,
    ),
    (
        "warmup-prompt-and-messages",
        "spec.warmup",
        {"prompts": [{"prompt": "x", "messages": [{"role": "user", "content": "x"}]}]},
        "spec.warmup.prompts[0]",
        True,
    ),
    (
        "warmup-prompts-and-configmap",
        "spec.warmup",
        {"prompts": [{"prompt": "x"}], "configMapRef": {"name": "prompts"}},
        "spec.warmup.configMapRef",
        True,
    ),
    (
        "warmup-timeout-negative",
        "spec.warmup",
        {"timeoutSeconds": -1},
        "spec.warmup.timeoutSeconds",
        True,
    ),
    (
        "adapters-duplicate",
        "spec.model.adapters",
        [{"name": "a", "source": {"huggingFace": {"repo": "o/a"}}}] * 2,
        "spec.model.adapters",
        True,
    ),
    ("max-loras-without-adapters", "spec.model.maxLoras", 2, "spec.model.maxLoras", True),
    ("name-uppercase", "metadata.name", "Chat", "metadata.name", True),
    ("name-too-long", "metadata.name", "a" * 50, "metadata.name", True),
    ("wrong-kind", "kind", "Deployment", "kind", True),
]


def _case_body(path: str, value: Any, case: str) -> dict[str, Any]:
    body = body_with(path, value)
    if case == "numa-fractional-cpu":
        body["spec"]["engine"] = {"resources": {"cpu": "7500m"}}
    if case == "min-above-max":
        del body["spec"]["replicas"]
    if case.startswith("kv-events-"):
        body["spec"]["router"] = {"kvEvents": {"enabled": True}}
    return body


@pytest.mark.parametrize(
    ("path", "value", "field", "crd_refuses", "case"),
    [(p, v, f, c, case) for case, p, v, f, c in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_invalid_resource_is_refused_with_the_field_named(
    path: str, value: Any, field: str, crd_refuses: bool, case: str
) -> None:
    body = _case_body(path, value, case)
    with pytest.raises(SpecError) as caught:
        parse_resource(body)
    problems = caught.value.problems
    assert any(p.path == field or p.path.startswith(field + ".") for p in problems), problems
    assert all(p.message for p in problems)
    assert field in str(caught.value)


def test_at_least_fifteen_invalid_cases() -> None:
    assert len(INVALID) >= 15


@pytest.fixture(scope="module")
def crd_validator() -> CrdValidator:
    return CrdValidator(crd.prefixserving_crd())


@pytest.mark.parametrize(
    ("path", "value", "crd_refuses", "case"),
    [(p, v, c, case) for case, p, v, _, c in INVALID],
    ids=[case[0] for case in INVALID],
)
def test_crd_schema_and_cel_agree_with_python(
    crd_validator: CrdValidator, path: str, value: Any, crd_refuses: bool, case: str
) -> None:
    """The API server refuses what ``validate`` refuses, except the Python-only quantity rules."""
    errors = crd_validator.errors(_case_body(path, value, case))
    assert bool(errors) is crd_refuses, errors


def test_base_body_is_valid_for_python_and_crd(crd_validator: CrdValidator) -> None:
    parse_resource(BASE)
    assert crd_validator.errors(BASE) == []


@pytest.mark.parametrize("case", [c[0] for c in INVALID])
def test_nothing_is_rendered_for_an_invalid_resource(case: str, tmp_path: Path) -> None:
    _, path, value, _, _ = next(c for c in INVALID if c[0] == case)
    file = tmp_path / "bad.yaml"
    file.write_text(yaml.safe_dump(_case_body(path, value, case)))
    result = CliRunner().invoke(render, ["-f", str(file)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "nothing rendered" in result.stderr


def test_render_children_refuses_a_model_that_bypassed_validation() -> None:
    """A model built without parse_resource still goes through the cross-field rules."""
    resource = parse_resource(BASE)
    broken = resource.model_copy(deep=True)
    broken.spec.engine.extra_args = ["--port", "9000"]
    with pytest.raises(SpecError, match=r"spec\.engine\.extraArgs"):
        render_children(broken)


def test_every_problem_is_reported_not_just_the_first() -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["autoscaling"] = {"enabled": True, "minReplicas": 3, "maxReplicas": 1}
    body["spec"]["engine"] = {"extraArgs": ["--port=1"]}
    with pytest.raises(SpecError) as caught:
        parse_resource(body)
    paths = {p.path for p in caught.value.problems}
    assert {"spec.replicas", "spec.engine.extraArgs", "spec.autoscaling.maxReplicas"} <= paths


def test_unknown_field_hint_lists_the_known_fields() -> None:
    with pytest.raises(SpecError) as caught:
        parse_resource(body_with("spec.router", {"algoritm": "two-choice"}))
    (problem,) = caught.value.problems
    assert problem.path == "spec.router.algoritm"
    assert "algorithm" in problem.hint


@pytest.mark.parametrize("flag", OWNED_FLAGS)
def test_every_owned_flag_is_refused_in_both_spellings(flag: str) -> None:
    for arg in (f"--{flag}", f"--{flag}=1", f"--{flag.replace('-', '_')}"):
        engine = {"extraArgs": ["--max-num-seqs", "8", arg]}
        with pytest.raises(SpecError, match="extraArgs"):
            parse_resource(body_with("spec.engine", engine))


def test_flags_that_only_share_a_prefix_with_owned_ones_are_allowed() -> None:
    args = ["--port-range", "--max-model-len-hint", "--block-size-x", "--model-impl", "vllm"]
    parse_resource(body_with("spec.engine", {"extraArgs": args}))


def test_scaling_policy_min_above_max_is_refused() -> None:
    body = {
        "apiVersion": "prefixserving.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p"},
        "spec": {"minReplicas": 4, "maxReplicas": 2},
    }
    with pytest.raises(SpecError) as caught:
        parse_scaling_policy(body)
    assert [p.path for p in caught.value.problems] == ["spec.maxReplicas"]
    assert CrdValidator(crd.scaling_policy_crd()).errors(body)


def _cel_rules(schema: dict[str, Any]) -> set[str]:
    found = {r["rule"] for r in schema.get("x-kubernetes-validations", [])}
    for child in schema.get("properties", {}).values():
        found |= _cel_rules(child)
    if isinstance(schema.get("items"), dict):
        found |= _cel_rules(schema["items"])
    return found


def test_every_rule_with_cel_is_in_the_crds() -> None:
    emitted = set()
    for generated in crd.crds().values():
        emitted |= _cel_rules(generated["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    expected = {rule.cel for rule in RULES if rule.cel is not None}
    assert expected <= emitted


def test_check_rules_on_a_valid_resource_finds_nothing() -> None:
    resource = PrefixServing.model_validate(BASE)
    assert check_rules(resource) == []
