"""Stride lanes: the scan order of the waiting queue.

Every waiting request sits in one **lane**: one lane per cluster (requests whose first prompt
block is shared with another waiting request or is already cached; keyed by that block's hash)
plus one **solo** lane for requests that share nothing. Inside a lane the order is arrival order.

**Algorithm**. Requests are presented in FCFS order (the oldest presentable request of all
lanes: the *spine*) except under cache pressure (the queue decides: the cache cannot keep what
waiting requests need), where waiting costs hits:

1. **Overtake budget first**: if the spine head has already been overtaken by
   ``max_overtakes`` younger requests, it goes next.
2. **Hot lanes by stride** (Waldspurger and Weihl's stride scheduling): among the lanes whose
   head is *hot* (its prompt mostly cached, e.g. siblings right behind their pioneer), the lane
   with the lowest pass presents its head. Admitting ``c`` prefill tokens (uncached tokens, at
   least one block) from a lane of ``k`` waiting requests advances its pass by ``c / k``, so
   every waiting request gets an equal share of prefill tokens: a large cluster, whose members
   are cheap while its prefix is cached, drains quickly and cannot starve a small one. A new
   lane starts at the current global pass and cannot bank credit.
3. Otherwise the spine head (cold requests open clusters in arrival order).

A request admitted ahead of the spine head *overtakes* every older waiting request. Serving
hits first while the cache holds their prefix is what raises the hit rate; the budget is what
keeps the tail: the oldest waiting request has been overtaken at least as often as any younger
one, so checking the spine head bounds every request.

**Bounds** (documented guarantees, checked by property tests):

* without pressure the order is exactly FCFS;
* every request is overtaken by at most ``max_overtakes`` younger requests in total (a request
  that shares nothing included): when the spine head reaches the budget it is presented, and
  the engine admits nobody behind a head it cannot admit;
* a held sibling's extra wait is bounded separately by ``maxSiblingWaitMs`` (holding module).

**Parameters**: ``max_overtakes`` (default 256, env ``PREFIXSERVING_MAX_OVERTAKES``; 0 keeps
FCFS order), ``max_hot_lanes`` (16 most recently hot lanes are candidates); the queue decides
hotness (half the prompt cached) and pressure.

**Cost**: add / park / unpark / remove / charge are O(log n) (binary heaps with lazy deletion);
a pick is O(max_hot_lanes) hot checks plus amortised O(log n). Nothing walks the queue.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

R = TypeVar("R")

SOLO_LANE: tuple[str, None] = ("solo", None)
DEFAULT_MAX_OVERTAKES = 256
DEFAULT_MAX_HOT_LANES = 16


def cluster_lane(root_hash: Hashable) -> tuple[str, Hashable]:
    """Lane key of the cluster whose first prompt block hashes to ``root_hash``."""
    return ("cluster", root_hash)


class Pick(Enum):
    """How a request was presented (also a metric label): the FCFS spine, or a hot lane's
    head chosen by stride under cache pressure."""

    FCFS = "fcfs"
    STRIDE = "stride"


@dataclass(slots=True)
class Entry(Generic[R]):
    """One waiting request. ``seq`` orders it (negative when prepended); ``present`` is False
    while the holding table parks it; ``version`` invalidates stale heap entries;
    ``overtakes_at_add`` is the overtake counter when it joined."""

    rid: str
    request: R
    seq: int
    lane: Hashable
    overtakes_at_add: int
    present: bool = True
    version: int = 0


@dataclass(slots=True)
class _Lane:
    heap: list[tuple[int, int, str]]
    pass_tokens: float
    size: int = 0


class Lanes(Generic[R]):
    """Lanes, the FCFS spine, hot-lane stride and the overtake budget."""

    def __init__(
        self,
        max_overtakes: int = DEFAULT_MAX_OVERTAKES,
        max_hot_lanes: int = DEFAULT_MAX_HOT_LANES,
    ) -> None:
        if max_overtakes < 0:
            raise ValueError("max_overtakes must be >= 0")
        self.max_overtakes = max_overtakes
        self.max_hot_lanes = max_hot_lanes
        self.pressure = False
        self.global_lane_pass = 0.0
        # Admissions ahead of the spine head since the queue started.
        self.overtakes = 0
        self._entries: dict[str, Entry[R]] = {}
        self._spine: list[tuple[int, int, str]] = []
        self._lanes: dict[Hashable, _Lane] = {}
        self._hot: OrderedDict[Hashable, None] = OrderedDict()
        self._next_seq = itertools.count()
        self._front_seq = itertools.count(-1, -1)

    # -- membership -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, rid: object) -> bool:
        return rid in self._entries

    def get(self, rid: str) -> Entry[R] | None:
        return self._entries.get(rid)

    def __iter__(self) -> Iterator[Entry[R]]:
        """All entries (present and parked) in scan order of the spine. O(n log n)."""
        return iter(sorted(self._entries.values(), key=lambda e: e.seq))

    @property
    def num_lanes(self) -> int:
        return len(self._lanes)

    def lane_size(self, lane: Hashable) -> int:
        state = self._lanes.get(lane)
        return 0 if state is None else state.size

    def overtaken(self, entry: Entry[R]) -> int:
        """Upper bound on the younger requests admitted ahead of ``entry`` so far."""
        return self.overtakes - entry.overtakes_at_add

    def add(self, rid: str, request: R, lane: Hashable, *, front: bool = False) -> Entry[R]:
        """Append (or, with ``front``, prepend) a request to ``lane``. O(log n)."""
        if rid in self._entries:
            raise ValueError(f"request {rid} is already queued")
        seq = next(self._front_seq) if front else next(self._next_seq)
        entry = Entry(rid=rid, request=request, seq=seq, lane=lane, overtakes_at_add=self.overtakes)
        self._entries[rid] = entry
        self._lane(lane).size += 1
        self._push(entry)
        return entry

    def remove(self, rid: str) -> Entry[R]:
        """Drop a request (admitted or aborted). O(1) plus lazy heap cleanup later."""
        entry = self._entries.pop(rid)
        entry.version += 1
        state = self._lanes[entry.lane]
        state.size -= 1
        if state.size == 0:
            del self._lanes[entry.lane]
            self._hot.pop(entry.lane, None)
        return entry

    def move(self, rid: str, lane: Hashable) -> None:
        """Move a request to another lane, keeping its place in arrival order. O(log n)."""
        entry = self._entries.get(rid)
        if entry is None or entry.lane == lane:
            return
        present = entry.present
        self.remove(rid)
        entry.lane = lane
        self._entries[rid] = entry
        self._lane(lane).size += 1
        entry.present = present
        if present:
            self._push(entry)

    def park(self, rid: str) -> None:
        """Take a request out of the scan order (a held sibling). O(1)."""
        entry = self._entries[rid]
        entry.present = False
        entry.version += 1

    def unpark(self, rid: str) -> None:
        """Put a parked request back at its original place; its lane becomes hot. O(log n)."""
        entry = self._entries.get(rid)
        if entry is None or entry.present:
            return
        entry.present = True
        self._push(entry)
        self.mark_hot(entry.lane)

    def mark_hot(self, lane: Hashable) -> None:
        """Remember ``lane`` as a stride candidate (most recent first out of the cap)."""
        if lane == SOLO_LANE or lane not in self._lanes:
            return
        self._hot[lane] = None
        self._hot.move_to_end(lane)
        while len(self._hot) > self.max_hot_lanes:
            self._hot.popitem(last=False)

    # -- picking --------------------------------------------------------------------------------
    def spine_head(self) -> Entry[R] | None:
        """Oldest presentable request of all lanes. Amortised O(log n)."""
        return self._clean_head(self._spine)

    def lane_head(self, lane: Hashable) -> Entry[R] | None:
        state = self._lanes.get(lane)
        return None if state is None else self._clean_head(state.heap)

    def next_pick(self, is_hot: Callable[[Entry[R]], bool]) -> tuple[Entry[R], Pick] | None:
        """The request to present next and how it was picked (module docstring)."""
        spine = self.spine_head()
        if spine is None:
            return None
        if not self.pressure or self.overtaken(spine) >= self.max_overtakes:
            return spine, Pick.FCFS
        hot = self._stride_hot_head(is_hot)
        if hot is None or hot is spine:
            return spine, Pick.FCFS
        return hot, Pick.STRIDE

    def charge(self, pick: Pick, lane: Hashable, cost_tokens: float) -> None:
        """Account ``cost_tokens`` of prefill just admitted from ``lane`` (already removed):
        a stride pick overtook the spine head; the lane's pass advances by ``cost / tickets``
        (tickets = the lane's waiting requests including the admitted one)."""
        if pick is Pick.STRIDE:
            self.overtakes += 1
        state = self._lanes.get(lane)
        if state is None:
            return
        self.global_lane_pass = max(self.global_lane_pass, state.pass_tokens)
        state.pass_tokens += cost_tokens / (state.size + 1)

    def _stride_hot_head(self, is_hot: Callable[[Entry[R]], bool]) -> Entry[R] | None:
        """Head of the hot lane with the lowest pass (ties: the older head) among lanes whose
        head passes ``is_hot``; lanes whose head fails leave the hot set. O(max_hot_lanes)."""
        heads: list[Entry[R]] = []
        for lane in list(self._hot):
            head = self.lane_head(lane)
            if head is None:
                continue
            if is_hot(head):
                heads.append(head)
            else:
                del self._hot[lane]
        return min(
            heads,
            key=lambda entry: (self._lanes[entry.lane].pass_tokens, entry.seq),
            default=None,
        )

    def _lane(self, key: Hashable) -> _Lane:
        state = self._lanes.get(key)
        if state is None:
            # A new lane starts at the current global pass: it cannot bank credit.
            state = _Lane(heap=[], pass_tokens=self.global_lane_pass)
            self._lanes[key] = state
        return state

    def _push(self, entry: Entry[R]) -> None:
        item = (entry.seq, entry.version, entry.rid)
        heapq.heappush(self._spine, item)
        heapq.heappush(self._lanes[entry.lane].heap, item)

    def _clean_head(self, heap: list[tuple[int, int, str]]) -> Entry[R] | None:
        while heap:
            _, version, rid = heap[0]
            entry = self._entries.get(rid)
            if entry is not None and entry.present and entry.version == version:
                return entry
            heapq.heappop(heap)
        return None
