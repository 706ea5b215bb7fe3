"""Generate the PrefixServing and ScalingPolicy CRDs from the pydantic models.

Algorithm: take pydantic's JSON schema (by alias), then turn it into a Kubernetes structural
schema in one recursive pass: inline every ``$ref``; drop ``title``, ``additionalProperties:
false`` and ``null`` defaults; turn ``X | None`` into ``X`` (``nullable`` under ``status``, where
the operator may write nulls); turn ``const`` into a one-value ``enum`` and JSON Schema's
numeric ``exclusiveMinimum``/``exclusiveMaximum`` into OpenAPI v3.0's bound plus boolean
flag; give nested objects
built by ``default_factory`` a ``default: {}`` so the API server fills in their fields; and add
each model's CEL rules from ``api/validation.RULES`` as ``x-kubernetes-validations``.
Then check it as an API server would admit it (``api/admission.py``: structural schema, list
types, defaults, the CEL rules' cost bounds): :func:`crds` raises :class:`CrdRejected`, naming
each field and the fix, instead of returning a CRD the server would refuse.
The result is deterministic (CI compares it with ``crds/`` and the chart's copy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from prefixserving import constants
from prefixserving.api import types as t
from prefixserving.api.admission import CrdRejected, crd_problems
from prefixserving.api.validation import model_in, rules_for

NAME_RULE = {
    "rule": (
        f"self.metadata.name.matches('{t.NAME_PATTERN}')"
        f" && size(self.metadata.name) <= {t.NAME_MAX_LENGTH}"
    ),
    "message": (
        f"metadata.name must be a DNS-1035 label of at most {t.NAME_MAX_LENGTH} characters"
        " (child objects append -engine-<hash>-<hash>)"
    ),
}


def _models(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``root``, by class name (pydantic's ``$defs`` keys)."""
    found: dict[str, type[BaseModel]] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for info in model.model_fields.values():
            child = model_in(info.annotation)
            if child is not None:
                stack.append(child)
    return found


class _Converter:
    """One conversion of a pydantic JSON schema into a structural schema."""

    def __init__(self, root: type[BaseModel]) -> None:
        self.schema = root.model_json_schema(by_alias=True)
        self.defs: dict[str, Any] = self.schema.get("$defs", {})
        self.models = _models(root)

    def convert(self, node: dict[str, Any], status: bool, model: str | None = None) -> dict:
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[-1]
            out = self.convert(self.defs[name], status, name)
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return {**out, **self.convert(extra, status)} if extra else out
        any_of = node.get("anyOf")
        if any_of and {"type": "null"} in any_of:
            rest = [branch for branch in any_of if branch != {"type": "null"}]
            siblings = {k: v for k, v in node.items() if k not in ("anyOf", "default")}
            inner = rest[0] if len(rest) == 1 else {"anyOf": rest}
            out = {**self.convert(inner, status), **self.convert(siblings, status)}
            if status:
                out["nullable"] = True
            return out
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "$defs") or (key == "additionalProperties" and value is False):
                continue
            if key == "default" and (value is None or status):
                continue
            if key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                # OpenAPI v3.0 (what the API server speaks): a bound plus a boolean flag.
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "properties":
                out[key] = {
                    name: self.convert(sub, status or name == "status")
                    for name, sub in value.items()
                }
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = self.convert(value, status)
            else:
                out[key] = value
        if model is not None:
            self._decorate(out, self.models[model], status)
        return out

    @staticmethod
    def _decorate(out: dict[str, Any], model: type[BaseModel], status: bool) -> None:
        """Add ``default: {}`` to nested objects with a factory, and the model's CEL rules."""
        for name, info in model.model_fields.items():
            prop = out.get("properties", {}).get(info.alias or name)
            if prop is None or status or info.default_factory is None:
                continue
            if prop.get("type") == "object" and "properties" in prop:
                prop["default"] = {}
        rules = [
            {"rule": rule.cel, "message": rule.message}
            | ({"fieldPath": f".{rule.field}"} if rule.field else {})
            for rule in rules_for(model)
            if rule.cel is not None
        ]
        if rules:
            out["x-kubernetes-validations"] = rules


def openapi_schema(root: type[BaseModel]) -> dict[str, Any]:
    """The structural ``openAPIV3Schema`` of a resource model (PrefixServing, ScalingPolicy)."""
    schema = _Converter(root).convert(_root_node(root), status=False, model=None)
    schema["properties"]["metadata"] = {"type": "object"}
    schema["required"] = ["spec"]
    schema["x-kubernetes-validations"] = [NAME_RULE]
    return schema


def _root_node(root: type[BaseModel]) -> dict[str, Any]:
    schema = root.model_json_schema(by_alias=True)
    return {k: v for k, v in schema.items() if k != "$defs"}


def _percent(path: str) -> dict[str, str]:
    return {"type": "number", "format": "float", "jsonPath": path}


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Warm", "type": "integer", "jsonPath": ".status.warmReplicas"},
    {"name": "Hit rate", **_percent(".status.metrics.hitRate")},
    {"name": "KV usage", **_percent(".status.metrics.kvCacheUsage")},
    {"name": "Queue", **_percent(".status.metrics.queueDepth")},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _crd(
    root: type[BaseModel],
    kind: str,
    plural: str,
    singular: str,
    short_names: list[str],
    status: bool,
    columns: list[dict[str, Any]],
) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": constants.VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema(root)},
    }
    if status:
        version["subresources"] = {"status": {}}
    if columns:
        version["additionalPrinterColumns"] = columns
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": singular,
        "categories": ["prefixserving"],
    }
    if short_names:
        names["shortNames"] = short_names
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{constants.GROUP}",
            "labels": {
                constants.LABEL_PART_OF: constants.PART_OF,
                constants.LABEL_VERSION: constants.PROJECT_VERSION,
            },
        },
        "spec": {
            "group": constants.GROUP,
            "scope": "Namespaced",
            "names": names,
            "versions": [version],
        },
    }


def prefixserving_crd() -> dict[str, Any]:
    """The PrefixServing CRD: schema, status subresource, printer columns, short name pfx."""
    return _crd(
        t.PrefixServing,
        constants.KIND,
        constants.PLURAL,
        constants.SINGULAR,
        [constants.SHORT_NAME],
        status=True,
        columns=PRINTER_COLUMNS,
    )


def scaling_policy_crd() -> dict[str, Any]:
    """The ScalingPolicy CRD (no status: it is configuration only)."""
    return _crd(
        t.ScalingPolicy,
        constants.POLICY_KIND,
        constants.POLICY_PLURAL,
        constants.POLICY_SINGULAR,
        [],
        status=False,
        columns=[
            {"name": "Backend", "type": "string", "jsonPath": ".spec.backend"},
            {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    )


def crds() -> dict[str, dict[str, Any]]:
    """File name -> CRD, for every CRD of the project; :class:`CrdRejected` when an API server
    would refuse one of them."""
    generated = {
        f"{constants.GROUP}_{constants.PLURAL}.yaml": prefixserving_crd(),
        f"{constants.GROUP}_{constants.POLICY_PLURAL}.yaml": scaling_policy_crd(),
    }
    for crd in generated.values():
        admitted(crd)
    return generated


def admitted(crd: dict[str, Any]) -> dict[str, Any]:
    """``crd`` itself, or :class:`CrdRejected` listing why an API server would refuse it."""
    problems = crd_problems(crd)
    if problems:
        raise CrdRejected(crd["metadata"]["name"], problems)
    return crd


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated sub-trees in full instead of YAML anchors (kubectl shows them as-is)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(crd: dict[str, Any]) -> str:
    """YAML text of one CRD, as written to ``crds/`` (stable key order, no line wrapping)."""
    return yaml.dump(crd, Dumper=_NoAliasDumper, sort_keys=False, width=1000)


def write(out_dir: Path) -> list[Path]:
    """Write every CRD into ``out_dir``; returns the paths written. Nothing is written when
    one CRD would be refused (:class:`CrdRejected`)."""
    generated = crds()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for file_name, crd in generated.items():
        path = out_dir / file_name
        path.write_text(dump(crd))
        paths.append(path)
    return paths
