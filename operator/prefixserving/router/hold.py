"""Holding requests while no engine is Ready (scale from zero), shared by the HTTP router and
the endpoint picker.

With ``autoscaling.minReplicas: 0`` an idle model has no engine pod. The first request must
not fail at once: it waits here until the backend pool has a healthy member or ``hold_s``
passes, while :attr:`ReadyHold.held` (exported as ``prefixserving_router_held_requests``)
tells KEDA's activation trigger that someone is waiting, so KEDA scales the Deployment from
0 to 1. A request that waited ``hold_s`` gets the caller's usual 503 with ``Retry-After``.

Algorithm: the pool calls :meth:`ReadyHold.healthy_changed` whenever its healthy set changes
(DNS membership, ejection, recovery); that sets one :class:`asyncio.Event` while the set is
non-empty and replaces it with a fresh, unset one when the set becomes empty. A waiter checks
the pool, then awaits the event with a deadline, so waking every waiter costs one ``set()``
and an idle hold costs nothing. ``hold_s == 0`` turns holding off (the old immediate 503).

Users: ``Router.routed_endpoint`` and ``Router.models`` (``router.app``) call
``await router.hold.backends()`` where they read ``pool.healthy()``; the endpoint picker,
which shares the :class:`~prefixserving.router.app.Router`, calls the same before its
routing decision (``PickStream._eligible``) and answers its immediate 503 when it returns no
backend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Backends = tuple[str, ...]


class ReadyHold:
    """Waits for a healthy backend for at most ``hold_s`` seconds and counts the waiters.

    ``healthy`` returns the pool's healthy backends (``BackendPool.healthy``).
    """

    def __init__(self, healthy: Callable[[], Backends], hold_s: float) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must be >= 0, got {hold_s}")
        self._healthy = healthy
        self.hold_s = hold_s
        self.held = 0
        self._ready = asyncio.Event()

    def healthy_changed(self) -> None:
        """Wake the waiters when a backend became healthy; re-arm when none is."""
        if self._healthy():
            self._ready.set()
        elif self._ready.is_set():
            self._ready = asyncio.Event()

    async def backends(self) -> Backends:
        """The healthy backends now, or as soon as there are some; ``()`` after ``hold_s``."""
        backends = self._healthy()
        if backends or self.hold_s == 0:
            return backends
        self.held += 1
        try:
            async with asyncio.timeout(self.hold_s):
                while not (backends := self._healthy()):
                    await self._ready.wait()
        except TimeoutError:
            return ()
        finally:
            self.held -= 1
        return backends
