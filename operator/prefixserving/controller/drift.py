"""Drift between a child the operator renders and the object the API server holds.

``drifted(desired, actual)`` lists the paths where ``actual`` does not contain ``desired``:
every key of a desired map must be present with a matching value, desired lists must have the
same length and match item by item, scalars must be equal. Keys only the server or other
controllers add (status, defaults, annotations from Argo CD or Flux, ``replicas`` when an
autoscaler owns them and the operator does not render them) are not drift. Quantities the server
normalises ("0.5" -> "500m") can look like drift; re-applying them is a no-op on the server, so a
false positive costs one request and never loops. Cost: linear in the size of ``desired``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def drifted(desired: Any, actual: Any, path: str = "") -> list[str]:
    """Paths (dotted, ``[i]`` for list items) where ``actual`` lacks what ``desired`` has."""
    if isinstance(desired, Mapping):
        if not isinstance(actual, Mapping):
            return [path or "."]
        found: list[str] = []
        for key, value in desired.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in actual:
                found.append(child)
            else:
                found.extend(drifted(value, actual[key], child))
        return found
    if isinstance(desired, list):
        if not isinstance(actual, list) or len(actual) != len(desired):
            return [path]
        return [
            p
            for i, (d, a) in enumerate(zip(desired, actual, strict=True))
            for p in drifted(d, a, f"{path}[{i}]")
        ]
    return [] if desired == actual or str(desired) == str(actual) else [path]
