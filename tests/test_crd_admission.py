"""``api/admission.py``: the checks an API server runs before it admits a CRD. Each check is
shown to fail on a deliberately bad schema (with the field path and the fix in the message),
the generated CRDs pass all of them, and ``prefixserving crd`` refuses to emit a CRD that
fails one. ``e2e/test_apiserver_e2e.py`` applies the generated CRD to a real API server."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from prefixserving.api import admission, crd
from prefixserving.api.cli import crd as crd_command


def obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def root(spec: dict[str, Any]) -> dict[str, Any]:
    return obj(metadata={"type": "object"}, spec=spec)


def problems(schema: dict[str, Any]) -> list[str]:
    return [str(p) for p in admission.schema_problems(schema)]


@pytest.mark.parametrize("file_name", sorted(crd.crds()))
def test_generated_crds_pass_every_check(file_name: str) -> None:
    assert admission.crd_problems(crd.crds()[file_name]) == []


STRING = {"type": "string"}
BOUNDED = {"type": "string", "maxLength": 63}

BAD_SCHEMAS: list[tuple[str, dict[str, Any], str]] = [
    ("no type", root(obj(size={"minimum": 1})), ".spec.size: no type. Fix: give the field a type"),
    (
        "$ref",
        root(obj(engine={"$ref": "#/definitions/Engine", "type": "object"})),
        ".spec.engine: $ref is not allowed in a CRD schema. Fix: inline",
    ),
    (
        "properties and additionalProperties",
        root(obj(labels={**obj(a=STRING), "additionalProperties": STRING})),
        ".spec.labels: properties together with additionalProperties",
    ),
    (
        "additionalProperties false",
        root({**obj(a=STRING), "additionalProperties": False}),
        ".spec: additionalProperties: false",
    ),
    (
        "description in anyOf",
        root(
            obj(
                size={
                    "type": "integer",
                    "anyOf": [{"minimum": 1, "description": "small"}, {"maximum": 0}],
                }
            )
        ),
        ".spec.size(anyOf[0]): description inside anyOf. Fix: move description out of anyOf",
    ),
    (
        "type in oneOf",
        root(obj(size={"type": "integer", "oneOf": [{"type": "integer"}]})),
        ".spec.size(oneOf[0]): type inside oneOf",
    ),
    (
        "field only inside allOf",
        root({**obj(a=STRING), "allOf": [{"properties": {"b": {"minLength": 1}}}]}),
        ".spec(allOf[0]).b: allOf names the field 'b', which is not specified outside it",
    ),
    (
        "int-or-string with a type",
        root(obj(cpu={"type": "string", "x-kubernetes-int-or-string": True})),
        ".spec.cpu: x-kubernetes-int-or-string with a type",
    ),
    (
        "metadata restricted beyond name",
        {**root(obj()), "properties": {"metadata": obj(labels={"type": "object"})}},
        ".metadata.labels: a restriction on metadata.labels",
    ),
    (
        "kind not a string",
        {**root(obj()), "properties": {**root(obj())["properties"], "kind": {"type": "object"}}},
        ".kind: kind is not type: string",
    ),
    (
        "title in not",
        root(obj(size={"type": "integer", "not": {"title": "zero", "enum": [0]}})),
        ".spec.size(not[0]): title inside not",
    ),
    (
        "list-type map with an optional key",
        root(
            obj(
                ports={
                    "type": "array",
                    "items": obj(name=STRING, port={"type": "integer"}),
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                }
            )
        ),
        ".spec.ports[*].name: a list-map key that is neither required nor defaulted",
    ),
    (
        "list-type set of objects",
        root(
            obj(
                items={
                    "type": "array",
                    "items": obj(a=STRING),
                    "x-kubernetes-list-type": "set",
                }
            )
        ),
        ".spec.items: list-type set of non-scalar items",
    ),
    (
        "default with an unknown field",
        root(obj(engine={**obj(image=STRING), "default": {"image": "x", "imag": "typo"}})),
        ".spec.engine.imag: default sets a field the schema does not define (pruned)",
    ),
    (
        "default outside the enum",
        root(obj(policy={"type": "string", "enum": ["peek", "fcfs"], "default": "lifo"})),
        ".spec.policy: default 'lifo' is not one of ['peek', 'fcfs']",
    ),
    (
        "uniqueItems",
        root(obj(tags={"type": "array", "items": BOUNDED, "uniqueItems": True})),
        ".spec.tags: uniqueItems: true",
    ),
    (
        "CEL reads an unbounded string",
        root(
            {
                **obj(name=STRING),
                "x-kubernetes-validations": [{"rule": "self.name != 'x'", "message": "m"}],
            }
        ),
        ".spec.name: the CEL rule `self.name != 'x'` on .spec reads this string, which has no "
        "maxLength, so the API server cannot bound the rule's cost. Fix: set a maxLength: "
        "Field(max_length=...) on the field in api/types.py",
    ),
    (
        "CEL iterates an unbounded list",
        root(
            {
                **obj(args={"type": "array", "items": BOUNDED}),
                "x-kubernetes-validations": [
                    {"rule": "self.args.all(a, a != '--port')", "message": "m"}
                ],
            }
        ),
        ".spec.args: the CEL rule `self.args.all(a, a != '--port')` on .spec reads this array, "
        "which has no maxItems",
    ),
    (
        "CEL reads an unbounded field through the iteration variable",
        root(
            {
                **obj(env={"type": "array", "maxItems": 8, "items": obj(name=STRING)}),
                "x-kubernetes-validations": [
                    {"rule": "self.env.exists_one(e, e.name == 'HOME')", "message": "m"}
                ],
            }
        ),
        ".spec.env[*].name: the CEL rule `self.env.exists_one(e, e.name == 'HOME')` on .spec "
        "reads this string, which has no maxLength",
    ),
    (
        "CEL reads an unbounded map",
        root(
            {
                **obj(labels={"type": "object", "additionalProperties": BOUNDED}),
                "x-kubernetes-validations": [{"rule": "'app' in self.labels", "message": "m"}],
            }
        ),
        ".spec.labels: the CEL rule `'app' in self.labels` on .spec reads this map, which has no "
        "maxProperties",
    ),
    (
        "CEL rule inside an unbounded list",
        root(
            obj(
                prompts={
                    "type": "array",
                    "items": {
                        **obj(a={"type": "boolean"}),
                        "x-kubernetes-validations": [{"rule": "self.a", "message": "m"}],
                    },
                }
            )
        ),
        ".spec.prompts: the CEL rule `self.a` on .spec.prompts[*] runs once per element of this "
        "array, which has no maxItems",
    ),
    (
        "CEL reads a free-form object",
        root(
            {
                **obj(affinity={"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
                "x-kubernetes-validations": [{"rule": "self.affinity == {}", "message": "m"}],
            }
        ),
        ".spec.affinity: the CEL rule `self.affinity == {}` on .spec reads this free-form object, "
        "whose size CEL cannot bound (x-kubernetes-preserve-unknown-fields). Fix: do not read",
    ),
    (
        "CEL names a field the schema lacks",
        root({**obj(a=BOUNDED), "x-kubernetes-validations": [{"rule": "self.b == 'x'"}]}),
        ".spec: the CEL rule `self.b == 'x'` on .spec reads 'b', which the schema does not define",
    ),
    (
        "CEL that does not parse",
        root(
            {**obj(a=BOUNDED), "x-kubernetes-validations": [{"rule": "self.a ==", "message": "m"}]}
        ),
        ".spec: the CEL rule `self.a ==` on .spec does not parse",
    ),
]


@pytest.mark.parametrize(
    ("schema", "expected"), [c[1:] for c in BAD_SCHEMAS], ids=[c[0] for c in BAD_SCHEMAS]
)
def test_each_check_refuses_its_bad_schema(schema: dict[str, Any], expected: str) -> None:
    found = problems(schema)
    assert any(expected in p for p in found), found


def test_bounded_reads_and_presence_tests_pass() -> None:
    spec = {
        **obj(
            name=BOUNDED,
            policy={"type": "string", "enum": ["a", "b"]},
            args={"type": "array", "maxItems": 4, "items": BOUNDED},
            free={"type": "string"},
            labels={"type": "object", "maxProperties": 4, "additionalProperties": BOUNDED},
        ),
        "x-kubernetes-validations": [
            {"rule": "has(self.free) || self.name != self.policy", "message": "m"},
            {"rule": "self.args.all(a, a != self.name) && self.labels['x'] == 'y'"},
            {"rule": "size(self.args) <= 4", "message": "m"},
        ],
    }
    schema = {
        **root(spec),
        "x-kubernetes-validations": [{"rule": "self.metadata.name.startsWith('a')"}],
    }
    assert problems(schema) == []


def test_prefixserving_crd_refuses_to_emit_a_crd_the_server_would_reject(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real rule (adapter names differ from servedName) over a field that lost its bound."""
    original = crd.openapi_schema

    def unbounded(root_model: Any) -> dict[str, Any]:
        schema = copy.deepcopy(original(root_model))
        if "model" in schema["properties"]["spec"]["properties"]:
            del schema["properties"]["spec"]["properties"]["model"]["properties"]["servedName"][
                "maxLength"
            ]
        return schema

    monkeypatch.setattr(crd, "openapi_schema", unbounded)
    out_dir = tmp_path / "crds"
    result = CliRunner().invoke(crd_command, ["--out-dir", str(out_dir)])
    assert result.exit_code == 1
    assert "the API server would refuse the CRD prefixservings.prefixserving.io" in result.output
    assert "v1alpha1 .spec.model.servedName: the CEL rule `!has(self.adapters)" in result.output
    assert "Fix: set a maxLength: Field(max_length=...) on the field in api/types.py" in (
        result.output
    )
    assert not out_dir.exists()  # nothing half-written
    printed = CliRunner().invoke(crd_command, [])
    assert printed.exit_code == 1 and "apiVersion:" not in printed.output
