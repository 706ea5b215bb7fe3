"""The PEEK waiting queue: index, holding, lanes and guard behind a request-queue interface.

The engine's scheduler scans its waiting queue with ``bool`` / ``peek`` / ``pop`` and puts
requests back with ``prepend``. :class:`PeekQueue` answers those calls in PEEK order:

1. ``begin_step(now)`` (once per scheduler step, before the engine allocates anything) runs
   the eviction guard over the free queue, switches the lanes from FCFS to hot-lane stride
   while it reports cache pressure (and for ``PRESSURE_MEMORY_STEPS`` steps after), and
   retires pioneers whose prefill is done.
   Holds are refreshed lazily at the step's first ``bool``/``peek``, that is after the running
   requests' allocations of the step, so a sibling is released in the very step its pioneer's
   last shared block is registered.
2. The next request comes from the lanes (FCFS; under pressure hot lanes by stride within the
   overtake budget).
   Its dual walk (cached blocks now) goes to the holding rules; a sibling of a running pioneer
   is parked and the next request is tried. ``bool`` is True iff a request can be presented.
3. ``pop`` admits the presented request: it leaves the index (the guard releases pins of blocks
   nobody waits for any more), becomes a pioneer for its uncached blocks, and its uncached
   prompt tokens are charged to its lane's stride pass.

``prepend`` puts a request at the front (vLLM: preempted requests, requests skipped in a step);
a request popped and prepended in the same step is treated as never admitted.

Engine specifics come through :class:`EngineView`; this module imports no engine.
**Cost per operation**: add/remove O(blocks + log n); each pick O(blocks + hot lanes x blocks)
amortised; ``begin_step`` O(guard window + pioneers). ``len`` counts held siblings too.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prefixserving.peek.guard import Guard, GuardReport
from prefixserving.peek.holding import Holding
from prefixserving.peek.index import DualWalk, QueueIndex
from prefixserving.peek.lanes import SOLO_LANE, Entry, Lanes, Pick, cluster_lane
from prefixserving.peek.settings import PeekSettings

R = TypeVar("R")
H = TypeVar("H", bound=Hashable)

# Steps the lanes keep reordering after the guard last reported pressure: the free queue
# refills and drains from step to step, so pressure seen now is pressure a few steps on.
PRESSURE_MEMORY_STEPS = 16


class EngineView(Protocol[R, H]):
    """What the queue needs to know about the engine's requests and prefix cache."""

    block_size: int

    def request_id(self, request: R) -> str: ...

    def block_hashes(self, request: R) -> Sequence[H]:
        """Chained hashes of the request's full prompt blocks (adapter and salt included)."""
        ...

    def num_tokens(self, request: R) -> int: ...

    def is_cached(self, block_hash: H) -> bool: ...

    def prefill_done(self, request: R) -> bool:
        """True once an admitted request registered all its full prompt blocks, or left."""
        ...


@dataclass(slots=True)
class QueueStats:
    """Counters for metrics: admitted requests and prefill tokens per pick (FCFS spine or
    hot-lane stride) and lane kind, siblings held, guard pressure steps."""

    admitted: dict[str, int]
    admitted_tokens: dict[str, int]
    lane_tokens: dict[str, int]
    holds: int = 0
    pressure_steps: int = 0


@dataclass(slots=True)
class _Candidate(Generic[R]):
    entry: Entry[R]
    pick: Pick
    walk: DualWalk


class PeekQueue(Generic[R, H]):
    """Waiting queue in PEEK order over an :class:`EngineView`; see the module docstring."""

    def __init__(
        self,
        view: EngineView[R, H],
        settings: PeekSettings | None = None,
        guard: Guard[object, H] | None = None,
    ) -> None:
        self.view = view
        self.settings = settings or PeekSettings()
        self.guard = guard
        self.index: QueueIndex[H] = QueueIndex()
        self.holding: Holding[H] = Holding(self.settings.max_sibling_wait_ms / 1000.0)
        self.lanes: Lanes[R] = Lanes(max_overtakes=self.settings.max_overtakes)
        self.stats = QueueStats(
            admitted={p.value: 0 for p in Pick},
            admitted_tokens={p.value: 0 for p in Pick},
            lane_tokens={"solo": 0, "cluster": 0},
        )
        self._hashes: dict[str, tuple[H, ...]] = {}
        self._solo_by_root: dict[H, str] = {}
        self._pioneer_requests: dict[str, R] = {}
        self._popped_this_step: set[str] = set()
        self._candidate: _Candidate[R] | None = None
        self._holds_fresh = False
        self._hot_memo: dict[str, bool] = {}
        self._now_s = 0.0
        self._steps_since_pressure = PRESSURE_MEMORY_STEPS + 1
        self.last_guard_report = GuardReport(0, 0, 0, free_short=False)

    # -- per step -------------------------------------------------------------------------------
    def begin_step(self, now_s: float, window_blocks: int | None = None) -> None:
        """Call once per scheduler step before the engine allocates; ``window_blocks`` is the
        engine's estimate of the blocks the step allocates (the guard's scan window).
        O(window + pioneers)."""
        self._now_s = now_s
        self._hot_memo.clear()
        self._popped_this_step.clear()
        self._candidate = None
        self._holds_fresh = False
        for pid, request in list(self._pioneer_requests.items()):
            if self.view.prefill_done(request):
                self._retire(pid)
        if self.guard is not None:
            self.last_guard_report = self.guard.step(self.index.count, window_blocks)
        if self.last_guard_report.pressure:
            self.stats.pressure_steps += 1
            self._steps_since_pressure = 0
        else:
            self._steps_since_pressure += 1
        self.lanes.pressure = (
            self.settings.lanes and self._steps_since_pressure <= PRESSURE_MEMORY_STEPS
        )

    def release_pins(self) -> int:
        """Release every hard pin (preemption pressure, cache reset, shutdown)."""
        return 0 if self.guard is None else self.guard.release_all()

    def shutdown(self) -> None:
        """Release pins and held siblings; the queue keeps its requests in FCFS order."""
        self.release_pins()
        for rid in self.holding.clear():
            self.lanes.unpark(rid)
        self._pioneer_requests.clear()
        self._candidate = None

    # -- request-queue interface ----------------------------------------------------------------
    def add_request(self, request: R) -> None:
        """Queue a new request at the back of its lane. O(blocks + log n)."""
        self._insert(request, front=False)

    def prepend_request(self, request: R) -> None:
        """Put a request at the front (preempted, or skipped this step). O(blocks + log n)."""
        rid = self.view.request_id(request)
        if rid in self._popped_this_step:
            self._popped_this_step.discard(rid)
        self._retire(rid)
        self._insert(request, front=True)

    def prepend_requests(self, requests: Iterable[R]) -> None:
        """Prepend each in turn, so the last one ends up first (vLLM's documented order)."""
        for request in requests:
            self.prepend_request(request)

    def peek_request(self) -> R:
        """The request the scheduler should try next; IndexError when none can be presented."""
        candidate = self._current()
        if candidate is None:
            raise IndexError("peek from an empty queue")
        return candidate.entry.request

    def pop_request(self) -> R:
        """Admit the presented request; IndexError when none can be presented."""
        candidate = self._current()
        if candidate is None:
            raise IndexError("pop from an empty queue")
        entry, walk = candidate.entry, candidate.walk
        hashes = self._hashes[entry.rid]
        self._drop(entry.rid)
        if walk.cached_blocks < len(hashes):
            self.holding.add_pioneer(entry.rid, hashes[walk.cached_blocks :])
            self._pioneer_requests[entry.rid] = entry.request
        cost = self._cost_tokens(entry.request, walk)
        self.lanes.charge(candidate.pick, entry.lane, cost)
        self.stats.admitted[candidate.pick.value] += 1
        self.stats.admitted_tokens[candidate.pick.value] += cost
        self.stats.lane_tokens["solo" if entry.lane == SOLO_LANE else "cluster"] += cost
        self._popped_this_step.add(entry.rid)
        # The admitted request's prefix is now cached: the rest of its cluster is hot.
        self.lanes.mark_hot(entry.lane)
        return entry.request

    def remove_request(self, request: R) -> None:
        """Remove one queued request; ValueError if it is not queued (like the FCFS deque)."""
        rid = self.view.request_id(request)
        if rid not in self.lanes:
            raise ValueError(f"request {rid} is not in the waiting queue")
        self._drop(rid)

    def remove_requests(self, requests: Iterable[R]) -> None:
        """Remove the queued ones among ``requests``; others are ignored. O(k x blocks)."""
        for request in requests:
            rid = self.view.request_id(request)
            if rid in self.lanes:
                self._drop(rid)

    def __bool__(self) -> bool:
        """True iff a request can be presented now (held siblings are parked, not presented)."""
        return self._current() is not None

    def __len__(self) -> int:
        """Every waiting request, held siblings included."""
        return len(self.lanes)

    def __iter__(self) -> Iterator[R]:
        """All waiting requests, held siblings included, in arrival order. O(n log n)."""
        return (entry.request for entry in self.lanes)

    # -- observability --------------------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return self.holding.num_held

    @property
    def num_pinned(self) -> int:
        return 0 if self.guard is None else self.guard.num_pinned

    # -- internals ------------------------------------------------------------------------------
    def _insert(self, request: R, *, front: bool) -> None:
        rid = self.view.request_id(request)
        hashes = tuple(self.view.block_hashes(request))
        self._hashes[rid] = hashes
        self.index.insert(rid, hashes)
        entry = self.lanes.add(rid, request, self._lane_for(rid, hashes), front=front)
        if self.guard is not None and hashes:
            self.guard.protect_path(hashes)
        if entry.lane != SOLO_LANE and self._is_hot(entry):
            self.lanes.mark_hot(entry.lane)
        self._candidate = None

    def _lane_for(self, rid: str, hashes: tuple[H, ...]) -> tuple[str, Hashable]:
        if not hashes:
            return SOLO_LANE
        root = hashes[0]
        if self.index.count(root) >= 2:
            lane = cluster_lane(root)
            other = self._solo_by_root.pop(root, None)
            if other is not None:
                self.lanes.move(other, lane)
            return lane
        if self.view.is_cached(root):
            return cluster_lane(root)
        self._solo_by_root[root] = rid
        return SOLO_LANE

    def _drop(self, rid: str) -> None:
        self.lanes.remove(rid)
        hashes = self._hashes.pop(rid)
        if hashes and self._solo_by_root.get(hashes[0]) == rid:
            del self._solo_by_root[hashes[0]]
        unneeded = self.index.remove(rid)
        if self.guard is not None and unneeded:
            self.guard.on_unneeded(unneeded)
        self.holding.forget(rid)
        self._candidate = None

    def _retire(self, pid: str) -> None:
        if self._pioneer_requests.pop(pid, None) is None:
            return
        for rid in self.holding.retire_pioneer(pid, self._now_s):
            self.lanes.unpark(rid)
        self._candidate = None

    def _refresh_holds(self) -> None:
        if self._holds_fresh:
            return
        self._holds_fresh = True
        for rid in self.holding.release_ready(self._now_s, self.view.is_cached):
            self.lanes.unpark(rid)

    def _current(self) -> _Candidate[R] | None:
        if self._candidate is not None:
            return self._candidate
        self._refresh_holds()
        while True:
            picked = self.lanes.next_pick(self._is_hot)
            if picked is None:
                return None
            entry, pick = picked
            hashes = self._hashes[entry.rid]
            walk = self.index.dual_walk(hashes, self.view.is_cached)
            decision = self.holding.decide(entry.rid, hashes, walk.cached_blocks, self._now_s)
            if decision is None:
                self._candidate = _Candidate(entry, pick, walk)
                return self._candidate
            self.holding.hold(entry.rid, decision[0], decision[1], self._now_s)
            self.lanes.park(entry.rid)
            self.stats.holds += 1

    def _is_hot(self, entry: Entry[R]) -> bool:
        """Half the prompt cached; memoised per step (the cache only grows within a step,
        except for evictions the guard keeps away from needed blocks)."""
        hot = self._hot_memo.get(entry.rid)
        if hot is None:
            hot = self._hot_memo[entry.rid] = self._cached_half(entry)
        return hot

    def _cached_half(self, entry: Entry[R]) -> bool:
        """Walk the leading blocks only until the hot threshold is reached."""
        tokens = self.view.num_tokens(entry.request)
        if tokens <= 0:
            return False
        needed_blocks = self.settings.hot_min_cached_fraction * tokens / self.view.block_size
        is_cached = self.view.is_cached
        cached_blocks = 0
        for block_hash in self._hashes[entry.rid]:
            if cached_blocks >= needed_blocks or not is_cached(block_hash):
                break
            cached_blocks += 1
        return cached_blocks >= needed_blocks

    def _cost_tokens(self, request: R, walk: DualWalk) -> int:
        uncached = self.view.num_tokens(request) - walk.cached_blocks * self.view.block_size
        return max(uncached, self.view.block_size)
