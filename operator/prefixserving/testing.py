"""Helpers shared by the emulator tests (``tests/``) and the cluster suite (``e2e/``): polling
with a deadline and a small valid PrefixServing body. Like ``kopf.testing``, for test code only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prefixserving import constants

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float = 60.0,
    what: str = "condition",
    interval_s: float = 0.1,
) -> T:
    """Poll ``predicate`` every ``interval_s`` until it returns a truthy value; fail with the
    last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


def prefixserving_body(name: str, namespace: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A small valid PrefixServing; keyword arguments replace top-level spec blocks."""
    body: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {
                "servedName": "tiny-llama",
                "source": {"huggingFace": {"repo": "example/tiny-llama"}},
            },
            "replicas": replicas,
        },
    }
    body["spec"].update(spec)
    return body
