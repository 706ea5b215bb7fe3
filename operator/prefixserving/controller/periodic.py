"""Periodic work on every PrefixServing, without kopf timers, so that no finalizer is needed.

kopf puts its finalizer on every object that has a timer or a daemon (it must see the deletion
to stop them), and a finalizer makes ``kubectl delete`` hang while the operator is down. The
children need no clean-up of their own: their owner references let Kubernetes garbage
collection delete them. So the periodic jobs run from one scheduler task per operator process
instead, over the live PrefixServings that kopf's index holds:

=========  ====================================  =======================================
job        period (``Settings``)                 work
=========  ====================================  =======================================
status     ``status_interval_s`` (30 s)          children -> replicas, Ready, Progressing
metrics    ``metrics_interval_s`` (30 s)         Prometheus -> ``status.metrics``
resync     ``resync_interval_s`` (300 s)         full re-apply of the children
=========  ====================================  =======================================

Algorithm (:class:`Schedule`, pure): a resource's jobs are due when it first appears (resync
only one period later); when a run ends, the next one is due one period later, so runs of one
job never overlap for one resource. A resource that leaves the index is forgotten, and one
that comes back under a new uid starts afresh. :func:`run` wakes every ``TICK_S`` (or
earlier when a job is due), hands the due jobs to a thread pool (the API client is
synchronous) and never waits for them.

Differences from kopf timers: a job reads the body kopf last indexed (the same snapshot a timer
would get); resync waits for the current generation to be reconciled instead of kopf's
``idle`` (see ``reconcile.resync``). With kopf peering, jobs start only while this operator is
the active replica (:class:`~prefixserving.controller.activity.ActivityGate`; kopf exposes no
pause signal to operator-level tasks): a paused replica keeps the bodies it indexed before the
pause, and without the gate it would go on writing their status next to the active one. While
paused, due jobs are skipped, not queued: each (resource, job) keeps one due time, so on
resuming every overdue job runs once.

Cost per wake-up: O(resources x jobs) dictionary operations; per run, the job's own requests;
with peering, the gate's re-read of the peering objects (at most every ``peering_check_s``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefixserving import constants
from prefixserving.controller.activity import ActivityGate
from prefixserving.controller.handlers import reconcile, status
from prefixserving.controller.kube import Kube
from prefixserving.controller.settings import MAX_WORKERS, Settings

logger = logging.getLogger(__name__)

# Longest sleep of the scheduler: a new resource gets its first status within this time.
TICK_S = 1.0

JobFn = Callable[[Kube, Mapping[str, Any]], object]


@dataclass(frozen=True)
class Job:
    """A periodic job: its id (a handler id, for logs), period, first delay, and work."""

    id: str
    period_s: float
    first_after_s: float
    fn: JobFn


def jobs(settings: Settings) -> tuple[Job, ...]:
    """The operator's periodic jobs with the periods of ``settings``."""
    metrics = partial(
        status.refresh_metrics,
        prometheus_url=settings.prometheus_url,
        timeout_s=settings.prometheus_timeout_s,
    )
    return (
        Job(constants.HANDLER_STATUS, settings.status_interval_s, 0.0, status.refresh),
        Job(constants.HANDLER_METRICS, settings.metrics_interval_s, 0.0, metrics),
        Job(
            constants.HANDLER_RESYNC,
            settings.resync_interval_s,
            settings.resync_interval_s,
            reconcile.resync,
        ),
    )


class Schedule:
    """When each job of each resource is due next; pure (the caller passes the clock)."""

    def __init__(self, jobs: Iterable[Job]) -> None:
        self.jobs = tuple(jobs)
        self._next: dict[tuple[str, str], float] = {}  # (uid, job id) -> due time
        self._running: set[tuple[str, str]] = set()

    def due(self, uids: Iterable[str], now: float) -> list[tuple[str, Job]]:
        """The (uid, job) pairs to start at ``now``, marked running; forgets absent uids."""
        live = set(uids)
        for key in [k for k in self._next if k[0] not in live]:
            del self._next[key]
        started = []
        for uid in sorted(live):
            for job in self.jobs:
                key = (uid, job.id)
                due = self._next.setdefault(key, now + job.first_after_s)
                if key not in self._running and due <= now:
                    self._running.add(key)
                    started.append((uid, job))
        return started

    def finished(self, uid: str, job: Job, now: float) -> None:
        """A run ended at ``now``: the next is due one period later (if the uid is still known)."""
        key = (uid, job.id)
        self._running.discard(key)
        if key in self._next:
            self._next[key] = now + job.period_s

    @property
    def running(self) -> frozenset[tuple[str, str]]:
        """The (uid, job id) pairs started and not finished."""
        return frozenset(self._running)

    def next_due(self) -> float:
        """The earliest due time of a job not running (infinity when none)."""
        return min((t for k, t in self._next.items() if k not in self._running), default=math.inf)


def _run_job(job: Job, kube: Kube, body: Mapping[str, Any]) -> None:
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return
    try:
        job.fn(kube, body)
    except Exception:  # a failed run is logged and retried at the next period
        logger.exception("%s of %s/%s failed", job.id, meta.get("namespace"), meta.get("name"))


def indexed_bodies(index: Mapping[Any, Iterable[Mapping[str, Any]]]) -> dict[str, Mapping]:
    """uid -> body from kopf's index of PrefixServings (key: uid, value: the body)."""
    return {uid: body for uid, store in index.items() for body in store}


async def run(
    bodies: Callable[[], dict[str, Mapping[str, Any]]],
    kube: Kube,
    schedule: Schedule,
    executor: concurrent.futures.Executor,
    gate: ActivityGate | None = None,
    tick_s: float = TICK_S,
) -> None:
    """Run due jobs forever (until cancelled); ``bodies`` returns the live uid -> body map.
    With a ``gate`` (peering), jobs start only while it says this operator is active; while
    paused, the loop wakes every ``tick_s`` and starts nothing."""
    loop = asyncio.get_running_loop()
    while True:
        live = bodies()
        if live and (gate is None or await gate.active()):
            for uid, job in schedule.due(live, loop.time()):
                future = loop.run_in_executor(executor, _run_job, job, kube, live[uid])
                future.add_done_callback(
                    lambda _, uid=uid, job=job: schedule.finished(uid, job, loop.time())
                )
            delay = schedule.next_due() - loop.time()
        else:
            delay = tick_s
        await asyncio.sleep(max(0.0, min(tick_s, delay)))


@dataclass
class Scheduler:
    """The running scheduler task and its thread pool (kept in kopf's memo)."""

    task: asyncio.Task[None]
    executor: concurrent.futures.ThreadPoolExecutor

    @classmethod
    def start(
        cls,
        index: Mapping[Any, Iterable[Mapping[str, Any]]],
        kube: Kube,
        settings: Settings,
        peering_priority: int,
    ) -> Scheduler:
        """Start the jobs over kopf's ``index``; ``peering_priority`` is the one kopf runs with
        (used only with ``settings.peering``)."""
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=MAX_WORKERS, thread_name_prefix="prefixserving-periodic"
        )
        gate = ActivityGate.for_operator(kube, settings, peering_priority, executor)
        task = asyncio.create_task(
            run(partial(indexed_bodies, index), kube, Schedule(jobs(settings)), executor, gate),
            name="prefixserving periodic jobs",
        )
        return cls(task=task, executor=executor)

    async def stop(self) -> None:
        """Cancel the scheduler; running jobs finish, none starts."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)
