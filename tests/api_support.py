"""Schema checks for rendered objects and PrefixServing bodies, without a cluster.

- ``validate_object``: a rendered child against the official Kubernetes schema of a version
  (``kubernetes-validate``, strict: unknown fields fail), or, for kinds Kubernetes does not know
  (KEDA ScaledObject, ServiceMonitor, PrometheusRule), against the upstream CRD schema in
  ``../shared/schemas``. An unknown kind with no schema is a failure, never skipped.
- ``CrdValidator``: what the API server does with a body under one of our CRDs: apply the
  schema's defaults, check the structural schema (strict field validation, like ``kubectl``),
  then evaluate every ``x-kubernetes-validations`` CEL rule (cel-python) on its node.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parents[1]
SHARED_SCHEMAS = ROOT.parent / "shared" / "schemas"
KUBE_VERSIONS = ("1.29", "1.35")


def crd_schemas(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> openAPIV3Schema of every CRD in the YAML files of ``folder``."""
    found = {}
    for path in sorted(folder.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                api_version = f"{spec['group']}/{version['name']}"
                found[(api_version, spec["names"]["kind"])] = version["schema"]["openAPIV3Schema"]
    return found


@functools.cache
def third_party_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """CRD schemas of KEDA and prometheus-operator kinds, from ../shared/schemas."""
    if not SHARED_SCHEMAS.is_dir():
        raise FileNotFoundError(f"{SHARED_SCHEMAS} is missing: shared/ must sit beside the repo")
    return crd_schemas(SHARED_SCHEMAS)


def _visit(node: Any, fix: Any) -> None:
    """Apply ``fix`` to every schema node under ``node`` (properties, items, anyOf...)."""
    if not isinstance(node, dict):
        return
    fix(node)
    for child in node.get("properties", {}).values():
        _visit(child, fix)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _visit(node[key], fix)
    for key in ("anyOf", "allOf", "oneOf"):
        for child in node.get(key, []):
            _visit(child, fix)


def _exclusive_bounds(node: dict[str, Any]) -> None:
    for flag, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if node.get(flag) is True:  # OpenAPI v3.0 form -> JSON Schema 2020 form
            node[flag] = node.pop(bound)
        elif node.get(flag) is False:
            del node[flag]


def _no_unknown_fields(node: dict[str, Any]) -> None:
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        node.setdefault("additionalProperties", False)


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3.0 schema (a CRD's) in JSON Schema 2020 terms: boolean exclusive
    bounds become numeric ones."""
    out = copy.deepcopy(schema)
    _visit(out, _exclusive_bounds)
    return out


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD's root schema as JSON Schema 2020 that refuses unknown fields (kubectl's strict
    field validation). apiVersion, kind and metadata are always allowed at the root, as the API
    server does."""
    out = json_schema(schema)
    implicit = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {}}
    out["properties"] = {**implicit, **out.get("properties", {})}
    _visit(out, _no_unknown_fields)
    return out


@functools.cache
def _kube_validator(version: str, api_version: str, kind: str) -> jsonschema.Validator:
    """kubernetes-validate's strict schema of one kind, loaded once (its ``validate`` re-reads
    the 3 MB definitions file on every call). Same files and resolution as ``validate``."""
    kv = kubernetes_validate.utils
    schema_version = [v for v in kv.all_versions() if kv.major_minor(v) <= version][-1]
    schema_dir = f"kubernetes-json-schema/v{schema_version}-local-strict"
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = kv.schema_contents(f"{schema_dir}/{kind.lower()}-{group}.json", version)
    except FileNotFoundError:
        raise kv.SchemaNotFoundError(kind=kind, version=version, api_version=api_version) from None
    definitions = kv.schema_contents(f"{schema_dir}/_definitions.json", version)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_object(
    obj: dict[str, Any], version: str, extra: dict[tuple[str, str], dict] | None = None
) -> None:
    """Raise when ``obj`` does not match its kind's schema for Kubernetes ``version``; CRD
    kinds are looked up in ../shared/schemas, then in ``extra`` (from ``crd_schemas``)."""
    key = (obj["apiVersion"], obj["kind"])
    third_party = third_party_schemas().get(key) or (extra or {}).get(key)
    if third_party is not None:
        jsonschema.Draft202012Validator(strict(third_party)).validate(obj)
        return
    _kube_validator(version, obj["apiVersion"], obj["kind"]).validate(obj)


def assert_all_valid(
    objects: list[dict[str, Any]],
    version: str,
    extra: dict[tuple[str, str], dict] | None = None,
) -> None:
    """Validate every object; the assertion names the object and the failing field."""
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {version})"
        try:
            validate_object(obj, version, extra)
        except kubernetes_validate.SchemaNotFoundError as error:
            raise AssertionError(f"{where}: no schema for this kind: {error.message}") from None
        except jsonschema.ValidationError as error:
            path = ".".join(str(p) for p in error.absolute_path)
            raise AssertionError(f"{where}: {path}: {error.message}") from None


def apply_defaults(schema: dict[str, Any], data: Any) -> Any:
    """Structural defaulting, as the API server does it: absent fields with a default get it."""
    if isinstance(data, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in data and "default" in sub:
                data[name] = copy.deepcopy(sub["default"])
            if name in data:
                data[name] = apply_defaults(sub, data[name])
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in data]
    return data


def _rule_nodes(schema: dict[str, Any], data: Any, path: str) -> Iterator[tuple[dict, Any, str]]:
    """(schema node, data node, path) for every node that has CEL rules and data."""
    if schema.get("x-kubernetes-validations"):
        yield schema, data, path
    if isinstance(data, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in data:
                yield from _rule_nodes(sub, data[name], f"{path}.{name}" if path else name)
    elif isinstance(data, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(data):
            yield from _rule_nodes(schema["items"], item, f"{path}[{i}]")


@functools.cache
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


class CrdValidator:
    """Validate bodies against one CRD version as the API server would (see module doc)."""

    def __init__(self, crd: dict[str, Any]) -> None:
        self.schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        self._validator = jsonschema.Draft202012Validator(strict(self.schema))

    def errors(self, body: dict[str, Any]) -> list[str]:
        """Every schema or CEL failure, as 'path: message'; empty when the body is accepted."""
        data = apply_defaults(self.schema, copy.deepcopy(body))
        found = [
            f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in self._validator.iter_errors(data)
        ]
        if found:  # the API server runs CEL only on schema-valid objects
            return found
        for node, value, path in _rule_nodes(self.schema, data, ""):
            for rule in node["x-kubernetes-validations"]:
                result = _cel_program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
                if result is not True and not (
                    isinstance(result, celpy.celtypes.BoolType) and result
                ):
                    where = path + rule.get("fieldPath", "")
                    found.append(f"{where}: {rule['message']} ({result!r})")
        return found
