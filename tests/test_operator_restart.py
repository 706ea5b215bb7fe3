"""An operator restart in the middle of a reconcile converges to the same objects, once each."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from prefixserving.api import lifecycle
from prefixserving.api.validation import parse_resource
from prefixserving.render import render_children
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.operator_harness import Harness


@pytest.fixture
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    running = Harness(tmp_path_factory.mktemp("restart"))
    yield running
    running.close()


def test_restart_mid_reconcile_converges_without_duplicates(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # Hold the operator's apply of the router Deployment: the reconcile stops half-way.
    release = harness.emulator.gate(
        lambda request: request.method.value == "PATCH" and request.name == "mid-router"
    )
    harness.start_operator()
    created = harness.create(resource("mid", "t-restart"))
    wait_for(
        lambda: "Deployment/mid-engine" in harness.children("t-restart", "mid"),
        what="first children",
    )
    assert "Deployment/mid-router" not in harness.children("t-restart", "mid")

    # Stop the operator while its request hangs, then let the in-flight request land late,
    # as a request sent just before a crash would.
    stopper = threading.Thread(target=harness.stop_operator)
    stopper.start()
    wait_for(
        lambda: any("Operator is stopping" in r.getMessage() for r in caplog.records),
        what="kopf's log line that it is stopping",
    )
    release()
    stopper.join(timeout=60)
    assert not stopper.is_alive()

    harness.start_operator()
    body = wait_for(
        lambda: (
            (b := harness.prefixserving("t-restart", "mid"))
            .get("status", {})
            .get("observedGeneration")
            == 1
            and b
        ),
        timeout_s=30,
        what="reconciled after restart",
    )
    rendered = render_children(parse_resource({k: v for k, v in body.items() if k != "status"}))
    children = harness.children("t-restart", "mid")
    assert sorted(children) == sorted(f"{c['kind']}/{c['metadata']['name']}" for c in rendered)
    for ref, obj in children.items():
        owners = obj["metadata"]["ownerReferences"]
        assert len(owners) == 1 and owners[0]["uid"] == created["metadata"]["uid"], ref
    degraded = harness.condition("t-restart", "mid", lifecycle.COND_DEGRADED)
    assert degraded is not None and degraded["status"] == "False"
    # The server holds exactly the PrefixServing and its children, nothing else.
    store = harness.emulator.server.store
    keys = harness.emulator.call(lambda: list(store.records))
    objects = [
        (key[0][2], key[2]) for key in keys if key[1] == "t-restart" and key[0][2] != "events"
    ]
    assert len(objects) == len(children) + 1
