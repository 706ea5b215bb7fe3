"""Deletion needs no operator: PrefixServings carry no finalizer, and the emulator's garbage
collection (owner references, as the real API server's) removes the children.

The emulator deletes dependents synchronously in the same request; a real cluster's garbage
collector does it in the background, which ``e2e/test_apiserver_e2e.py`` checks on kind. A
child that the running operator's in-flight reconcile applies after the deletion names a gone
owner and is collected too, in the emulator as on a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixserving.controller.settings import FINALIZER
from prefixserving.kinds import PREFIX_SERVING
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.operator_harness import Harness


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path)
    yield running
    running.close()


def reconciled(h: Harness, namespace: str, name: str) -> bool:
    body = h.prefixserving(namespace, name)
    return (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]


def test_delete_while_the_operator_is_down_needs_no_finalizer(harness: Harness) -> None:
    harness.start_operator()
    harness.create(resource("down", "t-down"))
    wait_for(lambda: reconciled(harness, "t-down", "down"), what="reconcile")
    children = harness.children("t-down", "down")
    assert len(children) >= 6
    # Status and metrics jobs have run too (they ran as kopf timers before, which needed one).
    wait_for(lambda: harness.condition("t-down", "down", "Ready"), what="status job")
    assert not harness.prefixserving("t-down", "down")["metadata"].get("finalizers")

    harness.stop_operator()
    harness.kube.delete(PREFIX_SERVING, "t-down", "down")
    assert harness.kube.get(PREFIX_SERVING, "t-down", "down") is None
    assert harness.children("t-down", "down") == {}


def test_finalizer_of_an_earlier_operator_build_is_released(harness: Harness) -> None:
    """A resource finalized by an earlier build (which had a deletion handler) is released as
    soon as this operator sees it, so deleting it later does not wait for the operator."""
    body = resource("old", "t-old")
    body["metadata"]["finalizers"] = [FINALIZER]
    harness.create(body)
    harness.start_operator()
    wait_for(
        lambda: not harness.prefixserving("t-old", "old")["metadata"].get("finalizers"),
        what="the old finalizer removed",
    )
    wait_for(lambda: reconciled(harness, "t-old", "old"), what="reconcile")
    harness.stop_operator()
    harness.kube.delete(PREFIX_SERVING, "t-old", "old")
    assert harness.kube.get(PREFIX_SERVING, "t-old", "old") is None
    assert harness.children("t-old", "old") == {}


def test_delete_with_the_operator_running_is_immediate(harness: Harness) -> None:
    harness.start_operator()
    harness.create(resource("live", "t-live"))
    wait_for(lambda: reconciled(harness, "t-live", "live"), what="reconcile")
    harness.kube.delete(PREFIX_SERVING, "t-live", "live")
    assert harness.kube.get(PREFIX_SERVING, "t-live", "live") is None
    assert harness.children("t-live", "live") == {}
