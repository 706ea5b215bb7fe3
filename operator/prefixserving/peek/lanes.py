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
* the **resume lane** (``cache_lane`` off only): requests the engine put back, last first, as
  vLLM's own queue.

**Pick rule** (the best class that has a presentable request):

1. with ``cache_lane`` off, or while the cache is not under pressure (``reorder`` False: the
   queue sets it from the eviction guard), the resume lane's head, then the FCFS lane's head:
   exactly vLLM's order. Without cache pressure reordering buys no hits, and with no prefix reuse
   FCFS is the order that best meets TTFT bounds (Dexter et al., arXiv 2502.04677);
2. the FCFS lane's head if ``max_overtakes`` younger requests have been admitted ahead of it;
3. the aged lane's best request if its response ratio is at least ``max_response_ratio``;
4. otherwise the cache lane's head.

Measured on the replay suite (docs/peek.md): the cache lane alone has the best TTFT p50 and
starves expensive requests under load; the response-ratio bound keeps TTFT p99 well below
FCFS's on the sharing workloads (against SGLang ``hrrn``'s it wins some rows and loses others:
the results files say which); the overtake budget is the hard backstop.

**Bounds** (property tests check them): with ``cache_lane`` off or no pressure the order is
vLLM's; no request is overtaken by more than ``max_overtakes`` younger requests; held siblings
(``park``) are never presented and never block others.

**Parameters**: ``cache_lane`` (env ``PREFIXSERVING_LANES``), ``max_overtakes`` (default 128,
env ``PREFIXSERVING_MAX_OVERTAKES``; 0 keeps arrival order), ``max_response_ratio`` (default 8,
env ``PREFIXSERVING_MAX_RESPONSE_RATIO``; 1 is SGLang's ``hrrn`` order under pressure). On the
replay suite the bound at 8 instead of 16 cut PEEK's TTFT p99 by a third on the shared-prefix
workloads for hit rates within 0.04 (``bench/results/replay-response-ratio.md``); at 4 the
hit rate and p50 fell on the chunked and cold-document workloads.

**Cost**: add / reprice / park / unpark / remove / charge are O(log n) (binary heaps with lazy
deletion); a pick is amortised O(log n + cost buckets) (about 40 buckets cover 1 to 10^6 tokens);
``plan(k)`` is O(k log n). Nothing walks the queue.
"""

from __future__ import annotations

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
# Cost buckets of the aged lane per doubling of the cost (a bucket spans a factor sqrt(2)).
BUCKETS_PER_DOUBLING = 2


class Pick(Enum):
    """Which lane presented a request (also a metric label)."""

    RESUME = "resume"
    FCFS = "fcfs"
    AGED = "aged"
    CACHE = "cache"


@dataclass(frozen=True, slots=True)
class Stamps:
    """Where a request stands in arrival order: kept when the engine puts a request back in the
    step it took it (it never left the queue)."""

    order: tuple[Any, ...]
    arrival_work: int
    fcfs_point: int


@dataclass(slots=True)
class Entry(Generic[R]):
    """One waiting request.

    ``klass``: its priority value (0 under FCFS). ``stamps``: its place in arrival order, the
    work clock when it joined, and its FCFS point (admissions after which it would be admitted
    in arrival order). ``cost_tokens``: uncached prompt tokens (what admission charges the work
    clock). ``cache_key``: its place in the cache lane. ``resume``: in the resume lane.
    ``present``: False while held. The versions invalidate stale heap items.
    """

    rid: str
    request: R
    klass: int
    stamps: Stamps
    cost_tokens: int
    cache_key: tuple[Any, ...]
    resume: bool = False
    present: bool = True
    version: int = 0
    cache_version: int = 0
    bucket: int = 0

    @property
    def order(self) -> tuple[Any, ...]:
        return self.stamps.order


@dataclass(slots=True)
class _Class:
    resume: list[tuple[Any, ...]] = field(default_factory=list)
    fcfs: list[tuple[Any, ...]] = field(default_factory=list)
    cache: list[tuple[Any, ...]] = field(default_factory=list)
    aged: dict[int, list[tuple[Any, ...]]] = field(default_factory=dict)
    members: int = 0


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
    ) -> None:
        if max_overtakes < 0:
            raise ValueError("max_overtakes must be >= 0")
        self.cache_lane = cache_lane
        self.max_overtakes = max_overtakes
        self.max_response_ratio = max_response_ratio
        # Whether this step may leave arrival order (set by the queue: cache pressure).
        self.reorder = cache_lane
        self.work_tokens = 0
        self.admitted = 0
        self._entries: dict[str, Entry[R]] = {}
        self._classes: dict[int, _Class] = {}
        self._resume_seq = itertools.count(-1, -1)

    # -- membership -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: object) -> bool:
        return rid in self._entries

    def get(self, rid: str) -> Entry[R] | None:
        return self._entries.get(rid)

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
        cache_key: tuple[Any, ...],
        resume: bool = False,
        stamps: Stamps | None = None,
    ) -> Entry[R]:
        """Queue a request at ``order`` (``resume``: at the front of the resume lane; ``stamps``:
        back at the place it had). O(log n)."""
        if rid in self._entries:
            raise ValueError(f"request {rid} is already queued")
        state = self._classes.setdefault(klass, _Class())
        if stamps is None:
            if resume:
                order = (next(self._resume_seq),)
            stamps = Stamps(order, self.work_tokens, self.admitted + state.members)
        entry = Entry(
            rid=rid,
            request=request,
            klass=klass,
            stamps=stamps,
            cost_tokens=cost_tokens,
            cache_key=cache_key,
            resume=resume,
        )
        self._entries[rid] = entry
        state.members += 1
        self._push(entry, state)
        return entry

    def remove(self, rid: str) -> Entry[R]:
        """Drop a request (admitted, aborted). O(1) plus lazy heap cleanup."""
        entry = self._entries.pop(rid)
        entry.version += 1
        state = self._classes[entry.klass]
        state.members -= 1
        if state.members == 0:
            del self._classes[entry.klass]
        return entry

    def reprice(self, rid: str, cost_tokens: int, cache_key: tuple[Any, ...]) -> None:
        """The request's uncached work changed (its prefix got cached, or evicted). O(log n)."""
        entry = self._entries[rid]
        if (cost_tokens, cache_key) == (entry.cost_tokens, entry.cache_key):
            return
        entry.cost_tokens, entry.cache_key = cost_tokens, cache_key
        entry.cache_version += 1
        if entry.present and not entry.resume:
            self._push_cost_lanes(entry, self._classes[entry.klass])

    def park(self, rid: str) -> None:
        """Hold a request: never presented until ``unpark``. O(1)."""
        entry = self._entries[rid]
        entry.present = False
        entry.version += 1

    def unpark(self, rid: str) -> None:
        """Present a held request again, at its original places. O(log n)."""
        entry = self._entries.get(rid)
        if entry is None or entry.present:
            return
        entry.present = True
        self._push(entry, self._classes[entry.klass])

    def charge(self, cost_tokens: int) -> None:
        """An admission: the work clock advances by its uncached prompt tokens."""
        self.work_tokens += cost_tokens
        self.admitted += 1

    def refund(self, cost_tokens: int) -> None:
        """Undo :meth:`charge` for a request the engine put back in the same step."""
        self.work_tokens -= cost_tokens
        self.admitted -= 1

    def overtaken(self, entry: Entry[R]) -> int:
        """Younger requests admitted ahead of ``entry`` (exact for a class's oldest request)."""
        return self.admitted - entry.stamps.fcfs_point

    def response_ratio(self, entry: Entry[R]) -> float:
        """``(waited work + cost) / cost``, waited work in uncached prompt tokens admitted."""
        cost = entry.cost_tokens
        return (self.work_tokens - entry.stamps.arrival_work + cost) / cost

    # -- picking --------------------------------------------------------------------------------
    def next_pick(self) -> tuple[Entry[R], Pick] | None:
        """The request to present next and the lane it comes from (module docstring)."""
        for klass in sorted(self._classes):
            state = self._classes[klass]
            head = self._head(state.resume, _in_order_lane)
            if head is not None:
                return head, Pick.RESUME
            oldest = self._head(state.fcfs, _in_order_lane)
            if oldest is None:
                continue
            if not self.reorder or self.overtaken(oldest) >= self.max_overtakes:
                return oldest, Pick.FCFS
            aged = self._most_aged(state)
            if aged is not None and self.response_ratio(aged) >= self.max_response_ratio:
                return aged, Pick.AGED
            cheapest = self._head(state.cache, _in_cost_lanes)
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
            lanes = [(state.resume, _in_order_lane)]
            if self.reorder:
                lanes.append((state.cache, _in_cost_lanes))
            lanes.append((state.fcfs, _in_order_lane))
            for heap, valid in lanes:
                for entry in self._smallest(heap, valid, k - len(planned)):
                    if entry.rid not in seen:
                        seen.add(entry.rid)
                        planned.append(entry)
                if len(planned) >= k:
                    return planned
        return planned

    # -- internals ------------------------------------------------------------------------------
    def _push(self, entry: Entry[R], state: _Class) -> None:
        item = (entry.order, entry.version, entry.rid)
        if entry.resume:
            heapq.heappush(state.resume, item)
            return
        heapq.heappush(state.fcfs, item)
        self._push_cost_lanes(entry, state)

    def _push_cost_lanes(self, entry: Entry[R], state: _Class) -> None:
        heapq.heappush(
            state.cache,
            (entry.cache_key, entry.order, entry.version, entry.cache_version, entry.rid),
        )
        entry.bucket = int(BUCKETS_PER_DOUBLING * math.log2(entry.cost_tokens))
        heapq.heappush(
            state.aged.setdefault(entry.bucket, []),
            (entry.order, entry.order, entry.version, entry.cache_version, entry.rid),
        )

    def _most_aged(self, state: _Class) -> Entry[R] | None:
        """The bucket heads' request with the highest response ratio (ties: the older)."""
        best: Entry[R] | None = None
        best_key: tuple[float, tuple[Any, ...]] | None = None
        for bucket in list(state.aged):
            heap = state.aged[bucket]
            head = self._head(heap, _in_cost_lanes)
            while head is not None and head.bucket != bucket:
                heapq.heappop(heap)
                head = self._head(heap, _in_cost_lanes)
            if head is None:
                del state.aged[bucket]
                continue
            key = (-self.response_ratio(head), head.order)
            if best_key is None or key < best_key:
                best, best_key = head, key
        return best

    def _head(self, heap: list[tuple[Any, ...]], valid: _Valid) -> Entry[R] | None:
        while heap:
            entry = self._entries.get(heap[0][-1])
            if entry is not None and valid(entry, heap[0]):
                return entry
            heapq.heappop(heap)
        return None

    def _smallest(self, heap: list[tuple[Any, ...]], valid: _Valid, k: int) -> list[Entry[R]]:
        popped: list[tuple[Any, ...]] = []
        found: list[Entry[R]] = []
        while heap and len(found) < k:
            item = heapq.heappop(heap)
            entry = self._entries.get(item[-1])
            if entry is not None and valid(entry, item):
                popped.append(item)
                found.append(entry)
        for item in popped:
            heapq.heappush(heap, item)
        return found


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
