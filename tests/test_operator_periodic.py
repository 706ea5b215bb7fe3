"""The periodic-job schedule that replaces kopf timers (pure: the tests pass the clock), and the
scheduler task running jobs for the resources it is given."""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

from prefixserving.controller import periodic
from prefixserving.controller.activity import ActivityGate, is_active
from prefixserving.controller.periodic import Job, Schedule
from prefixserving.controller.settings import Settings


def _noop(kube: Any, body: Any) -> None:
    return None


STATUS = Job("status", period_s=30.0, first_after_s=0.0, fn=_noop)
RESYNC = Job("resync", period_s=300.0, first_after_s=300.0, fn=_noop)


def ids(started: list[tuple[str, Job]]) -> list[tuple[str, str]]:
    return [(uid, job.id) for uid, job in started]


def test_first_runs_then_one_period_after_each_finished_run() -> None:
    schedule = Schedule([STATUS, RESYNC])
    assert ids(schedule.due(["a"], now=0.0)) == [("a", "status")]
    assert schedule.due(["a"], now=50.0) == []  # still running: never two runs at once
    schedule.finished("a", STATUS, now=60.0)
    assert schedule.next_due() == 90.0
    assert schedule.due(["a"], now=89.9) == []
    assert ids(schedule.due(["a"], now=90.0)) == [("a", "status")]
    schedule.finished("a", STATUS, now=91.0)
    assert ids(schedule.due(["a"], now=300.0)) == [("a", "status"), ("a", "resync")]


def test_resources_are_scheduled_independently_and_forgotten_when_gone() -> None:
    schedule = Schedule([STATUS])
    assert ids(schedule.due(["a"], now=0.0)) == [("a", "status")]
    schedule.finished("a", STATUS, now=1.0)
    assert ids(schedule.due(["a", "b"], now=10.0)) == [("b", "status")]
    assert schedule.due(["b"], now=20.0) == []  # "a" deleted: forgotten
    schedule.finished("b", STATUS, now=21.0)
    assert schedule.next_due() == 51.0
    # The same resource name recreated has a new uid: it starts afresh, at once.
    assert ids(schedule.due(["b", "a2"], now=22.0)) == [("a2", "status")]


def test_a_run_that_ends_after_its_resource_was_deleted_is_dropped() -> None:
    schedule = Schedule([STATUS])
    schedule.due(["a"], now=0.0)
    schedule.due([], now=1.0)
    schedule.finished("a", STATUS, now=2.0)
    assert schedule.next_due() == float("inf")


def test_jobs_follow_the_settings() -> None:
    settings = Settings(status_interval_s=7.0, metrics_interval_s=11.0, resync_interval_s=13.0)
    jobs = {job.id: job for job in periodic.jobs(settings)}
    assert {k: (j.period_s, j.first_after_s) for k, j in jobs.items()} == {
        "status": (7.0, 0.0),
        "metrics": (11.0, 0.0),
        "resync": (13.0, 13.0),
    }


async def test_scheduler_runs_due_jobs_in_threads_and_survives_failures() -> None:
    calls: list[str] = []

    def record(kube: Any, body: Any) -> None:
        calls.append(body["metadata"]["name"])

    def fail(kube: Any, body: Any) -> None:
        raise RuntimeError("API server unreachable")

    bodies = {
        "u1": {"metadata": {"name": "live"}},
        "u2": {"metadata": {"name": "deleting", "deletionTimestamp": "2026-01-01T00:00:00Z"}},
    }
    schedule = Schedule([Job("status", 3600.0, 0.0, record), Job("failing", 3600.0, 0.0, fail)])

    loop = asyncio.get_running_loop()

    async def all_finished() -> None:
        # Each (uid, job) has run once when none is running and all are due a period later.
        while schedule.running or not loop.time() + 1800.0 < schedule.next_due() < math.inf:
            await asyncio.sleep(0.01)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor:
        task = asyncio.create_task(
            periodic.run(lambda: bodies, kube=None, schedule=schedule, executor=executor)  # type: ignore[arg-type]
        )
        await asyncio.wait_for(all_finished(), timeout=10.0)
        assert not task.done()  # the failing job was logged, not raised
        task.cancel()
    assert calls == ["live"]  # the body being deleted was skipped


def test_resync_leaves_a_resource_whose_change_is_still_being_reconciled() -> None:
    """kopf's update handler (which retries) owns a generation the status has not observed;
    a resource being deleted is left alone too. Neither touches the API (kube is None)."""
    from prefixserving.controller.handlers import reconcile

    pending = {"metadata": {"name": "p", "generation": 3}, "status": {"observedGeneration": 2}}
    deleting = {
        "metadata": {"name": "d", "generation": 1, "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"observedGeneration": 1},
    }
    for body in (pending, deleting):
        reconcile.resync(None, body)  # type: ignore[arg-type]


async def test_a_paused_operator_starts_no_job_and_runs_each_once_on_resuming() -> None:
    """With a gate (peering), no job starts while a peer outranks this operator (priority 5);
    after the peer goes, each due job runs once: skipped while paused, not queued."""
    calls: list[str] = []
    peers: dict[str, Any] = {"me": {"priority": 5}, "newer": {"priority": 7}}
    reads: list[int] = []

    def read() -> list[Mapping[str, Any] | None]:
        reads.append(len(peers))
        return [dict(peers)]

    loop = asyncio.get_running_loop()
    schedule = Schedule([Job("status", 3600.0, 0.0, lambda kube, body: calls.append("run"))])

    async def until(condition: Callable[[], bool]) -> None:
        while not condition():
            await asyncio.sleep(0.01)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as executor:
        gate = ActivityGate(read, priority=5, check_s=0.0, executor=executor)  # re-read each tick
        bodies = {"u1": {"metadata": {"name": "a"}}}
        task = asyncio.create_task(
            periodic.run(lambda: bodies, None, schedule, executor, gate, tick_s=0.01)  # type: ignore[arg-type]
        )
        await asyncio.wait_for(until(lambda: len(reads) >= 3), timeout=10.0)
        assert calls == []  # three answers "paused", nothing started
        del peers["newer"]
        await asyncio.wait_for(
            until(lambda: bool(calls) and not schedule.running and schedule.next_due() < math.inf),
            timeout=10.0,
        )
        task.cancel()
    assert calls == ["run"]
    assert schedule.next_due() > loop.time() + 1800.0  # the next run is one period away


def test_is_active_applies_kopfs_rule_to_live_peers() -> None:
    now = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)

    def peer(priority: int, seen_s_ago: float = 1.0, lifetime: int = 60) -> dict[str, Any]:
        seen = now - datetime.timedelta(seconds=seen_s_ago)
        return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}

    assert is_active({"me": peer(5)}, 5, now)
    assert is_active({"me": peer(5), "older": peer(3)}, 5, now)
    assert not is_active({"me": peer(5), "newer": peer(7)}, 5, now)
    assert is_active({"me": peer(5), "newer, dead": peer(7, seen_s_ago=61)}, 5, now)
    assert not is_active({"me": peer(5), "tie": peer(5)}, 5, now)  # kopf pauses both
    assert not is_active({"older": peer(3)}, 5, now)  # not registered yet
    assert not is_active({}, 5, now)
    assert not is_active(None, 5, now)  # the peering object is missing


def test_the_gate_reads_the_cluster_peering_or_one_per_watched_namespace() -> None:
    from prefixserving.controller import activity

    class Recorder:
        def __init__(self) -> None:
            self.gets: list[tuple[str, str | None, str]] = []

        def get(self, kind: Any, namespace: str | None, name: str) -> dict[str, Any] | None:
            self.gets.append((kind.kind, namespace, name))
            return None if namespace == "gone" else {"status": {"me": {"priority": 1}}}

    kube = Recorder()
    cluster = activity.peering_statuses(kube, Settings(peering="ha"))  # type: ignore[arg-type]
    assert kube.gets == [("ClusterKopfPeering", None, "ha")] and cluster == [
        {"me": {"priority": 1}}
    ]
    kube.gets.clear()
    namespaced = Settings(peering="ha", namespaces=("llm", "gone"))
    assert activity.peering_statuses(kube, namespaced) == [{"me": {"priority": 1}}, None]  # type: ignore[arg-type]
    assert kube.gets == [("KopfPeering", "llm", "ha"), ("KopfPeering", "gone", "ha")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        assert activity.ActivityGate.for_operator(kube, Settings(), 1, executor) is None  # type: ignore[arg-type]
