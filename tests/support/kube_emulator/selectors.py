"""Kubernetes label and field selectors, as the API server parses them.

Supported label syntax (comma-separated requirements, all must hold): ``k=v``, ``k==v``,
``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``. Field selectors support
``metadata.name`` and ``metadata.namespace`` with ``=``, ``==`` and ``!=``.
Parsing is linear in the selector's length; matching is linear in the number of requirements.
:func:`equalities` gives the ``k=v`` requirements a store can look up in an index.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _requirement(text: str) -> Requirement:
    match = _SET_RE.match(text)
    if match:
        key, operator, raw_values = match.groups()
        values = {value.strip() for value in raw_values.split(",") if value.strip()}
        if operator == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if "!=" in text:
        key, value = (part.strip() for part in text.split("!=", 1))
        return lambda labels: labels.get(key) != value
    if "=" in text:
        key, value = (part.strip() for part in text.replace("==", "=").split("=", 1))
        return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        key = text[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: text in labels


def equalities(selector: str | None) -> list[tuple[str, str]]:
    """The ``k=v`` / ``k==v`` requirements of a label selector, as (key, value) pairs: an
    object matches the selector only if it has all of them (a store indexes by them)."""
    pairs = []
    for part in _split(selector or ""):
        if _SET_RE.match(part) or "!=" in part or "=" not in part:
            continue
        key, value = (item.strip() for item in part.replace("==", "=").split("=", 1))
        pairs.append((key, value))
    return pairs


def parse_label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """Return a predicate over a label dict; an empty selector matches everything."""
    requirements = [_requirement(part) for part in _split(selector or "")]
    return lambda labels: all(requirement(labels) for requirement in requirements)


def parse_field_selector(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """Return a predicate over an object for ``metadata.name`` / ``metadata.namespace``."""
    checks: list[Callable[[Mapping[str, Any]], bool]] = []
    for part in _split(selector or ""):
        negate = "!=" in part
        field, value = (
            item.strip() for item in part.replace("==", "=").replace("!=", "=").split("=", 1)
        )
        if field not in {"metadata.name", "metadata.namespace"}:
            raise ValueError(f"field selector {field!r} is not supported")
        attribute = field.split(".", 1)[1]

        def check(
            obj: Mapping[str, Any],
            attribute: str = attribute,
            value: str = value,
            negate: bool = negate,
        ) -> bool:
            actual = obj.get("metadata", {}).get(attribute)
            return (actual != value) if negate else (actual == value)

        checks.append(check)
    return lambda obj: all(check(obj) for check in checks)
