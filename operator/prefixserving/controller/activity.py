"""Whether this operator is the active replica of its kopf peering, for the periodic jobs.

kopf pauses its own watching and handlers when another peer outranks this one, but it exposes
no pause signal to operator-level tasks (the pause toggles live inside ``kopf.run``). The
periodic jobs (``controller/periodic.py``) therefore ask the same source kopf decides from:
the peering object(s), whose ``status`` maps each peer's identity to its keep-alive
``{priority, lifetime, lastseen}`` (what kopf's keep-alive writes: ``Peer.as_dict`` in
``kopf/_core/engines/peering.py``; only this format is relied on, no kopf module is imported
for it). The peering objects
are the ClusterKopfPeering of the peering name for a cluster-wide operator, and the
KopfPeering of that name in every watched namespace for a namespaced one.

Algorithm (:func:`is_active`, pure; kopf's rule in ``process_peering_event``, restated for a
reader that knows its own priority but not kopf's identity):

1. drop the dead peers: ``lastseen + lifetime <= now``;
2. the operator is active when no live peer has a higher priority and exactly one live peer
   has its own priority (itself). Two or more with its priority is a tie, on which kopf
   pauses every tied peer; none means kopf has not registered it yet (or the peering object
   is missing), and kopf runs nothing before then either.

With several peering objects (namespaced), the operator is active only when it is active in
all of them: kopf pauses the whole operator on a conflict in any one.

:class:`ActivityGate` caches the answer and re-reads the peering objects only when asked after
``check_s`` seconds, in a worker thread (the client is synchronous). The periodic scheduler
asks only while it has resources, so the cost is at most ``60 / check_s`` GET requests per
minute per peering object (12 at the default 5 s), none on a standalone operator (no gate).
After kopf pauses this replica, its periodic jobs may still start for up to ``check_s``
seconds; after kopf resumes it, they start within ``check_s`` seconds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prefixserving.controller.kube import KINDS, Kube
from prefixserving.controller.settings import Settings

logger = logging.getLogger(__name__)

CLUSTER_PEERING = KINDS[("kopf.dev/v1", "ClusterKopfPeering")]
NAMESPACED_PEERING = KINDS[("kopf.dev/v1", "KopfPeering")]


@dataclass(frozen=True)
class Peer:
    """One keep-alive entry of a peering object's status."""

    priority: int
    deadline: datetime.datetime

    @classmethod
    def from_status(cls, entry: Mapping[str, Any]) -> Peer:
        """Parse ``{priority, lifetime, lastseen}``, with kopf's defaults (0, 60 s, now)."""
        lastseen = entry.get("lastseen")
        seen = (
            datetime.datetime.fromisoformat(lastseen)
            if lastseen
            else datetime.datetime.now(datetime.UTC)
        )
        lifetime = datetime.timedelta(seconds=int(entry.get("lifetime", 60)))
        return cls(priority=int(entry.get("priority", 0)), deadline=seen + lifetime)


def is_active(status: Mapping[str, Any] | None, priority: int, now: datetime.datetime) -> bool:
    """Whether the peer with ``priority`` is kopf's active one in a peering object's ``status``
    (None: the object does not exist). Cost: O(peers)."""
    live = [p for p in map(Peer.from_status, (status or {}).values()) if p.deadline > now]
    same = sum(1 for p in live if p.priority == priority)
    return same == 1 and not any(p.priority > priority for p in live)


def peering_statuses(kube: Kube, settings: Settings) -> list[Mapping[str, Any] | None]:
    """The ``status`` of each peering object this operator registers in (None when one is
    missing). One GET per object."""
    if settings.all_namespaces:
        objects = [kube.get(CLUSTER_PEERING, None, settings.peering)]
    else:
        objects = [kube.get(NAMESPACED_PEERING, ns, settings.peering) for ns in settings.namespaces]
    return [None if obj is None else (obj.get("status") or {}) for obj in objects]


class ActivityGate:
    """Cached :func:`is_active` over the peering objects, re-read at most every ``check_s``."""

    def __init__(
        self,
        read: Callable[[], Iterable[Mapping[str, Any] | None]],
        priority: int,
        check_s: float,
        executor: concurrent.futures.Executor,
    ) -> None:
        self.read = read
        self.priority = priority
        self.check_s = check_s
        self.executor = executor
        self._active: bool | None = None  # None: not read yet
        self._checked_at = -math.inf

    @classmethod
    def for_operator(
        cls,
        kube: Kube,
        settings: Settings,
        priority: int,
        executor: concurrent.futures.Executor,
    ) -> ActivityGate | None:
        """The gate of an operator with peering, None for a standalone one (always active)."""
        if not settings.peering:
            return None
        return cls(
            lambda: peering_statuses(kube, settings), priority, settings.peering_check_s, executor
        )

    async def active(self) -> bool:
        """The cached answer, re-read first when it is ``check_s`` old. A failed read keeps
        the operator paused until the next read succeeds (two writers are worse than a late
        status)."""
        loop = asyncio.get_running_loop()
        if self._active is not None and loop.time() - self._checked_at < self.check_s:
            return self._active
        self._checked_at = loop.time()
        try:
            statuses = await loop.run_in_executor(self.executor, lambda: list(self.read()))
        except Exception:
            logger.exception("could not read the peering object; periodic jobs paused")
            active = False
        else:
            now = datetime.datetime.now(datetime.UTC)
            active = all(is_active(status, self.priority, now) for status in statuses)
        if active != self._active:  # the first answer, and every change, is logged
            logger.info(
                "periodic jobs %s: this operator (peering priority %d) is %s",
                "resumed" if active else "paused",
                self.priority,
                "the active peer" if active else "not the active peer",
            )
        self._active = active
        return active
