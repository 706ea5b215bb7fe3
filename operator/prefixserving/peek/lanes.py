"""Stride lanes: the scan order of the waiting queue.

Every waiting request sits in one **lane**: one lane per cluster (requests whose first prompt
block is shared with another waiting request or is already cached; keyed by that block's hash)
plus one **solo** lane for requests that share nothing. Inside a lane the order is arrival order.

**Algorithm**. Without cache pressure (the eviction guard finds no needed block among the blocks
the next step could evict) the order is exactly FCFS: the oldest presentable request of all
lanes (the *spine*). Under pressure, when waiting costs hits, two mechanisms reorder:

1. **Lane stride** (Waldspurger and Weihl's stride scheduling): each lane has a pass; the lane
   with the lowest pass presents its head; admitting ``c`` prefill tokens (uncached tokens, at
   least one block) from a lane of ``k`` waiting requests advances its pass by ``c / k``. So
   every waiting request gets an equal share of prefill tokens and a large cluster, whose
   members are cheap once its prefix is cached, drains quickly without starving small lanes.
   A new lane starts at the current global pass and cannot bank credit.
2. **Ride-along**: the oldest head among *hot* lanes (a head whose prompt is mostly cached, for
   example the siblings right behind their pioneer) goes next, as long as the ride-along class
   has used at most the share ``s`` of prefill tokens: picks advance a ride-along pass by
   ``c / s`` and the other picks a spine pass by ``c / (1 - s)``; ride-along picks while its
   pass is not ahead (an idle ride-along class cannot bank credit).

**Bounds** (documented guarantees, checked by property tests):

* a request of the solo lane (it shares nothing) is never overtaken by a younger request:
  neither mechanism picks a request younger than the solo lane's head. Requests that share
  nothing keep their FCFS position; only work older than them is reordered (and shrunk by
  hits), which keeps their TTFT tail at FCFS's or better. Admitting younger cheap hits ahead
  of them was measured to cost their p99 through KV occupancy, not prefill tokens;
* between two non-ride-along picks, ride-along admits at most ``s / (1 - s) * c_prev + c_max``
  prefill tokens (``c_prev``: cost of the previous pick, ``c_max``: largest request);
* under lane stride a request at the head of its lane of ``k`` is admitted after at most
  ``W * c_max / k`` prefill tokens of other lanes, ``W`` being the waiting requests (its lane's
  pass is at most one stride ahead of the global pass);
* a held sibling's extra wait is bounded separately by ``maxSiblingWaitMs`` (holding module).

**Parameters**: ``ride_share`` (default 0.5), ``max_hot_lanes`` (16 most recently hot); the
queue decides hotness (half the prompt cached) and pressure.

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
DEFAULT_RIDE_SHARE = 0.5
DEFAULT_MAX_HOT_LANES = 16


def cluster_lane(root_hash: Hashable) -> tuple[str, Hashable]:
    """Lane key of the cluster whose first prompt block hashes to ``root_hash``."""
    return ("cluster", root_hash)


class Pick(Enum):
    """How a request was presented (also a metric label): FCFS spine without cache pressure,
    lane stride under pressure, or ride-along of a hot cluster."""

    FCFS = "fcfs"
    STRIDE = "stride"
    RIDE_ALONG = "ride_along"


@dataclass(slots=True)
class Entry(Generic[R]):
    """One waiting request. ``seq`` orders it (negative when prepended); ``present`` is False
    while the holding table parks it; ``version`` invalidates stale heap entries."""

    rid: str
    request: R
    seq: int
    lane: Hashable
    present: bool = True
    version: int = 0


@dataclass(slots=True)
class _Lane:
    heap: list[tuple[int, int, str]]
    order: int
    pass_tokens: float
    size: int = 0


class Lanes(Generic[R]):
    """Lanes, the FCFS spine and the two-class stride between spine and ride-along."""

    def __init__(
        self,
        ride_share: float = DEFAULT_RIDE_SHARE,
        max_hot_lanes: int = DEFAULT_MAX_HOT_LANES,
    ) -> None:
        if not 0.0 <= ride_share < 1.0:
            raise ValueError("ride_share must be in [0, 1)")
        self.ride_share = ride_share
        self.max_hot_lanes = max_hot_lanes
        self.pressure = False
        self.spine_pass = 0.0
        self.ride_pass = 0.0
        self.global_lane_pass = 0.0
        self._entries: dict[str, Entry[R]] = {}
        self._spine: list[tuple[int, int, str]] = []
        self._lanes: dict[Hashable, _Lane] = {}
        self._lane_heap: list[tuple[float, int, Hashable]] = []
        self._lane_order = itertools.count()
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

    def add(self, rid: str, request: R, lane: Hashable, *, front: bool = False) -> Entry[R]:
        """Append (or, with ``front``, prepend) a request to ``lane``. O(log n)."""
        if rid in self._entries:
            raise ValueError(f"request {rid} is already queued")
        seq = next(self._front_seq) if front else next(self._next_seq)
        entry = Entry(rid=rid, request=request, seq=seq, lane=lane)
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
        self._push_lane(entry.lane)
        self.mark_hot(entry.lane)

    def mark_hot(self, lane: Hashable) -> None:
        """Remember ``lane`` as a ride-along candidate (most recent first out of the cap)."""
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
        """The request to present next and how it was picked.

        Without cache pressure (``pressure`` False): the FCFS spine. Under pressure: ride-along
        when its pass is not ahead of the spine's and some hot lane's head passes ``is_hot``
        (lanes whose head is not hot leave the hot set); otherwise the lane stride."""
        spine = self.spine_head()
        if spine is None:
            return None
        if not self.pressure:
            return spine, Pick.FCFS
        # A request that shares nothing is never overtaken by a younger one.
        solo = self.lane_head(SOLO_LANE)
        if self.ride_share > 0 and self.ride_pass <= self.spine_pass:
            ride = self._oldest_hot_head(is_hot)
            if ride is not None and (solo is None or ride.seq < solo.seq):
                return ride, Pick.RIDE_ALONG
        if self.ride_pass < self.spine_pass:
            self.ride_pass = self.spine_pass
        stride = self._stride_head()
        if stride is None or (solo is not None and solo.seq < stride.seq):
            return spine, Pick.FCFS
        return stride, Pick.STRIDE

    def charge(self, pick: Pick, lane: Hashable, cost_tokens: float) -> None:
        """Account ``cost_tokens`` of prefill just admitted from ``lane`` (already removed):
        the picking class's pass and the lane's pass (stride ``cost / tickets``, tickets = the
        lane's waiting requests including the admitted one)."""
        if pick is Pick.RIDE_ALONG:
            self.ride_pass += cost_tokens / self.ride_share
        else:
            self.spine_pass += cost_tokens / (1.0 - self.ride_share)
        state = self._lanes.get(lane)
        if state is None:
            return
        self.global_lane_pass = max(self.global_lane_pass, state.pass_tokens)
        state.pass_tokens += cost_tokens / (state.size + 1)
        self._push_lane(lane)

    def _stride_head(self) -> Entry[R] | None:
        """Head of the lane with the lowest pass (ties: older lane). Amortised O(log lanes)."""
        heap = self._lane_heap
        while heap:
            pass_tokens, _, key = heap[0]
            state = self._lanes.get(key)
            if state is None or state.pass_tokens != pass_tokens:
                heapq.heappop(heap)
                continue
            head = self._clean_head(state.heap)
            if head is None:
                heapq.heappop(heap)  # all parked; pushed again on unpark
                continue
            return head
        return None

    def _lane(self, key: Hashable) -> _Lane:
        state = self._lanes.get(key)
        if state is None:
            # A new lane starts at the current global pass: it cannot bank credit.
            state = _Lane(heap=[], order=next(self._lane_order), pass_tokens=self.global_lane_pass)
            self._lanes[key] = state
            self._push_lane(key)
        return state

    def _push_lane(self, key: Hashable) -> None:
        state = self._lanes[key]
        heapq.heappush(self._lane_heap, (state.pass_tokens, state.order, key))

    def _oldest_hot_head(self, is_hot: Callable[[Entry[R]], bool]) -> Entry[R] | None:
        """Oldest head among hot lanes that passes ``is_hot``: heads are tried oldest first, so
        usually one check; lanes whose head fails leave the hot set."""
        heads: list[Entry[R]] = []
        for lane in list(self._hot):
            head = self.lane_head(lane)
            if head is not None:
                heads.append(head)
        heads.sort(key=lambda entry: entry.seq)
        for head in heads:
            if is_hot(head):
                return head
            self._hot.pop(head.lane, None)
        return None

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
