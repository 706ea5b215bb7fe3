"""The PEEK waiting queue: index, lanes, holding and guard behind vLLM's request-queue interface.

The engine scans its waiting queue with ``bool`` / ``peek`` / ``pop`` and puts requests back with
``prepend``. :class:`PeekQueue` answers those calls in PEEK order:

1. **Joining** (``add``): the request's cached prefix is probed once (its *frontier*); it enters
   the queue index (:mod:`.index`: the uncached blocks waiting requests need, with counts) and the
   lanes (:mod:`.lanes`) with its uncached prompt tokens (its cost); the lanes take its
   cache-lane key (:meth:`PeekQueue._cache_key`) only while they reorder.
2. **Each step** (``begin_step``, before the engine allocates anything): pops of the previous step
   that the engine really allocated become pioneers (:mod:`.holding`); pioneers that finished
   their prefill or made no progress retire and hand back their siblings; the guard
   (:mod:`.guard`) protects the cached blocks the lanes' plan will read and reports pressure,
   which, while some waiting request can reuse blocks (``QueueIndex.has_reuse``), lets the
   lanes leave arrival order for ``PRESSURE_MEMORY_STEPS`` steps; with
   ``reorder_on_backlog`` a **backlog** does the same: a request that is not held waited
   through the whole previous step (more requests wait, held ones aside, than joined since
   it began: a count, O(1)); the running requests' block reserve is recorded.
3. **Presenting** (``bool`` / ``peek``): the lanes pick; the pick's frontier is re-checked (two
   probes: its last cached block is still cached, its first uncached block still is not; if not,
   it is re-indexed and re-priced and the lanes pick again); a sibling of a running pioneer is
   held (a resumed request never is); a request whose new blocks would eat into the blocks
   the running requests still need is not presented, which ends the step's admissions
   (**decode headroom**: admitted now, it would only make the engine preempt a running request
   soon; never applied while nothing runs).
4. **Admitting** (``pop``): the request leaves the index and the lanes, its uncached tokens
   advance the lanes' work clock and its place joins the overtake count (settled at the next
   ``begin_step``, when the engine can no longer put it back). At the next call the queue
   checks that the engine allocated it (vLLM also pops requests it skips: grammar still
   compiling, LoRA slots full, KV transfer pending); only then does it become a pioneer, and the
   waiting requests of its cluster (those whose first uncached block was its first uncached
   block) are re-priced at once, so the cache lane serves them while their prefix is cached.

``prepend`` of a request popped in the same step (the engine skipped it) undoes its admission
and puts it back at the place it had. A request preempted later (any other ``prepend``) joins
the resume lane and is presented first, as vLLM resumes it: it has usually streamed tokens,
and its stream stalls until it runs again. (Under vLLM's ``priority`` policy it rejoins as a
waiting request at its priority and arrival time instead, where vLLM's priority queue keeps
it.) A resumed request is never held, and decode headroom applies to it as to any request
(resumed into a full cache, it would only be preempted again). Rejoining as a new arrival
instead gave a lower TTFT, but a TPOT p99 of 2.6-8x FCFS's (medians per replay file over the
rows that preempt; resuming first: 1.0-1.35x; docs/peek.md). With ``lanes`` off the queue is
vLLM's own order, every put-back request resuming first, with no probing, guard, headroom or
re-pricing; holding follows ``max_sibling_wait_ms`` alone. Engine specifics come through
:class:`EngineView`; this module imports no engine.

**Cost per operation**: add / prepend O(blocks + log n), with O(log cached blocks) probes (the
cached prefix is found by galloping: ``_probe_frontier``); a presentation O(log n + cost buckets)
amortized plus two probes; pop O(blocks + log n) plus the re-pricing of its cluster (each
waiting request is re-priced once per run of its blocks that becomes cached; the engine's prefix
cache is asked about each block at most once per presentation, however many siblings walk it);
``begin_step`` O(pioneers + plan x cached blocks + guard window), O(pioneers) while no waiting
request has a cached block and the lanes keep arrival order (the plan is then empty). ``len``
counts held siblings too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from prefixserving.peek.guard import Guard, GuardReport
from prefixserving.peek.holding import Holding
from prefixserving.peek.index import QueueIndex
from prefixserving.peek.lanes import Entry, Lanes, Pick, Stamps
from prefixserving.peek.settings import PeekSettings

R = TypeVar("R")
H = TypeVar("H", bound=Hashable)

# Requests of the lanes' plan whose cached blocks the guard protects each step.
PLAN_REQUESTS = 32
# Steps the lanes keep reordering after the guard last reported pressure (or the last backlog,
# with reorder_on_backlog): the free queue refills and drains from step to step, so pressure
# seen now is pressure a few steps on.
PRESSURE_MEMORY_STEPS = 16


Probe = Callable[[H], bool]


def _memoized(is_cached: Probe[H]) -> Probe[H]:
    """``is_cached`` answering each block hash from the engine once. Valid only while the
    engine allocates nothing (one presentation, or ``begin_step``'s confirmations)."""
    memo: dict[H, bool] = {}

    def probe(block_hash: H) -> bool:
        hit = memo.get(block_hash)
        if hit is None:
            hit = memo[block_hash] = is_cached(block_hash)
        return hit

    return probe


class EngineView(Protocol[R, H]):
    """What the queue needs to know about the engine's requests and prefix cache."""

    block_size: int

    def request_id(self, request: R) -> str: ...

    def block_hashes(self, request: R) -> Sequence[H]:
        """Chained hashes of the request's full blocks (adapter and salt included)."""
        ...

    def num_tokens(self, request: R) -> int: ...

    def priority_key(self, request: R) -> tuple[int, tuple[Any, ...]] | None:
        """(priority value, order within it) under a priority policy; None under FCFS."""
        ...

    def is_cached(self, block_hash: H) -> bool: ...

    def allocated(self, request: R) -> bool:
        """True once the engine allocated the request (it runs)."""
        ...

    def computed_tokens(self, request: R) -> int: ...

    def prefill_done(self, request: R) -> bool:
        """True once an admitted request registered all its full prompt blocks, or left."""
        ...

    def free_blocks(self) -> int:
        """Blocks the engine can still allocate (free or evictable)."""
        ...


@dataclass(slots=True)
class QueueStats:
    """Counters for metrics: admitted requests and uncached prompt tokens per lane, siblings
    held, steps the guard reported pressure, steps whose admissions stopped for headroom."""

    admitted: dict[str, int]
    admitted_tokens: dict[str, int]
    holds: int = 0
    pressure_steps: int = 0
    headroom_stops: int = 0


@dataclass(slots=True)
class _Admission(Generic[R, H]):
    """A pop waiting for the engine's allocation: what it needs to become a pioneer."""

    request: R
    hashes: tuple[H, ...]
    frontier: int


class PeekQueue(Generic[R, H]):
    """Waiting queue in PEEK order over an :class:`EngineView`; see the module docstring."""

    def __init__(
        self,
        view: EngineView[R, H],
        settings: PeekSettings | None = None,
        guard: Guard[Any, H] | None = None,
    ) -> None:
        self.view = view
        self.settings = settings or PeekSettings()
        self.guard = guard if self.settings.lanes else None
        self.index: QueueIndex[H] = QueueIndex()
        self.holding: Holding[H] = Holding(self.settings.max_sibling_wait_ms / 1000.0)
        self.lanes: Lanes[R] = Lanes(
            cache_lane=self.settings.lanes,
            max_overtakes=self.settings.max_overtakes,
            max_response_ratio=self.settings.max_response_ratio,
            cache_share=self.settings.cache_share,
            cache_key=self._cache_key,
            fcfs_bound=self.settings.fcfs_bound,
        )
        self.stats = QueueStats(
            admitted={p.value: 0 for p in Pick}, admitted_tokens={p.value: 0 for p in Pick}
        )
        self.last_guard_report = GuardReport(0, 0, 0, free_short=False)
        self._seq = itertools.count()
        self._unconfirmed: list[_Admission[R, H]] = []
        # Requests popped this step: their lanes entries and picks (charge to refund, place to
        # restore).
        self._popped_this_step: dict[str, tuple[Entry[R], Pick]] = {}
        self._pioneer_requests: dict[str, R] = {}
        self._candidate: tuple[Entry[R], Pick] | None = None
        self._holds_fresh = False
        self._now_s = 0.0
        self._reserve_blocks: int | None = None
        self._steps_since_pressure = PRESSURE_MEMORY_STEPS + 1
        # Requests that joined (new or preempted) since the last begin_step: the backlog test.
        self._joined_since_step = 0
        self.lanes.reorder = False

    # -- per step -------------------------------------------------------------------------------
    def begin_step(
        self,
        now_s: float,
        window_blocks: int | None = None,
        reserve_blocks: int | None = None,
        pin: bool = True,
    ) -> None:
        """Call once per scheduler step before the engine allocates (module docstring).
        ``window_blocks``: the engine's estimate of the blocks the step allocates (the guard's
        scan window); ``reserve_blocks``: blocks the running requests still need (None when
        nothing runs, so admission is left to the engine, which can always drain its queue; or
        when the engine admits nothing this step, so nothing is checked against it); ``pin``:
        whether the guard may take hard pins this step (False after a step that preempted or
        scheduled nothing while requests waited: :mod:`prefixserving.peek.guard`, step 3)."""
        self._now_s = now_s
        backlog = len(self.lanes) - self.num_held > self._joined_since_step
        self._joined_since_step = 0
        self._confirm_admissions(_memoized(self.view.is_cached))
        self._popped_this_step.clear()
        self.lanes.settle()
        self._candidate = None
        self._holds_fresh = False
        self._reserve_blocks = reserve_blocks
        for pid, request in list(self._pioneer_requests.items()):
            if self.view.prefill_done(request):
                released = self.holding.retire_pioneer(pid, now_s)
            else:
                released = self.holding.progress(pid, self.view.computed_tokens(request), now_s)
            if not self.holding.is_pioneer(pid):
                del self._pioneer_requests[pid]
            self._unpark(released)
        if self.guard is None:
            return
        self.guard.release_all()
        plan_rank, plan_blocks = self._plan()
        self.last_guard_report = self.guard.step(plan_rank, window_blocks, plan_blocks, pin)
        # Pressure (or a backlog) on a queue where no request can reuse anything (no cached
        # prefix, no shared next block) is no reason to leave arrival order: reordering would
        # save no prefill.
        pressure = self.last_guard_report.pressure
        if (pressure or (backlog and self.settings.reorder_on_backlog)) and self.index.has_reuse:
            self.stats.pressure_steps += int(pressure)
            self._steps_since_pressure = 0
        else:
            self._steps_since_pressure += 1
        self.lanes.reorder = self._steps_since_pressure <= PRESSURE_MEMORY_STEPS

    def release_pins(self) -> int:
        """Release every hard pin (preemption, cache reset, shutdown)."""
        return 0 if self.guard is None else self.guard.release_all()

    def shutdown(self) -> None:
        """Release pins and held siblings; the queue keeps its requests."""
        self.release_pins()
        for rid in self.holding.clear():
            self.lanes.unpark(rid)
        self._pioneer_requests.clear()
        self._unconfirmed.clear()
        self._candidate = None

    # -- request-queue interface ----------------------------------------------------------------
    def add_request(self, request: R) -> None:
        """Queue a new request. O(blocks + log n)."""
        self._insert(request)

    def prepend_request(self, request: R) -> None:
        """Put a request back: a pop of this step at its place, a preempted request into the
        resume lane (module docstring). O(blocks + log n)."""
        rid = self.view.request_id(request)
        popped = self._popped_this_step.pop(rid, None)
        if popped is not None:
            self.lanes.refund(*popped)
            self._unconfirmed = [a for a in self._unconfirmed if a.request is not request]
        if self._pioneer_requests.pop(rid, None) is not None:
            self._unpark(self.holding.retire_pioneer(rid, self._now_s))
        if popped is None or not self.settings.lanes:
            self._insert(request, resume=True)
        else:
            self._insert(request, resume=popped[0].resume, stamps=popped[0].stamps)

    def prepend_requests(self, requests: Iterable[R]) -> None:
        """Prepend each in turn, so the last one ends up first (vLLM's documented order)."""
        for request in requests:
            self.prepend_request(request)

    def peek_request(self) -> R:
        """The request the scheduler should try next; IndexError when none can be presented."""
        current = self._current()
        if current is None:
            raise IndexError("peek from an empty queue")
        return current[0].request

    def pop_request(self) -> R:
        """Admit the presented request; IndexError when none can be presented."""
        current = self._current()
        if current is None:
            raise IndexError("pop from an empty queue")
        entry, pick = current
        rid = entry.rid
        self._unconfirmed.append(
            _Admission(entry.request, self.index.path(rid), self.index.frontier(rid))
        )
        self._drop(rid)
        self.lanes.charge(entry, pick)
        self._popped_this_step[rid] = entry, pick
        self.stats.admitted[pick.value] += 1
        self.stats.admitted_tokens[pick.value] += entry.cost_tokens
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
        """All waiting requests, held siblings included, in vLLM's own order. O(n log n)."""
        return (entry.request for entry in self.lanes)

    def __getitem__(self, position: int) -> R:
        """The request at ``position`` of :meth:`__iter__`'s order (vLLM's FCFS queue is a deque,
        which its own code and tests index). O(n log n)."""
        return list(self)[position]

    # -- observability --------------------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return self.holding.num_held

    @property
    def num_pinned(self) -> int:
        return 0 if self.guard is None else self.guard.num_pinned

    @property
    def uncached_waiting_tokens(self) -> int:
        """Prompt tokens (full blocks) the waiting requests still need computed, each shared
        block once, less the blocks running pioneers are computing for them. O(owned)."""
        owned = sum(1 for h in self.holding.owned_hashes() if self.index.count(h))
        return (self.index.num_nodes - owned) * self.view.block_size

    # -- internals ------------------------------------------------------------------------------
    def _insert(self, request: R, *, resume: bool = False, stamps: Stamps | None = None) -> None:
        rid = self.view.request_id(request)
        hashes = tuple(self.view.block_hashes(request))
        frontier = (
            self._probe_frontier(hashes, self.view.is_cached) if self.guard is not None else 0
        )
        self.index.insert(rid, hashes, frontier)
        key = self.view.priority_key(request)
        klass, order = key if key is not None else (0, (next(self._seq),))
        if stamps is None:
            self._joined_since_step += 1
        self.lanes.add(
            rid,
            request,
            klass=klass,
            order=order,
            cost_tokens=self._cost(request, frontier),
            resume=resume and key is None,
            stamps=stamps,
        )
        self._candidate = None

    def _drop(self, rid: str) -> None:
        self.lanes.remove(rid)
        self.index.remove(rid)
        self.holding.forget(rid)
        self._candidate = None

    def _cost(self, request: R, frontier: int) -> int:
        """Uncached prompt tokens of a request whose first ``frontier`` blocks are cached."""
        return max(1, self.view.num_tokens(request) - frontier * self.view.block_size)

    def _cache_key(self, entry: Entry[R]) -> tuple[int, int]:
        """Cache-lane key of an indexed request (the lanes take it only while they reorder):
        least uncached work first, then the most waiting tokens its admission unlocks (its
        cluster's shared uncached tokens times the siblings that need them), then arrival.
        O(cluster depth)."""
        rid = entry.rid
        path, frontier = self.index.path(rid), self.index.frontier(rid)
        siblings = self.index.count(path[frontier]) - 1 if frontier < len(path) else 0
        if not siblings:
            return entry.cost_tokens, 0
        unlocked = self.index.shared_blocks(rid) * self.view.block_size * siblings
        return entry.cost_tokens, -unlocked

    @staticmethod
    def _probe_frontier(hashes: Sequence[H], is_cached: Probe[H], start: int = 0) -> int:
        """The first uncached block at or after ``start``, by galloping then bisecting: probes
        ``start``, ``start + 1``, ``start + 3``, ... until a miss, then halves the gap between the
        last hit and the miss. O(log k) probes for k newly cached blocks (a walk takes k + 1).

        Exact when a path's cached blocks are a prefix of it, which is what vLLM's cache keeps:
        a request frees its blocks tail first, so the LRU end evicts a chain from its end, and
        the guard moves a request's blocks to the MRU end in that same order. With a hole in
        the middle (an evicted block whose successor is still cached), the answer may lie beyond
        the hole: PEEK then prices the request as cheaper than it is, while the engine's own
        block-by-block lookup still computes the hole when it admits it."""
        end = len(hashes)
        if start >= end or not is_cached(hashes[start]):
            return start
        hit, step = start, 1  # hashes[hit] is cached
        while True:
            probe = hit + step
            if probe >= end:
                miss = end
                break
            if not is_cached(hashes[probe]):
                miss = probe
                break
            hit, step = probe, 2 * step
        while miss - hit > 1:  # hashes[hit] cached, hashes[miss] not (or the end)
            middle = (hit + miss) // 2
            if is_cached(hashes[middle]):
                hit = middle
            else:
                miss = middle
        return miss

    def _refresh_frontier(self, rid: str, is_cached: Probe[H]) -> bool:
        """Re-check ``rid``'s cached prefix (two probes when nothing changed); re-index and
        re-price it when it moved. Returns whether it moved."""
        hashes = self.index.path(rid)
        old = self.index.frontier(rid)
        if old and not is_cached(hashes[old - 1]):
            new = self._probe_frontier(hashes, is_cached)  # evicted: walk again from block 0
        else:
            new = self._probe_frontier(hashes, is_cached, old)
        if new == old:
            return False
        self.index.move_frontier(rid, new)
        entry = self.lanes.get(rid)
        if entry is not None:
            self.lanes.reprice(rid, self._cost(entry.request, new))
        return True

    def _confirm_admissions(self, is_cached: Probe[H]) -> None:
        """Pops the engine allocated become pioneers and re-price their clusters."""
        admissions, self._unconfirmed = self._unconfirmed, []
        for admission in admissions:
            request, hashes, frontier = admission.request, admission.hashes, admission.frontier
            if not self.view.allocated(request) or frontier >= len(hashes):
                continue
            rid = self.view.request_id(request)
            if self.holding.max_sibling_wait_s > 0:
                self.holding.add_pioneer(rid, hashes[frontier:], self.view.computed_tokens(request))
                self._pioneer_requests[rid] = request
            if self.guard is not None:
                for member in list(self.index.at(hashes[frontier])):
                    self._refresh_frontier(member, is_cached)

    def _unpark(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self.lanes.unpark(rid)
            self._candidate = None

    def _current(self) -> tuple[Entry[R], Pick] | None:
        if self._candidate is not None:
            return self._candidate
        # Nothing allocates while a presentation is chosen, so one probe per block is enough:
        # a cluster's members walk the same blocks.
        is_cached = _memoized(self.view.is_cached)
        self._confirm_admissions(is_cached)
        if not self._holds_fresh:
            self._holds_fresh = True
            self._unpark(self.holding.release_ready(self._now_s, is_cached))
        while True:
            picked = self.lanes.next_pick()
            if picked is None:
                return None
            entry, pick = picked
            rid = entry.rid
            if self.guard is not None and self._refresh_frontier(rid, is_cached):
                continue
            if pick is not Pick.RESUME:
                info = self.holding.decide(
                    rid, self.index.path(rid), self.index.frontier(rid), self._now_s
                )
                if info is not None:
                    self.holding.hold(rid, info)
                    self.lanes.park(rid)
                    self.stats.holds += 1
                    continue
            if self.guard is not None and not self._fits(entry):
                self.stats.headroom_stops += 1
                return None
            self._candidate = picked
            return picked

    def _fits(self, entry: Entry[R]) -> bool:
        """Decode headroom: the request's new blocks, plus one for its first output block,
        leave the blocks the running requests still need. Always true without a reserve
        (nothing runs, or the engine admits nothing this step)."""
        if self._reserve_blocks is None:
            return True
        new_blocks = -(-entry.cost_tokens // self.view.block_size) + 1
        return self.view.free_blocks() - new_blocks >= self._reserve_blocks

    def _plan(self) -> tuple[dict[H, int], Callable[[int], Sequence[H]]]:
        """The guard's plan: cached block hash -> rank of the best request of the lanes' plan
        that reads it, and a function from a rank to the request's cached blocks (root first;
        sliced when the guard asks).

        Hashes are chained, so a ranked hash means its whole prefix is ranked by the same or a
        better request: each request's walk back from its last cached block stops at the first
        ranked one. O(plan + distinct cached blocks of the plan); O(1) when no waiting request
        has a cached block and the lanes keep arrival order (while they reorder, the plan also
        builds their cost lanes, which must happen now: cache keys describe the queue when
        taken)."""
        rank: dict[H, int] = {}
        planned: list[tuple[Sequence[H], int]] = []  # by rank: path, cached blocks
        if self.index.has_cached_prefix or self.lanes.reorder:
            for position, entry in enumerate(self.lanes.plan(PLAN_REQUESTS)):
                path, frontier = self.index.path(entry.rid), self.index.frontier(entry.rid)
                planned.append((path, frontier))
                for depth in range(frontier - 1, -1, -1):
                    block_hash = path[depth]
                    if block_hash in rank:
                        break
                    rank[block_hash] = position

        def cached_blocks(position: int) -> Sequence[H]:
            path, frontier = planned[position]
            return path[:frontier]

        return rank, cached_blocks
