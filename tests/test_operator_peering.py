"""Active-passive HA as the chart runs it (``--peering``, no ``--priority``): two operators on
one emulator, registered in the peering object the chart creates (one ClusterKopfPeering, or
a KopfPeering in the watched namespace). Exactly one reconciles; the paused one's
periodic jobs make no requests; when the active one stops, the other takes over.

Each operator has its own kubeconfig token, so the emulator's request log says which one made
a request. What the emulator misses (a real API server's watch timing, pods that die without
a clean exit): ``e2e/test_ha_e2e.py`` on kind."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import kmock
import pytest

from prefixserving.kinds import KINDS, Kind
from prefixserving_lab.testing import prefixserving_body as resource
from prefixserving_lab.testing import wait_for
from support.kube_emulator import resources
from support.operator_harness import Harness

PEERING = "prefixserving-operator"  # the chart's peering.name
NAMESPACE = "t-ha"


class Records(logging.Handler):
    """Log records of the named loggers, kept for the test to wait on."""

    def __init__(self, *loggers: str) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.loggers = [logging.getLogger(name) for name in loggers]

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Records:
        for logger in self.loggers:
            logger.addHandler(self)
            logger.setLevel(logging.DEBUG)
        return self

    def __exit__(self, *_: object) -> None:
        for logger in self.loggers:
            logger.removeHandler(self)

    def seen(self, text: str) -> bool:
        return any(text in message for message in self.messages)


@dataclass(frozen=True)
class Scope:
    """How the chart runs the operator: cluster-wide, or with watchNamespaces."""

    peering: Kind  # the peering object the chart creates
    peering_namespace: str | None
    flags: tuple[str, ...]  # kopf's scope flags (the chart: --all-namespaces / --namespace)
    env: dict[str, str]


SCOPES = {
    "cluster-wide": Scope(
        KINDS[("kopf.dev/v1", "ClusterKopfPeering")], None, ("--all-namespaces",), {}
    ),
    "namespaced": Scope(
        KINDS[("kopf.dev/v1", "KopfPeering")],
        NAMESPACE,
        ("--namespace", NAMESPACE),
        {"PREFIXSERVING_NAMESPACES": NAMESPACE},
    ),
}


@pytest.fixture(params=sorted(SCOPES))
def scope(request: pytest.FixtureRequest) -> Scope:
    return SCOPES[request.param]


@pytest.fixture
def harness(tmp_path: Path, scope: Scope) -> Iterator[Harness]:
    env = {"PREFIXSERVING_PEERING": PEERING, "PREFIXSERVING_PEERING_CHECK_S": "1", **scope.env}
    running = Harness(tmp_path, extra_types=resources.KOPF_PEERING, env=env)
    running.kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    running.kube.request(
        "POST",
        scope.peering.path(scope.peering_namespace),
        body={"metadata": {"name": PEERING}},
    )
    yield running
    running.close()


@pytest.fixture
def records() -> Iterator[Records]:
    with Records("kopf._core.engines.peering", "prefixserving.controller.activity") as kept:
        yield kept


def priorities(harness: Harness, scope: Scope) -> list[int]:
    """The priorities of the peering object's keep-alive entries."""
    obj = harness.kube.get(scope.peering, scope.peering_namespace, PEERING) or {}
    return [entry["priority"] for entry in (obj.get("status") or {}).values()]


def writes_to(namespace: str, name: str) -> Callable[[kmock.Request], bool]:
    """Requests that change ``name`` or one of its children (named ``name`` or ``name-*``)."""

    def matches(request: kmock.Request) -> bool:
        path = request.url.path
        return (
            request.method.value not in ("GET", "HEAD")
            and f"/namespaces/{namespace}/" in path
            and any(part == name or part.startswith(f"{name}-") for part in path.split("/"))
        )

    return matches


def outside_peering(request: kmock.Request) -> bool:
    return "/apis/kopf.dev/" not in request.url.path


def test_one_active_operator_and_takeover(harness: Harness, scope: Scope, records: Records) -> None:
    harness.start_operator(*scope.flags, token="first")
    (first,) = wait_for(lambda: priorities(harness, scope), what="the first operator's keep-alive")
    harness.create(resource("early", NAMESPACE))
    wait_for(lambda: harness.children(NAMESPACE, "early"), what="the first operator reconciles")

    # The newer replica outranks the older one (start time as the priority): kopf pauses the
    # first, and the first's periodic jobs stop.
    harness.start_operator(*scope.flags, token="second")
    both = wait_for(lambda: len(p := priorities(harness, scope)) == 2 and p, what="two keep-alives")
    assert len(set(both)) == 2, f"the replicas share a kopf peering priority: {both}"
    (second,) = set(both) - {first}
    assert second > first
    wait_for(lambda: records.seen("Pausing operations in favour of"), what="kopf pauses the first")
    wait_for(
        lambda: records.seen(f"periodic jobs paused: this operator (peering priority {first})"),
        what="the first operator's periodic jobs paused",
    )

    # Exactly one operator reconciles a new resource.
    harness.create(resource("late", NAMESPACE))
    wait_for(lambda: harness.children(NAMESPACE, "late"), what="the second operator reconciles")
    wait_for(
        lambda: (
            harness.prefixserving(NAMESPACE, "late").get("status", {}).get("replicas") is not None
        ),
        what="the second operator's status job on the new resource",
    )
    late = writes_to(NAMESPACE, "late")
    assert [r for r in harness.requests_of("second") if late(r)]
    assert not [r for r in harness.requests_of("first") if late(r)]

    # The paused operator still indexes "early" but its jobs (1 s periods) start nothing: over
    # two re-reads of the peering object, it makes no request outside it.
    mark = len(harness.requests_of("first"))
    wait_for(
        lambda: (
            len([r for r in harness.requests_of("first")[mark:] if not outside_peering(r)]) >= 2
        ),
        what="two peering re-reads by the paused operator",
    )
    assert [r.url.path for r in harness.requests_of("first")[mark:] if outside_peering(r)] == []

    # The active one stops (kopf removes its keep-alive): the first takes over, jobs included.
    harness.stop_operator("second")
    assert priorities(harness, scope) == [first]
    harness.create(resource("after", NAMESPACE))
    wait_for(lambda: harness.children(NAMESPACE, "after"), what="the first operator takes over")
    wait_for(
        lambda: (
            harness.prefixserving(NAMESPACE, "after").get("status", {}).get("replicas") is not None
        ),
        what="the first operator's status job after the takeover",
    )
    assert [r for r in harness.requests_of("first") if writes_to(NAMESPACE, "after")(r)]
    assert records.seen(f"periodic jobs resumed: this operator (peering priority {first})")
