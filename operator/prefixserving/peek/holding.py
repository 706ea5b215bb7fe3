"""Pioneer and sibling rules: compute a shared prefix once, then let the siblings hit it.

vLLM registers a request's full blocks in the prefix cache when it allocates them, so a
request admitted after another in the same step already hits the blocks of the other's first
chunk. What it cannot hit is a block the other will only allocate in a later chunk (a prefill
cut by ``long_prefill_token_threshold``; one cut by the step's token budget leaves no budget to
admit anything behind it): admitted now, it would compute that block a second time. The first
request admitted with a block uncached is that block's **pioneer**; a waiting request whose
first uncached block a running pioneer is still to compute is its **sibling**, and is held
until the pioneer has registered it.

**Algorithm**
1. ``add_pioneer(pid, hashes, computed_tokens)`` once the engine has *allocated* a request
   (a request it skipped without allocating never becomes a pioneer): the request owns each of
   its uncached block hashes that no other running pioneer owns.
2. ``decide(rid, hashes, frontier)`` for a candidate: if its first uncached block is owned by
   a running pioneer, it waits for the deepest consecutive block that pioneer owns (its
   *target*). A request whose wait budget is spent is never held again.
3. ``hold`` parks it; ``release_ready(now, is_cached)`` hands back siblings whose target is
   cached or whose wait budget ran out; ``progress(pid, computed_tokens)`` retires a pioneer
   that computed nothing since the last step (stalled, preempted, finished), which hands back
   its siblings: a hold lasts only while the pioneer is making progress towards the target.

**Parameters**: ``max_sibling_wait_s`` (default 0.5 s, env ``PREFIXSERVING_MAX_SIBLING_WAIT_MS``):
the most a sibling is held over its whole stay in the queue, whatever the pioneer does (0 turns
holding off).

**Bounds**: a sibling is held at most ``max_sibling_wait_s`` plus one scheduler step in total,
and never across a step in which its pioneer made no progress. Held siblings are parked outside
the lanes, so they never block unrelated requests.

**Cost**: ``add_pioneer`` and ``retire_pioneer`` are O(blocks of the pioneer), ``decide`` is
O(blocks of the candidate), ``progress`` is O(1), ``release_ready`` is O(holding groups +
released + expired log n); holding groups are (pioneer, target) pairs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)

DEFAULT_MAX_SIBLING_WAIT_S = 0.5


@dataclass(slots=True)
class _Group(Generic[H]):
    pioneer: str
    target: H
    siblings: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _Pioneer(Generic[H]):
    hashes: list[H]
    computed_tokens: int


@dataclass(frozen=True, slots=True)
class HoldInfo(Generic[H]):
    """Why a sibling is held: the pioneer computing its prefix and the block it waits for."""

    pioneer: str
    target: H
    deadline_s: float
    since_s: float


class Holding(Generic[H]):
    """Running pioneers, the blocks they will register, and the siblings held on them."""

    def __init__(self, max_sibling_wait_s: float = DEFAULT_MAX_SIBLING_WAIT_S) -> None:
        if max_sibling_wait_s < 0:
            raise ValueError("max_sibling_wait_s must be >= 0")
        self.max_sibling_wait_s = max_sibling_wait_s
        self._owner: dict[H, str] = {}
        self._pioneers: dict[str, _Pioneer[H]] = {}
        self._groups: dict[tuple[str, H], _Group[H]] = {}
        self._held: dict[str, HoldInfo[H]] = {}
        self._deadlines: list[tuple[float, str]] = []
        # Latest time each queued request may still be held (first hold + max wait).
        self._budget_end: dict[str, float] = {}
        # Longest single hold released so far (benchmark reports; checks the wait bound).
        self.longest_wait_s = 0.0

    # -- pioneers -------------------------------------------------------------------------------
    @property
    def pioneers(self) -> list[str]:
        return list(self._pioneers)

    def is_pioneer(self, rid: str) -> bool:
        return rid in self._pioneers

    def owner(self, block_hash: H) -> str | None:
        """The running pioneer that will register ``block_hash``, if any. O(1)."""
        return self._owner.get(block_hash)

    def owned_hashes(self) -> Iterator[H]:
        """Blocks running pioneers will register (each once)."""
        return iter(self._owner)

    def add_pioneer(self, pid: str, hashes: Sequence[H], computed_tokens: int) -> None:
        """``pid`` was allocated and will register ``hashes`` (its uncached blocks);
        ``computed_tokens`` is its progress now. O(blocks)."""
        if pid in self._pioneers:
            self.retire_pioneer(pid)
        owned = [h for h in hashes if self._owner.setdefault(h, pid) == pid]
        self._pioneers[pid] = _Pioneer(owned, computed_tokens)

    def progress(self, pid: str, computed_tokens: int, now_s: float) -> list[str]:
        """Record the pioneer's progress; one that computed nothing since the last call is
        retired. Returns the siblings released by that. O(1), or O(blocks) when retired."""
        pioneer = self._pioneers.get(pid)
        if pioneer is None:
            return []
        if computed_tokens <= pioneer.computed_tokens:
            return self.retire_pioneer(pid, now_s)
        pioneer.computed_tokens = computed_tokens
        return []

    def retire_pioneer(self, pid: str, now_s: float | None = None) -> list[str]:
        """Forget a pioneer (prefill done, stalled, preempted, aborted); return its released
        siblings. ``now_s`` times their holds for ``longest_wait_s``."""
        pioneer = self._pioneers.pop(pid, None)
        if pioneer is None:
            return []
        for block_hash in pioneer.hashes:
            if self._owner.get(block_hash) == pid:
                del self._owner[block_hash]
        released: list[str] = []
        for key in [k for k in self._groups if k[0] == pid]:
            released.extend(self._release_group(key, now_s))
        return released

    # -- siblings -------------------------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return len(self._held)

    def held(self) -> dict[str, HoldInfo[H]]:
        return dict(self._held)

    def is_held(self, rid: str) -> bool:
        return rid in self._held

    def decide(
        self, rid: str, hashes: Sequence[H], frontier: int, now_s: float
    ) -> HoldInfo[H] | None:
        """How ``rid`` would be held for a running pioneer now, or None to present it.
        ``frontier``: its cached leading blocks. O(blocks)."""
        if (
            self.max_sibling_wait_s == 0
            or frontier >= len(hashes)
            or self._budget_end.get(rid, now_s + 1.0) <= now_s
        ):
            return None
        pioneer = self._owner.get(hashes[frontier])
        if pioneer is None or pioneer == rid:
            return None
        target_index = frontier
        while target_index + 1 < len(hashes) and self._owner.get(hashes[target_index + 1]) == (
            pioneer
        ):
            target_index += 1
        deadline = self._budget_end.get(rid, now_s + self.max_sibling_wait_s)
        return HoldInfo(pioneer, hashes[target_index], deadline, now_s)

    def hold(self, rid: str, info: HoldInfo[H]) -> None:
        """Park ``rid`` as ``info`` says (from :meth:`decide`)."""
        self._budget_end.setdefault(rid, info.deadline_s)
        self._held[rid] = info
        key = (info.pioneer, info.target)
        self._groups.setdefault(key, _Group(info.pioneer, info.target)).siblings.add(rid)
        heapq.heappush(self._deadlines, (info.deadline_s, rid))

    def release_ready(self, now_s: float, is_cached: Callable[[H], bool]) -> list[str]:
        """Siblings to hand back now: target cached, or wait budget spent."""
        released: list[str] = []
        for key in [k for k, group in self._groups.items() if is_cached(group.target)]:
            released.extend(self._release_group(key, now_s))
        while self._deadlines and self._deadlines[0][0] <= now_s:
            _, rid = heapq.heappop(self._deadlines)
            info = self._held.get(rid)
            if info is not None and info.deadline_s <= now_s:
                self._unhold(rid, info, now_s)
                released.append(rid)
        return released

    def forget(self, rid: str) -> None:
        """The request left the queue (admitted, aborted): drop its hold state. O(1)."""
        info = self._held.get(rid)
        if info is not None:
            self._unhold(rid, info)
        self._budget_end.pop(rid, None)

    def clear(self) -> list[str]:
        """Release every sibling and forget every pioneer (shutdown)."""
        released = list(self._held)
        self._owner.clear()
        self._pioneers.clear()
        self._groups.clear()
        self._held.clear()
        self._deadlines.clear()
        return released

    def _record_wait(self, info: HoldInfo[H], now_s: float | None) -> None:
        if now_s is not None:
            self.longest_wait_s = max(self.longest_wait_s, now_s - info.since_s)

    def _release_group(self, key: tuple[str, H], now_s: float | None = None) -> list[str]:
        group = self._groups.pop(key)
        for rid in group.siblings:
            self._record_wait(self._held.pop(rid), now_s)
        return sorted(group.siblings)

    def _unhold(self, rid: str, info: HoldInfo[H], now_s: float | None = None) -> None:
        del self._held[rid]
        self._record_wait(info, now_s)
        key = (info.pioneer, info.target)
        group = self._groups.get(key)
        if group is not None:
            group.siblings.discard(rid)
            if not group.siblings:
                del self._groups[key]
