"""Lanes: the order in which PEEK presents waiting requests to the engine.

Every waiting request sits in the lanes of its **class** (one class per priority value under
vLLM's ``priority`` policy, served strictly in priority order; one class under ``fcfs``):

* the **FCFS lane**: arrival order (under ``priority``: arrival time, then request id, as vLLM);
* the **cache lane**: least uncached prompt work first (a request whose prefix is cached costs only
  its own suffix), ties broken for the request that unlocks the most waiting tokens (a cold
  cluster's pioneer: the blocks it computes times the siblings that then hit them), then
  arrival;
* the **aged lane**: the highest *response ratio* ``(waited work + cost) / cost``, where waited
  work is the uncached prompt tokens admitted since the request joined (the work clock), as
  SGLang's ``hrrn`` ages requests. The lane keeps the requests by cost in buckets a factor of
  sqrt(2) wide, each in arrival order; the best ratio is taken among the buckets' oldest requests,
  so it is exact up to that factor;
  with ``fcfs_bound`` a request is due instead from the later of two work-clock points: its
  response-ratio bound and its **FCFS place** (the uncached work of its class's waiting requests
  when it joined: what FCFS would admit before it). The lane keeps the requests by that due
  point (one heap, earliest first), and the first due one goes. Under a light queue the ratio
  bound is the later one and the order is as without it; under overload the FCFS place is, so
  the cache lane serves cheap requests until some request reaches where FCFS would admit it
  (counted in PEEK's costs when it joined: a bound on the admission order, not on TTFT;
  docs/peek.md);
* the **resume lane**: requests added with ``resume`` (under vLLM's ``fcfs`` policy, the queue's
  preempted requests, and with ``cache_lane`` off every request the engine put back), last
  first, as vLLM's own queue.

**Pick rule** (the best class that has a presentable request):

1. the resume lane's head, always;
2. with ``cache_lane`` off, or while ``reorder`` is False (the queue sets it under cache
   pressure, which the eviction guard reports, and, with its ``reorder_on_backlog``, on a
   backlog), the FCFS lane's head: with rule 1, exactly vLLM's order.
   Without cache pressure reordering buys no hits, and with no prefix reuse FCFS is the order
   that best meets TTFT bounds (Dexter et al., arXiv 2502.04677);
3. the FCFS lane's head if ``max_overtakes`` younger requests have been admitted ahead of it;
4. the aged lane's best request if its response ratio is at least ``max_response_ratio``
   (with ``fcfs_bound``: its first request if the work clock reached its due point),
   unless the cache lane's **share** is due: with ``cache_share`` s > 0 the cache lane's head
   goes instead while the cache lane has taken less than s of the prefill work admitted since
   the aged lane became due (``Pick.SHARE``; see below);
5. otherwise the cache lane's head.

**Share** (rule 4): a deficit counter in uncached prompt tokens. An aged pick credits it with
s x its cost, a share pick debits it (1 - s) x its cost, and the share is due while the
counter is at least 0; the credit is capped at one aged pick's, so a long run of aged picks
(while the cache lane had nothing else to offer) never buys a burst of share picks. Over a
contested stretch the cache lane gets at most s of the work plus one request's cost (a
property test checks it), and about s while it has a request to offer. Without it
(s = 0, the default) a deep queue under pressure has some request over the bound at every
pick, and the cache lane is hardly served: on the full-size replay rows at loads 0.8-1.2, the
aged lane made 71-89% of PEEK's admissions on gsp-q25 and gsp-cold-q25 and 37-50% on
gsp-chunked (where resumed requests made 42-45%), the cache lane under 2% (both cost models;
``bench/results/replay-sweep-full-*.json``).

Measured on the replay suite (docs/peek.md): the cache lane alone has the best TTFT p50 and
starves expensive requests under load; the response-ratio bound keeps TTFT p99 well below
FCFS's on the sharing workloads (against SGLang ``hrrn``'s it wins some rows and loses others:
the results files say which); the overtake budget is the hard backstop.

**Bounds** (property tests check them): with ``cache_lane`` off or ``reorder`` False the order
is vLLM's; with ``max_overtakes`` 0, arrival order within each class; otherwise no request is
overtaken by more than ``max_overtakes`` younger requests of its class while it is presented
(held siblings, ``park``, are never presented and never block others; a request that was
overtaken while held goes first once it is presented again if that made up its budget); with
``fcfs_bound`` and no share, while a presented request is due, the earliest due one goes
before any request that is not due (rules 1 to 3 aside).

**Overtake count**: each class keeps the sorted arrival places of the requests admitted from it
(``bisect``); a request's count is how many of them are younger than it, so it is exact whatever
happened to older requests (held, aborted, put back). (Under vLLM's ``priority`` policy a
preempted request rejoins at its first arrival time, so younger requests admitted before it
rejoined count too: it reaches its budget sooner, never later.) Only the class's oldest
presented request is ever asked.

``settle`` (once per engine step, when no admission can be refunded any more) drops the places
older than every waiting request of the class once the list has grown by the class's size plus
what it kept at the last drop, plus ``COMPACT_SLACK``: so it holds the admissions since the
class's oldest waiting request joined, plus O(n).

**Parameters**: ``cache_lane`` (env ``PREFIXSERVING_LANES``), ``max_overtakes`` (default 128,
env ``PREFIXSERVING_MAX_OVERTAKES``; 0 keeps arrival order), ``max_response_ratio`` (default 8,
env ``PREFIXSERVING_MAX_RESPONSE_RATIO``; 1 is SGLang's ``hrrn`` order under pressure),
``cache_share`` (default 0, env ``PREFIXSERVING_CACHE_SHARE``, below 1), ``fcfs_bound``
(default off, env ``PREFIXSERVING_FCFS_BOUND``; the overtake budget still applies, and in deep
queues it binds first unless ``max_overtakes`` is raised: docs/peek.md). On the
replay suite the bound at 8 instead of 16 cut PEEK's TTFT p99 by up to a third on the
shared-prefix rows (the median row did not move), for hit rates within 0.05
(``bench/results/replay-response-ratio*.md``); at 4 the hit rate and p50 fell on the chunked
and cold-document workloads.

**Heaps**: each lane is a binary heap with lazy deletion (a re-priced, held or admitted request
leaves a stale item behind, skipped when it reaches the top). The cost lanes (cache and aged)
exist only while the lanes reorder: without cache pressure nothing reads them, so adds and
re-pricing only update the entry's cost, and the first pick or plan under pressure builds them from
the class's requests (O(n) plus one ``cache_key`` call each). A request's cache key is taken by
the ``cache_key`` function (default: its cost) when it enters built cost lanes: at that build,
or when it joins or is re-priced while they are built; so it describes the queue at that moment,
and nothing computes keys while nothing reads them. A class's heaps are rebuilt from its live
requests once their stale items outnumber ``COMPACT_FACTOR`` per current item (a request has one
in each lane it is in) + ``COMPACT_SLACK``, so memory stays O(n) even when heads are never
popped (before, every arrival and re-pricing left items in the unread cost lanes of an engine
without pressure, for good).

**Cost**: add / reprice / park / unpark / remove are amortised O(log n); charge and refund
O(log n) plus a list insert or delete (a memmove, near the end: admissions are mostly young);
``settle`` amortised O(1) per admission (a drop scans the class, O(n), after at least n
admissions); a pick is amortised O(log n + cost buckets) (about 40 buckets cover 1 to 10^6
tokens; O(log n) with ``fcfs_bound``), plus O(n) for the first pick after the lanes start
reordering; ``plan(k)`` is O(k log n). Nothing else walks the queue.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

R = TypeVar("R")

DEFAULT_MAX_OVERTAKES = 128
MAX_RESPONSE_RATIO = 8.0
# The cache lane's share of the prefill work while the aged lane is due (0: off; module docstring).
DEFAULT_CACHE_SHARE = 0.0
# Cost buckets of the aged lane per doubling of the cost (a bucket spans a factor sqrt(2)).
BUCKETS_PER_DOUBLING = 2
# A class's heaps are rebuilt once their stale items exceed this many per request, plus slack.
COMPACT_FACTOR = 2
COMPACT_SLACK = 64


class Pick(Enum):
    """Which lane presented a request (also a metric label)."""

    RESUME = "resume"
    FCFS = "fcfs"
    AGED = "aged"
    SHARE = "share"
    CACHE = "cache"


# Where a request stands in arrival order: (its order, the work clock when it joined, the work
# queued ahead of it then). Kept when the engine puts a request back in the step it took it (it
# never left the queue).
Stamps = tuple[tuple[Any, ...], int, int]


@dataclass(slots=True)
class Entry(Generic[R]):
    """One waiting request.

    ``klass``: its priority value (0 under FCFS). ``order``: its place in arrival order;
    ``arrival_work``: the work clock when it joined; ``ahead_work``: the uncached work of its
    class's waiting requests then (what FCFS admits before it). ``cost_tokens``: uncached
    prompt tokens (what admission charges the work clock). ``cache_key``: its place in the
    cache lane, None while the cost lanes are not built (the lanes' ``cache_key`` function
    takes it when they need it). ``resume``: in the resume lane. ``present``: False while
    held. The versions invalidate stale heap items: ``version`` comes from a counter of the
    lanes, so a request that leaves and rejoins under the same id (put back by the engine,
    preempted) never matches the items of its earlier stay.

    Every field holds plain values or the engine's request, so a waiting request costs the
    garbage collector one tracked object here (the place is a plain tuple, which the collector
    stops tracking after its first collection; a ``NamedTuple`` would stay tracked and bring
    the next full collection nearer).
    """

    rid: str
    request: R
    klass: int
    order: tuple[Any, ...]
    arrival_work: int
    cost_tokens: int
    cache_key: tuple[Any, ...] | None = None
    resume: bool = False
    present: bool = True
    version: int = 0
    cache_version: int = 0
    bucket: int = 0
    ahead_work: int = 0

    @property
    def stamps(self) -> Stamps:
        """Its place, to give back to :meth:`Lanes.add` when it rejoins in the same step."""
        return self.order, self.arrival_work, self.ahead_work


@dataclass(slots=True)
class _Class:
    """One priority class: its requests (held ones too) and its heaps. ``cost_lanes``: the
    cache and aged heaps are built (only while reordering). ``items``: items in all its heaps,
    current and stale. ``waiting_work``: its requests' uncached work (``cost_tokens``).
    ``due``: the aged lane with ``fcfs_bound`` (by due work; ``aged`` holds the buckets
    otherwise)."""

    entries: dict[str, Entry[Any]] = field(default_factory=dict)
    resume: list[tuple[Any, ...]] = field(default_factory=list)
    fcfs: list[tuple[Any, ...]] = field(default_factory=list)
    cache: list[tuple[Any, ...]] = field(default_factory=list)
    aged: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    cost_lanes: bool = False
    items: int = 0
    waiting_work: int = 0
    due: list[tuple[Any, ...]] = field(default_factory=list)

    def cost_items(self) -> int:
        """Items in the cache and aged heaps. O(buckets)."""
        return len(self.cache) + len(self.due) + sum(len(heap) for heap in self.aged.values())

    def crowded(self) -> bool:
        """Stale items exceed ``COMPACT_FACTOR`` per current one (a request has one item per
        lane it is in), plus ``COMPACT_SLACK``."""
        current = len(self.entries) * (3 if self.cost_lanes else 1)
        return self.items > (COMPACT_FACTOR + 1) * current + COMPACT_SLACK


# A heap item and the entry it names -> whether the item is still current.
_Valid = Callable[["Entry[Any]", tuple[Any, ...]], bool]


class Lanes(Generic[R]):
    """Classes, their lanes, the work clock and the overtake count (module docstring)."""

    def __init__(
        self,
        *,
        cache_lane: bool = True,
        max_overtakes: int = DEFAULT_MAX_OVERTAKES,
        max_response_ratio: float = MAX_RESPONSE_RATIO,
        cache_share: float = DEFAULT_CACHE_SHARE,
        cache_key: Callable[[Entry[R]], tuple[Any, ...]] | None = None,
        fcfs_bound: bool = False,
    ) -> None:
        if max_overtakes < 0:
            raise ValueError("max_overtakes must be >= 0")
        if not 0.0 <= cache_share < 1.0:
            raise ValueError("cache_share must be >= 0 and < 1")
        self.cache_lane = cache_lane
        self.max_overtakes = max_overtakes
        self.max_response_ratio = max_response_ratio
        self.cache_share = cache_share
        self.fcfs_bound = fcfs_bound
        # The share's deficit counter in tokens (module docstring): due while >= 0.
        self._share_balance = 0.0
        self._cache_key = cache_key or _by_cost
        self._reorder = False
        self.reorder = cache_lane
        self.work_tokens = 0
        # Per class: admitted requests' arrival places, sorted; their number after the last drop.
        self._admitted: dict[int, list[tuple[Any, ...]]] = {}
        self._admitted_kept: dict[int, int] = {}
        self._entries: dict[str, Entry[R]] = {}
        self._classes: dict[int, _Class] = {}
        self._resume_seq = itertools.count(-1, -1)
        self._versions = itertools.count()

    @property
    def reorder(self) -> bool:
        """Whether picks may leave arrival order (set by the queue: cache pressure). Turning it
        off drops the cost lanes; the next pick that reorders builds them again."""
        return self._reorder

    @reorder.setter
    def reorder(self, value: bool) -> None:
        if self._reorder and not value:
            for state in self._classes.values():
                state.items -= state.cost_items()
                state.cache, state.aged, state.due, state.cost_lanes = [], {}, [], False
                for entry in state.entries.values():
                    entry.cache_key = None
        self._reorder = value

    # -- membership -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: object) -> bool:
        return rid in self._entries

    def get(self, rid: str) -> Entry[R] | None:
        return self._entries.get(rid)

    @property
    def heap_items(self) -> int:
        """Items in all the lanes' heaps, stale ones included (memory). O(classes)."""
        return sum(state.items for state in self._classes.values())

    @property
    def admitted_places(self) -> int:
        """Admitted places kept for the overtake counts, all classes (memory). O(classes)."""
        return sum(len(places) for places in self._admitted.values())

    def __iter__(self) -> Iterator[Entry[R]]:
        """All entries (held ones too) in the order vLLM's own queue would give them: classes by
        priority, then the resume lane, then arrival order. O(n log n)."""
        return iter(sorted(self._entries.values(), key=_vllm_order))

    def add(
        self,
        rid: str,
        request: R,
        *,
        klass: int,
        order: tuple[Any, ...],
        cost_tokens: int,
        resume: bool = False,
        stamps: Stamps | None = None,
    ) -> Entry[R]:
        """Queue a request at ``order`` (``resume``: at the front of the resume lane; ``stamps``:
        back at the place it had). O(log n)."""
        if rid in self._entries:
            raise ValueError(f"request {rid} is already queued")
        state = self._classes.get(klass)
        if state is None:
            state = self._classes[klass] = _Class()
        if stamps is not None:
            order, arrival_work, ahead_work = stamps
        else:
            if resume:
                order = (next(self._resume_seq),)
            arrival_work, ahead_work = self.work_tokens, state.waiting_work
        entry = Entry(
            rid=rid,
            request=request,
            klass=klass,
            order=order,
            arrival_work=arrival_work,
            cost_tokens=cost_tokens,
            resume=resume,
            version=next(self._versions),
            ahead_work=ahead_work,
        )
        state.waiting_work += cost_tokens
        self._entries[rid] = entry
        state.entries[rid] = entry
        self._push(entry, state)
        return entry

    def remove(self, rid: str) -> Entry[R]:
        """Drop a request (admitted, aborted). O(1) plus lazy heap cleanup."""
        entry = self._entries.pop(rid)
        entry.version = next(self._versions)
        state = self._classes[entry.klass]
        del state.entries[rid]
        state.waiting_work -= entry.cost_tokens
        if not state.entries:
            del self._classes[entry.klass]
        return entry

    def reprice(self, rid: str, cost_tokens: int) -> None:
        """The request's uncached work changed (its prefix got cached, or evicted): its cache
        key is taken again when the cost lanes next need it (at once while they are built).
        O(log n)."""
        entry = self._entries[rid]
        if cost_tokens == entry.cost_tokens:
            return
        state = self._classes[entry.klass]
        state.waiting_work += cost_tokens - entry.cost_tokens
        entry.cost_tokens, entry.cache_key = cost_tokens, None
        entry.cache_version += 1
        if entry.present and not entry.resume:
            self._push_cost_lanes(entry, state)
            if state.crowded():
                self._rebuild(state)

    def park(self, rid: str) -> None:
        """Hold a request: never presented until ``unpark``. O(1)."""
        entry = self._entries[rid]
        entry.present = False
        entry.version = next(self._versions)

    def unpark(self, rid: str) -> None:
        """Present a held request again, at its original places. O(log n)."""
        entry = self._entries.get(rid)
        if entry is None or entry.present:
            return
        entry.present = True
        self._push(entry, self._classes[entry.klass])

    def charge(self, entry: Entry[R], pick: Pick) -> None:
        """Admit ``entry`` (already removed) that ``pick`` presented: the work clock advances by
        its uncached prompt tokens, its place joins its class's admitted places, an aged or
        share pick moves the share's counter. O(log n) plus the insert."""
        self.work_tokens += entry.cost_tokens
        if pick is Pick.AGED:
            credit = self.cache_share * entry.cost_tokens
            self._share_balance = min(self._share_balance + credit, credit)
        elif pick is Pick.SHARE:
            self._share_balance -= (1.0 - self.cache_share) * entry.cost_tokens
        bisect.insort(self._admitted.setdefault(entry.klass, []), entry.order)

    def refund(self, entry: Entry[R], pick: Pick) -> None:
        """Undo :meth:`charge` for a request the engine put back in the same step (before
        :meth:`settle`). The share's counter is moved back by the same amount (a credit the cap
        cut is not restored: the share is then due slightly later)."""
        self.work_tokens -= entry.cost_tokens
        if pick is Pick.AGED:
            self._share_balance -= self.cache_share * entry.cost_tokens
        elif pick is Pick.SHARE:
            self._share_balance += (1.0 - self.cache_share) * entry.cost_tokens
        places = self._admitted[entry.klass]
        del places[bisect.bisect_left(places, entry.order)]

    def settle(self) -> None:
        """The engine's step is over: no admission so far will be refunded. A class's admitted
        places older than all its waiting requests are dropped once the list has grown by the
        class's size plus what the last drop kept, plus slack (module docstring: overtake
        count)."""
        for klass, places in list(self._admitted.items()):
            state = self._classes.get(klass)
            if state is None:
                del self._admitted[klass]
                self._admitted_kept.pop(klass, None)
                continue
            kept = self._admitted_kept.get(klass, 0)
            if len(places) <= 2 * kept + len(state.entries) + COMPACT_SLACK:
                continue
            oldest = min(entry.order for entry in state.entries.values())
            del places[: bisect.bisect_left(places, oldest)]
            self._admitted_kept[klass] = len(places)

    def overtaken(self, entry: Entry[R]) -> int:
        """Younger requests of its class admitted while ``entry`` waited. O(log n)."""
        places = self._admitted.get(entry.klass, ())
        return len(places) - bisect.bisect_right(places, entry.order)

    def response_ratio(self, entry: Entry[R]) -> float:
        """``(waited work + cost) / cost``, waited work in uncached prompt tokens admitted."""
        cost = entry.cost_tokens
        return (self.work_tokens - entry.arrival_work + cost) / cost

    def due_work(self, entry: Entry[R]) -> float:
        """With ``fcfs_bound``: the work clock from which ``entry`` is due in the aged lane, the
        later of its response-ratio bound and its FCFS place (module docstring)."""
        return entry.arrival_work + max(
            entry.ahead_work, (self.max_response_ratio - 1.0) * entry.cost_tokens
        )

    def check_invariants(self) -> None:
        """Raise AssertionError when a class's item count differs from its heaps' lengths, its
        cost lanes hold items while unbuilt, or its waiting work differs from its requests'
        costs. O(n + classes x buckets); for tests."""
        for state in self._classes.values():
            assert state.items == len(state.resume) + len(state.fcfs) + state.cost_items()
            assert state.cost_lanes or not state.cost_items(), "unbuilt cost lanes hold items"
            assert state.cost_lanes <= self.reorder, "cost lanes kept without reordering"
            assert state.waiting_work == sum(e.cost_tokens for e in state.entries.values())

    # -- picking --------------------------------------------------------------------------------
    def next_pick(self) -> tuple[Entry[R], Pick] | None:
        """The request to present next and the lane it comes from (module docstring)."""
        for klass in sorted(self._classes):
            state = self._classes[klass]
            head = self._head(state.resume, _in_order_lane, state)
            if head is not None:
                return head, Pick.RESUME
            oldest = self._head(state.fcfs, _in_order_lane, state)
            if oldest is None:
                continue
            if not self.reorder or self.overtaken(oldest) >= self.max_overtakes:
                return oldest, Pick.FCFS
            self._cost_lanes(state)
            if self.fcfs_bound:
                aged = self._head(state.due, _in_cost_lanes, state)
                due = aged is not None and self.work_tokens >= self.due_work(aged)
            else:
                aged = self._most_aged(state)
                due = aged is not None and self.response_ratio(aged) >= self.max_response_ratio
            if due:
                if self.cache_share and self._share_balance >= 0:
                    cheapest = self._head(state.cache, _in_cost_lanes, state)
                    if cheapest is not None and cheapest is not aged:
                        return cheapest, Pick.SHARE
                return aged, Pick.AGED
            cheapest = self._head(state.cache, _in_cost_lanes, state)
            if cheapest is None or cheapest is oldest:
                return oldest, Pick.FCFS
            return cheapest, Pick.CACHE
        return None

    def plan(self, k: int) -> list[Entry[R]]:
        """Up to ``k`` requests the next picks will come from, best first: the best class's
        resume lane, cache lane (while reordering) and FCFS lane heads in turn. O(k log n);
        leaves the lanes as they were."""
        planned: list[Entry[R]] = []
        seen: set[str] = set()
        for klass in sorted(self._classes):
            state = self._classes[klass]
            if self.reorder:
                self._cost_lanes(state)  # (re)builds the heaps: take them after
            lanes = [(state.resume, _in_order_lane)]
            if self.reorder:
                lanes.append((state.cache, _in_cost_lanes))
            lanes.append((state.fcfs, _in_order_lane))
            for heap, valid in lanes:
                for entry in self._smallest(heap, valid, k - len(planned), state):
                    if entry.rid not in seen:
                        seen.add(entry.rid)
                        planned.append(entry)
                if len(planned) >= k:
                    return planned
        return planned

    # -- internals ------------------------------------------------------------------------------
    def _push(self, entry: Entry[R], state: _Class) -> None:
        item = _order_item(entry)
        state.items += 1
        if entry.resume:
            heapq.heappush(state.resume, item)
        else:
            heapq.heappush(state.fcfs, item)
            self._push_cost_lanes(entry, state)
        if state.crowded():
            self._rebuild(state)

    def _push_cost_lanes(self, entry: Entry[R], state: _Class) -> None:
        if not state.cost_lanes:
            return
        heapq.heappush(state.cache, self._cache_item(entry))
        if self.fcfs_bound:
            heapq.heappush(state.due, self._due_item(entry))
        else:
            entry.bucket = _bucket(entry.cost_tokens)
            heapq.heappush(state.aged.setdefault(entry.bucket, []), _aged_item(entry))
        state.items += 2

    def _cost_lanes(self, state: _Class) -> None:
        """Build the class's cost lanes unless they are built (O(n), then nothing until the
        lanes stop reordering)."""
        if not state.cost_lanes:
            state.cost_lanes = True
            self._rebuild(state)

    def _rebuild(self, state: _Class) -> None:
        """Rebuild the class's heaps from its present requests, without stale items. O(n)."""
        state.resume, state.fcfs, state.cache, state.aged, state.due = [], [], [], {}, []
        for entry in state.entries.values():
            if not entry.present:
                continue
            item = _order_item(entry)
            if entry.resume:
                state.resume.append(item)
                continue
            state.fcfs.append(item)
            if state.cost_lanes:
                state.cache.append(self._cache_item(entry))
                if self.fcfs_bound:
                    state.due.append(self._due_item(entry))
                else:
                    entry.bucket = _bucket(entry.cost_tokens)
                    state.aged.setdefault(entry.bucket, []).append(_aged_item(entry))
        for heap in (state.resume, state.fcfs, state.cache, state.due, *state.aged.values()):
            heapq.heapify(heap)
        state.items = len(state.resume) + len(state.fcfs) + state.cost_items()

    def _cache_item(self, entry: Entry[R]) -> tuple[Any, ...]:
        """The entry's cache-lane item; its key is computed now if it has none."""
        if entry.cache_key is None:
            entry.cache_key = self._cache_key(entry)
        return (entry.cache_key, entry.order, entry.version, entry.cache_version, entry.rid)

    def _due_item(self, entry: Entry[R]) -> tuple[Any, ...]:
        """The entry's item in the ``fcfs_bound`` aged lane: earliest due first, then arrival."""
        return (self.due_work(entry), entry.order, entry.version, entry.cache_version, entry.rid)

    def _most_aged(self, state: _Class) -> Entry[R] | None:
        """The bucket heads' request with the highest response ratio (ties: the older)."""
        best: Entry[R] | None = None
        best_key: tuple[float, tuple[Any, ...]] | None = None
        for bucket in list(state.aged):
            heap = state.aged[bucket]
            head = self._head(heap, _in_cost_lanes, state)
            while head is not None and head.bucket != bucket:
                heapq.heappop(heap)
                state.items -= 1
                head = self._head(heap, _in_cost_lanes, state)
            if head is None:
                del state.aged[bucket]
                continue
            key = (-self.response_ratio(head), head.order)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def _head(self, heap: list[tuple[Any, ...]], valid: _Valid, state: _Class) -> Entry[R] | None:
        """The heap's first current item's entry; stale items on top are dropped."""
        while heap:
            entry = self._entries.get(heap[0][-1])
            if entry is not None and valid(entry, heap[0]):
                return entry
            heapq.heappop(heap)
            state.items -= 1
        return None

    def _smallest(
        self, heap: list[tuple[Any, ...]], valid: _Valid, k: int, state: _Class
    ) -> list[Entry[R]]:
        """The entries of the heap's first ``k`` current items; stale items met are dropped."""
        popped: list[tuple[Any, ...]] = []
        found: list[Entry[R]] = []
        while heap and len(found) < k:
            item = heapq.heappop(heap)
            entry = self._entries.get(item[-1])
            if entry is not None and valid(entry, item):
                popped.append(item)
                found.append(entry)
            else:
                state.items -= 1
        for item in popped:
            heapq.heappush(heap, item)
        return found


def _order_item(entry: Entry[Any]) -> tuple[Any, ...]:
    return (entry.order, entry.version, entry.rid)


def _by_cost(entry: Entry[Any]) -> tuple[Any, ...]:
    """The default cache key: least uncached work first."""
    return (entry.cost_tokens,)


def _aged_item(entry: Entry[Any]) -> tuple[Any, ...]:
    return (entry.order, entry.order, entry.version, entry.cache_version, entry.rid)


def _bucket(cost_tokens: int) -> int:
    return int(BUCKETS_PER_DOUBLING * math.log2(cost_tokens))


def _in_order_lane(entry: Entry[Any], item: tuple[Any, ...]) -> bool:
    """A resume- or FCFS-lane item ``(order, version, rid)`` still describes its entry."""
    return entry.present and item[1] == entry.version


def _in_cost_lanes(entry: Entry[Any], item: tuple[Any, ...]) -> bool:
    """A cache- or aged-lane item ``(key, order, version, cache_version, rid)`` is current."""
    return (
        entry.present
        and not entry.resume
        and item[2] == entry.version
        and item[3] == entry.cache_version
    )


def _vllm_order(entry: Entry[Any]) -> tuple[Any, ...]:
    return (entry.klass, not entry.resume, entry.order)
