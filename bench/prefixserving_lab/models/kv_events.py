"""What a router that follows every engine's KV cache events knows about their caches.

vLLM publishes ``BlockStored`` and ``BlockRemoved`` events per engine (``--kv-events-config``);
a router replica subscribed to all of them keeps, per engine, the set of block hashes it holds,
and every replica receives the same events. :class:`KvEventIndex` is that set per simulated
replica: each replica's :class:`~prefixserving_lab.models.replica.BlockCache` reports every
block that enters or leaves it (:meth:`KvEventIndex.listener`), the event reaches the routers
``lag_s`` later (the subscriber's delay; 0 delivers at once), and :meth:`KvEventIndex.cached`
answers, per backend, how many of a request's leading blocks it holds by the events delivered
so far: the ``RoutingContext.cached`` the router gives its policy. One index serves every
router replica, because they all see the same events.

A replica that leaves is forgotten with its events still in transit (``AllBlocksCleared``).

Cost: O(1) per cache change; :meth:`~KvEventIndex.cached` O(N x leading blocks held) plus
the events delivered since the last call. Memory: the blocks every replica holds, plus the
events in transit (``lag_s`` worth).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence


class KvEventIndex:
    """Per-backend sets of cached blocks, fed by cache events after ``lag_s``."""

    def __init__(self, clock: Callable[[], float], lag_s: float = 0.0) -> None:
        if lag_s < 0:
            raise ValueError("lag_s must be >= 0")
        self._clock = clock
        self.lag_s = lag_s
        self._held: dict[str, set[int]] = {}
        self._in_transit: deque[tuple[float, str, int, bool]] = deque()

    def listener(self, backend: str) -> Callable[[int, bool], None]:
        """The ``on_change`` hook for ``backend``'s cache (which starts empty)."""
        self._held[backend] = set()

        def on_change(block: int, stored: bool) -> None:
            self._in_transit.append((self._clock(), backend, block, stored))

        return on_change

    def forget(self, backend: str) -> None:
        """``backend`` left: drop what it held and its events not yet delivered."""
        self._held.pop(backend, None)
        self._in_transit = deque(e for e in self._in_transit if e[1] != backend)

    def _deliver(self) -> None:
        due = self._clock() - self.lag_s
        transit = self._in_transit
        while transit and transit[0][0] <= due:
            _, backend, block, stored = transit.popleft()
            held = self._held[backend]
            if stored:
                held.add(block)
            else:
                held.discard(block)

    def cached(self, blocks: Sequence[int], backends: Sequence[str]) -> dict[str, int]:
        """Per backend of ``backends``: how many leading ``blocks`` the delivered events say
        it holds (0 for none: every followed backend is listed, as the router does)."""
        self._deliver()
        out: dict[str, int] = {}
        for backend in backends:
            held = self._held.get(backend, ())
            depth = 0
            for block in blocks:
                if block not in held:
                    break
                depth += 1
            out[backend] = depth
        return out
