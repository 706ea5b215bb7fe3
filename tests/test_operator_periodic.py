"""The periodic-job schedule that replaces kopf timers (pure: the tests pass the clock), and the
scheduler task running jobs for the resources it is given."""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
from typing import Any

from prefixserving.controller import periodic
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
