"""Helpers shared by the tests (``tests/``) and the cluster suite (``e2e/``): waiting for a
condition with a deadline and a small valid PrefixServing body. Like ``kopf.testing``, for test
code only.

Tests wait on the condition they need (:func:`wait_for`, or :func:`wait_for_async` inside a
test's event loop), never for a fixed time: a sleep is too short on a busy machine and wastes
time on an idle one.
"""

from __future__ import annotations

import asyncio
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
    """Call ``predicate`` every ``interval_s`` until it returns a truthy value and return that
    value; after ``timeout_s`` fail with ``what`` and the last value. An exception from
    ``predicate`` (a failed ``assert``, say) ends the wait at once. Cost: one call per interval.
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise _timed_out(what, timeout_s, last)


async def wait_for_async(
    predicate: Callable[[], T],
    timeout_s: float = 60.0,
    what: str = "condition",
    interval_s: float = 0.02,
) -> T:
    """:func:`wait_for` inside an event loop: sleeps with ``asyncio.sleep`` between calls, so
    the servers and clients running in the same loop go on meanwhile."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        await asyncio.sleep(interval_s)
    raise _timed_out(what, timeout_s, last)


def _timed_out(what: str, timeout_s: float, last: object) -> AssertionError:
    return AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


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
