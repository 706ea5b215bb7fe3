"""What a Kubernetes API server checks before it admits a CRD, as a pure function over its
``openAPIV3Schema``: :func:`schema_problems` (and :func:`crd_problems` over a whole CRD).

``api/crd.py`` runs it on every CRD it generates and refuses to emit one with a problem, so
``prefixserving crd`` and ``make crds`` never write a CRD the server would reject. Each
:class:`Problem` names the field (``.spec.model.adapters[*].name``), what is wrong and the fix.

Checks (Kubernetes "structural schema" rules, CEL cost rules, apiextensions validation):

1. Keywords: no ``$ref``, ``definitions``, ``dependencies``, ``patternProperties``,
   ``additionalItems``, ``$schema``, ``id``, ``uniqueItems: true``, ``additionalProperties:
   false``, ``properties`` together with ``additionalProperties``, or unknown keys.
2. Types: the root, every property, every ``additionalProperties`` schema and every ``items``
   schema has a ``type``, except a node with ``x-kubernetes-int-or-string`` (which must not
   have one) or ``x-kubernetes-preserve-unknown-fields``.
3. Junctors (``allOf``, ``anyOf``, ``oneOf``, ``not``): no ``description``, ``title``,
   ``type``, ``default``, ``additionalProperties``, ``nullable`` or ``x-kubernetes-*`` but
   ``x-kubernetes-validations`` inside, except the ``anyOf: [{type: integer}, {type: string}]``
   of int-or-string; every property or items they name is also specified outside them.
4. At the root: ``apiVersion`` and ``kind`` are strings; ``metadata`` is ``type: object`` with
   at most restrictions on ``name`` and ``generateName``, and no default under it.
5. List and map types: ``x-kubernetes-list-type`` only on arrays (``atomic``, ``set`` of
   scalars, ``map`` of objects whose ``x-kubernetes-list-map-keys`` are scalar properties,
   each required or defaulted); ``x-kubernetes-map-type`` only on objects.
6. Defaults: of the node's type and enum, and pruned-valid (no field the schema does not
   define, so pruning would not change them).
7. CEL (``x-kubernetes-validations``): each rule parses (cel-python's parser), names only
   fields the schema defines, and has a one-line message; every list or map the rule is nested
   in has ``maxItems``/``maxProperties`` (the rule runs once per element); every string, list
   or map the rule reads has ``maxLength``, ``maxItems`` or ``maxProperties`` (an ``enum``
   bounds a string too), following ``self.a.b``, indexing, and the variable of ``all``,
   ``exists``, ``exists_one``, ``map`` and ``filter`` to the field it iterates
   (``api/cel_reads.py`` finds what a rule reads). Without these
   the server cannot bound a rule's cost and refuses the CRD. Arguments of ``has()`` are not
   reads; ``self.metadata.name`` and ``generateName`` are bounded by the server.

The bounds are what the server needs to estimate a cost at all; its numeric estimate against
the budget is not reproduced here (a rule over very large bounds can still exceed it), which
the e2e suite covers by applying the generated CRD to a real API server.

Cost: one pass over the schema, O(nodes + rule length x chain depth).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy

from prefixserving.api.cel_reads import Located, rule_reads

JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
FORBIDDEN_KEYS = {
    "$ref": "inline the referenced schema",
    "$schema": "remove it",
    "id": "remove it",
    "definitions": "inline the definitions",
    "dependencies": "express the dependency as a CEL rule (x-kubernetes-validations)",
    "patternProperties": "use additionalProperties with a CEL rule on the keys",
    "additionalItems": "use one items schema",
}
KNOWN_KEYS = {
    "description",
    "type",
    "format",
    "title",
    "default",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "multipleOf",
    "enum",
    "maxProperties",
    "minProperties",
    "required",
    "items",
    "properties",
    "additionalProperties",
    "nullable",
    "example",
    "externalDocs",
    *JUNCTORS,
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-list-type",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
}
NOT_IN_JUNCTORS = ("description", "title", "type", "default", "additionalProperties", "nullable")
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]
SCALARS = ("string", "integer", "number", "boolean")
TYPES_FIX = "Field(max_length=...) on the field in api/types.py (spec) or api/status.py (status)"


@dataclass(frozen=True)
class Problem:
    """One reason the API server would refuse the CRD."""

    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"{self.path or '.'}: {self.message}. Fix: {self.fix}"


class CrdRejected(ValueError):
    """A generated CRD that an API server would refuse; ``problems`` says where and why."""

    def __init__(self, name: str, problems: list[Problem]) -> None:
        self.name = name
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"the API server would refuse the CRD {name}:\n{lines}")


def crd_problems(crd: Mapping[str, Any]) -> list[Problem]:
    """Problems of every version's schema of a CRD (paths prefixed with the version)."""
    found = []
    for version in crd.get("spec", {}).get("versions", []):
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema is None:
            found.append(Problem(version.get("name", "?"), "no openAPIV3Schema", "add one"))
            continue
        found += [
            Problem(f"{version.get('name')} {p.path or '.'}", p.message, p.fix)
            for p in schema_problems(schema)
        ]
    return found


def schema_problems(schema: Mapping[str, Any]) -> list[Problem]:
    """Every problem of one ``openAPIV3Schema`` (checks 1-7 of the module docstring)."""
    checker = _Checker()
    checker.node(schema, "", needs_type=True, ancestors=(), root=True)
    return checker.problems


@dataclass
class _Checker:
    problems: list[Problem] = field(default_factory=list)

    def add(self, path: str, message: str, fix: str) -> None:
        self.problems.append(Problem(path, message, fix))

    # ------------------------------------------------------------------ structure
    def node(
        self,
        node: Mapping[str, Any],
        path: str,
        needs_type: bool,
        ancestors: tuple[Located, ...],
        root: bool = False,
    ) -> None:
        """Check one schema node and everything under it; ``ancestors`` are the enclosing
        lists and maps (path, node), whose size multiplies the cost of rules below them."""
        self.keywords(node, path)
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if int_or_string and "type" in node:
            self.add(path, "x-kubernetes-int-or-string with a type", "remove the type")
        if needs_type and not node.get("type") and not int_or_string and not preserve:
            self.add(path, "no type", "give the field a type (structural schema)")
        for junctor in JUNCTORS:
            if junctor in node:
                self.junctor(node, junctor, path, int_or_string)
        self.list_and_map_types(node, path)
        if "default" in node:
            self.default(node, path)
        self.rules(node, path, ancestors)
        for name, sub in (node.get("properties") or {}).items():
            if root and name == "metadata":
                self.metadata(sub, ".metadata")
                continue
            if root and name in ("apiVersion", "kind") and sub.get("type") != "string":
                self.add(f".{name}", f"{name} is not type: string", "set type: string")
            self.node(sub, f"{path}.{name}", needs_type=True, ancestors=ancestors)
        items = node.get("items")
        if isinstance(items, Mapping):
            self.node(items, f"{path}[*]", needs_type=True, ancestors=(*ancestors, (path, node)))
        elif items is not None:
            self.add(path, "items is a list (tuple validation)", "use one items schema")
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping):
            self.node(extra, f"{path}.*", needs_type=True, ancestors=(*ancestors, (path, node)))

    def keywords(self, node: Mapping[str, Any], path: str) -> None:
        for key in node:
            if key in FORBIDDEN_KEYS:
                self.add(path, f"{key} is not allowed in a CRD schema", FORBIDDEN_KEYS[key])
            elif key not in KNOWN_KEYS:
                self.add(path, f"unknown keyword {key!r}", "remove it")
        if node.get("uniqueItems") is True:
            self.add(path, "uniqueItems: true (quadratic to check)", "use x-kubernetes-list-type")
        extra = node.get("additionalProperties")
        if extra is False:
            self.add(path, "additionalProperties: false", "remove it (unknown fields are pruned)")
        if extra is not None and extra is not False and node.get("properties"):
            self.add(
                path,
                "properties together with additionalProperties",
                "use one: fixed fields (properties) or a map (additionalProperties)",
            )

    def junctor(
        self, node: Mapping[str, Any], junctor: str, path: str, int_or_string: bool
    ) -> None:
        branches = node[junctor] if isinstance(node[junctor], list) else [node[junctor]]
        if int_or_string and junctor == "anyOf" and branches == INT_OR_STRING:
            return
        for i, branch in enumerate(branches):
            where = f"{path}({junctor}[{i}])"
            for sub_path, sub in _walk(branch, where):
                for key in sub:
                    extension = (
                        key.startswith("x-kubernetes-") and key != "x-kubernetes-validations"
                    )
                    if key in NOT_IN_JUNCTORS or extension:
                        self.add(
                            sub_path,
                            f"{key} inside {junctor}",
                            f"move {key} out of {junctor} to the field itself",
                        )
            for name in (branch.get("properties") or {}) if isinstance(branch, Mapping) else ():
                if name not in (node.get("properties") or {}):
                    self.add(
                        f"{where}.{name}",
                        f"{junctor} names the field {name!r}, which is not specified outside it",
                        f"add {name} to the properties of {path or 'the root'}",
                    )
            if isinstance(branch, Mapping) and "items" in branch and "items" not in node:
                self.add(where, f"{junctor} sets items that are not specified outside it", "")

    def metadata(self, node: Mapping[str, Any], path: str) -> None:
        if node.get("type") != "object":
            self.add(path, "metadata without type: object", "set type: object")
        allowed = {"type", "properties", "description"}
        for key in set(node) - allowed:
            self.add(path, f"{key} on metadata", "restrict only metadata.name or generateName")
        for name, sub in (node.get("properties") or {}).items():
            if name not in ("name", "generateName"):
                self.add(f"{path}.{name}", "a restriction on metadata." + name, "remove it")
            elif "default" in sub:
                self.add(f"{path}.{name}", "a default under metadata", "remove it")
            elif sub.get("type") != "string":
                self.add(f"{path}.{name}", "metadata.name must be type: string", "set it")

    def list_and_map_types(self, node: Mapping[str, Any], path: str) -> None:
        list_type = node.get("x-kubernetes-list-type")
        keys = node.get("x-kubernetes-list-map-keys")
        if list_type is not None and node.get("type") != "array":
            self.add(path, "x-kubernetes-list-type on a non-array", "remove it")
        if list_type not in (None, "atomic", "set", "map"):
            self.add(path, f"x-kubernetes-list-type {list_type!r}", "use atomic, set or map")
        if keys is not None and list_type != "map":
            self.add(path, "x-kubernetes-list-map-keys without list-type map", "set list-type map")
        items = node.get("items") if isinstance(node.get("items"), Mapping) else {}
        if list_type == "set" and items.get("type") not in SCALARS:
            self.add(path, "list-type set of non-scalar items", "use list-type map or atomic")
        if list_type == "map":
            if items.get("type") != "object":
                self.add(path, "list-type map of non-object items", "use objects with keys")
            if not keys:
                self.add(path, "list-type map without x-kubernetes-list-map-keys", "name the keys")
            for key in keys or []:
                prop = (items.get("properties") or {}).get(key)
                if prop is None or prop.get("type") not in SCALARS:
                    self.add(f"{path}[*].{key}", "a list-map key that is not a scalar field", "")
                elif key not in (items.get("required") or []) and "default" not in prop:
                    self.add(
                        f"{path}[*].{key}",
                        "a list-map key that is neither required nor defaulted",
                        f"add {key!r} to required",
                    )
        map_type = node.get("x-kubernetes-map-type")
        if map_type is not None and node.get("type") != "object":
            self.add(path, "x-kubernetes-map-type on a non-object", "remove it")
        if map_type not in (None, "granular", "atomic"):
            self.add(path, f"x-kubernetes-map-type {map_type!r}", "use granular or atomic")

    def default(self, node: Mapping[str, Any], path: str) -> None:
        for where, message in _value_problems(node["default"], node, path):
            self.add(where, f"default {message}", "fix the default in api/types.py")

    # ------------------------------------------------------------------ CEL
    def rules(
        self,
        node: Mapping[str, Any],
        path: str,
        ancestors: tuple[Located, ...],
    ) -> None:
        for rule in node.get("x-kubernetes-validations") or []:
            text = rule.get("rule", "")
            where = f"the CEL rule `{text}` on {path or '.'}"
            if "\n" in rule.get("message", ""):
                self.add(path, f"{where} has a message with a line break", "use one line")
            for container_path, container in ancestors:
                if not _bounded(container):
                    self.add(
                        container_path,
                        f"{where} runs once per element of this {_kind(container)}, "
                        f"{_unbounded(container)}",
                        _bound_fix(container),
                    )
            try:
                reads = rule_reads(text, node, path)
            except celpy.CELParseError as exc:
                self.add(path, f"{where} does not parse: {exc}", "fix the rule in api/validation")
                continue
            for read_path, message in reads.undefined:
                self.add(read_path, f"{where} {message}", "fix the rule or the field name")
            for read_path, read in reads.nodes:
                if not _bounded(read):
                    self.add(
                        read_path,
                        f"{where} reads this {_kind(read)}, {_unbounded(read)}",
                        _bound_fix(read),
                    )


def _kind(node: Mapping[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int-or-string"
    if node.get("x-kubernetes-preserve-unknown-fields") and not node.get("properties"):
        return "free-form object"
    if node.get("type") == "object":
        return "map" if isinstance(node.get("additionalProperties"), Mapping) else "object"
    return str(node.get("type", "value"))


def _bound_key(node: Mapping[str, Any]) -> str:
    return {"array": "maxItems", "map": "maxProperties"}.get(_kind(node), "maxLength")


def _unbounded(node: Mapping[str, Any]) -> str:
    """Why the API server cannot bound a rule's cost over ``node``."""
    if _kind(node) == "free-form object":
        return "whose size CEL cannot bound (x-kubernetes-preserve-unknown-fields)"
    return f"which has no {_bound_key(node)}, so the API server cannot bound the rule's cost"


def _bound_fix(node: Mapping[str, Any]) -> str:
    if _kind(node) == "free-form object":
        return "do not read a free-form object in a CEL rule"
    return f"set a {_bound_key(node)}: {TYPES_FIX}"


def _bounded(node: Mapping[str, Any]) -> bool:
    """Whether CEL's cost estimator can bound the size of a value of this schema."""
    kind = _kind(node)
    if kind in ("string", "int-or-string"):
        return "maxLength" in node or "enum" in node
    if kind == "array":
        return "maxItems" in node
    if kind == "map":
        return "maxProperties" in node
    return kind != "free-form object"


def _walk(node: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every schema node under ``node`` (itself first), with its path."""
    if not isinstance(node, Mapping):
        return
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), Mapping):
        yield from _walk(node["items"], f"{path}[*]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    for junctor in JUNCTORS:
        branches = node.get(junctor)
        for i, branch in enumerate(branches if isinstance(branches, list) else [branches]):
            yield from _walk(branch, f"{path}({junctor}[{i}])")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def _value_problems(value: Any, schema: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """Type, enum and pruning problems of a (default) value under ``schema``."""
    if value is None:
        return [] if schema.get("nullable") else [(path, "is null, the field is not nullable")]
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [(path, f"{value!r} is neither an integer nor a string")]
    kind = schema.get("type")
    expected = _JSON_TYPES.get(kind or "")
    is_bool = isinstance(value, bool)
    if expected and (not isinstance(value, expected) or (is_bool and kind != "boolean")):
        return [(path, f"{value!r} is not of type {kind}")]
    if "enum" in schema and value not in schema["enum"]:
        return [(path, f"{value!r} is not one of {schema['enum']}")]
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, sub in value.items():
            if key in properties:
                found += _value_problems(sub, properties[key], f"{path}.{key}")
            elif isinstance(extra, Mapping):
                found += _value_problems(sub, extra, f"{path}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append((f"{path}.{key}", "sets a field the schema does not define (pruned)"))
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            found += _value_problems(item, schema["items"], f"{path}[{i}]")
    return found
