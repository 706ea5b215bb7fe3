"""What a CEL rule of a CRD reads: :func:`rule_reads` maps a rule on a schema node to the schema
nodes (with field paths) its field chains reach, for the cost checks of ``api/admission.py``.

Algorithm: parse the rule with cel-python's parser (a lark tree), then walk it. A field chain
(``self.a.b``, ``x[i]``, the variable of ``all``/``exists``/``exists_one``/``map``/``filter``)
resolves step by step through ``properties``, ``items`` and ``additionalProperties``; every
node a step reaches is a read. A macro variable stands for the list's items (or the map's
keys) it iterates. Arguments of ``has()`` are presence tests, not reads. At the root,
``self.metadata`` offers ``name`` and ``generateName`` (bounded by the server), as the API
server's CEL environment does. A name the schema does not define is reported as undefined.

Cost: one parse, then O(rule length x chain depth).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
from lark import Token, Tree

Located = tuple[str, Mapping[str, Any]]  # (field path, schema node)
Env = dict[str, Located]  # CEL variable -> what it stands for

MACROS = ("all", "exists", "exists_one", "map", "filter")
# Single-child wrapper nodes of cel-python's grammar around a plain operand.
WRAPPERS = (
    "expr",
    "conditionalor",
    "conditionaland",
    "relation",
    "addition",
    "multiplication",
    "unary",
    "member",
    "primary",
    "paren_expr",
)
# What the API server exposes of metadata to CEL rules at the root, and its bounds.
CEL_METADATA = {
    "name": {"type": "string", "maxLength": 253},
    "generateName": {"type": "string", "maxLength": 253},
}


@dataclass
class Reads:
    """The nodes a rule reads, and the names it uses that the schema does not define."""

    nodes: list[Located] = field(default_factory=list)
    undefined: list[tuple[str, str]] = field(default_factory=list)


def rule_reads(rule: str, node: Mapping[str, Any], path: str) -> Reads:
    """What ``rule`` (on the schema ``node`` at field ``path``; "" is the root) reads.
    Raises ``celpy.CELParseError`` when the rule does not parse."""
    tree = celpy.Environment().compile(rule)
    walker = _Reads(node, path, root=path == "")
    walker.visit(tree, {})
    return Reads(walker.nodes, walker.undefined)


class _Reads:
    """The walk of one rule's parse tree (see the module docstring)."""

    def __init__(self, node: Mapping[str, Any], path: str, root: bool) -> None:
        self.self_node = node
        self.self_path = path
        self.root = root
        self.nodes: list[Located] = []
        self.undefined: list[tuple[str, str]] = []

    def visit(self, tree: Any, env: Env) -> None:
        if not isinstance(tree, Tree):
            return
        data = tree.data
        if data == "ident_arg" and _token(tree.children[0]) == "has":
            return  # has(x.y) tests presence: constant cost
        if data == "member_dot_arg":
            self.call(tree, env)
            return
        if data in ("member_dot", "member_index", "ident"):
            self.resolve(tree, env)
            return
        for child in tree.children:
            self.visit(child, env)

    def call(self, tree: Tree, env: Env) -> None:
        receiver, method = tree.children[0], _token(tree.children[1])
        args = [c for c in (tree.children[2].children if len(tree.children) > 2 else [])]
        names = [_bare_ident(a) for a in args]
        variables = names[:2] if len(args) >= 3 and all(names[:2]) else names[:1]
        if method in MACROS and len(args) >= 2 and all(variables):
            target = self.resolve(receiver, env)
            element = _element(target)
            inner = dict(env)
            if len(variables) == 2:  # all(i, v, ...): index or key, then value
                inner[str(variables[0])] = ("(index)", {"type": "integer"})
            if element is not None:
                inner[str(variables[-1])] = element
            for arg in args[len(variables) :]:
                self.visit(arg, inner)
            return
        self.resolve(receiver, env)
        for arg in args:
            self.visit(arg, env)

    def resolve(self, tree: Any, env: Env) -> Located | None:
        """The (path, schema) a field chain denotes, recording every step as a read."""
        tree = _unwrap(tree)
        if not isinstance(tree, Tree):
            return None
        found: Located | None = None
        if tree.data == "ident":
            name = _token(tree.children[0])
            if name in ("self", "oldSelf"):
                found = (self.self_path or ".", self.self_node)
            elif name in env:
                found = env[name]
        elif tree.data == "member_dot":
            base = self.resolve(tree.children[0], env)
            if base is None:
                self.visit(tree.children[0], env)
                return None
            found = self.step(base, _token(tree.children[1]))
        elif tree.data == "member_index":
            base = self.resolve(tree.children[0], env)
            self.visit(tree.children[1], env)
            found = _indexed(base)
        else:
            self.visit(tree, env)
            return None
        if found is not None:
            self.nodes.append(found)
        return found

    def step(self, base: Located, name: str) -> Located | None:
        path, node = base
        if self.root and node is self.self_node and name == "metadata":
            return ".metadata", {"type": "object", "properties": CEL_METADATA}
        properties = node.get("properties") or {}
        if name in properties:
            return f"{'' if path == '.' else path}.{name}", properties[name]
        if isinstance(node.get("additionalProperties"), Mapping):
            return f"{path}.*", node["additionalProperties"]
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return None
        self.undefined.append((path, f"reads {name!r}, which the schema does not define"))
        return None


def _element(base: Located | None) -> Located | None:
    """What a macro over ``base`` iterates: a list's items, or a map's keys."""
    if base is None:
        return None
    path, node = base
    if isinstance(node.get("items"), Mapping):
        return f"{path}[*]", node["items"]
    if isinstance(node.get("additionalProperties"), Mapping):
        return f"{path}.(key)", {"type": "string"}
    return None


def _indexed(base: Located | None) -> Located | None:
    """What ``base[i]`` yields: a list's item, or a map's value."""
    if base is None:
        return None
    path, node = base
    if isinstance(node.get("items"), Mapping):
        return f"{path}[*]", node["items"]
    if isinstance(node.get("additionalProperties"), Mapping):
        return f"{path}.*", node["additionalProperties"]
    return None


def _unwrap(tree: Any) -> Any:
    while isinstance(tree, Tree) and tree.data in WRAPPERS and len(tree.children) == 1:
        tree = tree.children[0]
    return tree


def _bare_ident(tree: Any) -> str | None:
    inner = _unwrap(tree)
    if isinstance(inner, Tree) and inner.data == "ident":
        return _token(inner.children[0])
    return None


def _token(child: Any) -> str:
    return str(child.value) if isinstance(child, Token) else str(child)
