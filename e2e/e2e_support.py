"""Helpers of the end-to-end tests: polling and a small valid PrefixServing body."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from prefixserving import constants

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 120.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


def prefixserving(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {
                "servedName": "tiny-llama",
                "source": {"huggingFace": {"repo": "example/tiny-llama"}},
            },
            "replicas": 1,
        },
    }
    body["spec"].update(spec)
    return body
