"""Pioneer and sibling rules: compute a shared prefix once, then let the siblings hit it.

When requests share a prefix that is not cached, the first one admitted (the oldest: the queue
presents requests oldest first) is the **pioneer**. Until its prefill has registered the shared
blocks in the engine's prefix cache, a **sibling** admitted next to it would compute the same
blocks again: vLLM registers full blocks at allocation, so this only happens when the pioneer's
prefill is cut into chunks (``long_prefill_token_threshold``, or a prefix longer than the step's
token budget). The holding table parks such siblings and hands them back when the blocks are in.

**Algorithm**
1. ``add_pioneer(pid, hashes)`` when a request is admitted with uncached blocks: each of those
   block hashes is owned by the pioneer (the first owner keeps a hash).
2. ``decide(rid, hashes, cached_blocks, now)`` for a candidate request: if its first uncached
   block is owned by a running pioneer, the sibling waits for the deepest consecutive block
   that pioneer owns (its *target*). A request with no wait budget left is never held.
3. ``hold`` parks it; ``release_ready(now, is_cached)`` returns siblings whose target is
   cached, whose pioneer retired (prefill finished, preempted or aborted) or whose deadline
   passed.

**Parameters**: ``max_sibling_wait_s`` (default 0.5 s, env ``PREFIXSERVING_MAX_SIBLING_WAIT_MS``).

**Wait bound**: a sibling's total held time over its whole stay in the queue is at most
``max_sibling_wait_s`` plus one scheduler step (release is checked once per step). Held siblings
are parked outside the scan order, so they never block unrelated requests.

**Cost**: ``add_pioneer`` and ``retire_pioneer`` are O(blocks of the pioneer), ``decide`` is
O(blocks of the candidate), ``release_ready`` is O(holding groups + released + expired log n);
holding groups are (pioneer, target) pairs, at most the number of running pioneers times the
distinct depths their siblings share.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)

DEFAULT_MAX_SIBLING_WAIT_S = 0.5


@dataclass(slots=True)
class _Group(Generic[H]):
    pioneer: str
    target: H
    siblings: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class HoldInfo(Generic[H]):
    """Why a sibling is held: the pioneer computing its prefix and the block it waits for."""

    pioneer: str
    target: H
    deadline_s: float
    since_s: float


class Holding(Generic[H]):
    """Running pioneers, the block hashes they will register, and the siblings held on them."""

    def __init__(self, max_sibling_wait_s: float = DEFAULT_MAX_SIBLING_WAIT_S) -> None:
        if max_sibling_wait_s < 0:
            raise ValueError("max_sibling_wait_s must be >= 0")
        self.max_sibling_wait_s = max_sibling_wait_s
        self._owner: dict[H, str] = {}
        self._pioneer_hashes: dict[str, list[H]] = {}
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
        return list(self._pioneer_hashes)

    def is_pioneer(self, rid: str) -> bool:
        return rid in self._pioneer_hashes

    def add_pioneer(self, pid: str, hashes: Sequence[H]) -> None:
        """Record that ``pid`` will register ``hashes`` (its uncached blocks). O(blocks)."""
        if pid in self._pioneer_hashes:
            self.retire_pioneer(pid)
        owned = [h for h in hashes if self._owner.setdefault(h, pid) == pid]
        self._pioneer_hashes[pid] = owned

    def retire_pioneer(self, pid: str, now_s: float | None = None) -> list[str]:
        """Forget a pioneer (prefill done, preempted, aborted); return its released siblings.
        ``now_s`` times their holds for ``longest_wait_s``."""
        for block_hash in self._pioneer_hashes.pop(pid, ()):
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
        self, rid: str, hashes: Sequence[H], cached_blocks: int, now_s: float
    ) -> tuple[str, H] | None:
        """Return (pioneer, target hash) if ``rid`` should wait for a running pioneer, else None.
        O(blocks)."""
        if cached_blocks >= len(hashes) or self._budget_end.get(rid, now_s + 1.0) <= now_s:
            return None
        pioneer = self._owner.get(hashes[cached_blocks])
        if pioneer is None or pioneer == rid or self.max_sibling_wait_s == 0:
            return None
        target_index = cached_blocks
        while target_index + 1 < len(hashes) and self._owner.get(hashes[target_index + 1]) == (
            pioneer
        ):
            target_index += 1
        return pioneer, hashes[target_index]

    def hold(self, rid: str, pioneer: str, target: H, now_s: float) -> HoldInfo[H]:
        """Park ``rid`` until ``target`` is cached, ``pioneer`` retires or its budget ends."""
        deadline = self._budget_end.setdefault(rid, now_s + self.max_sibling_wait_s)
        info = HoldInfo(pioneer=pioneer, target=target, deadline_s=deadline, since_s=now_s)
        self._held[rid] = info
        self._groups.setdefault((pioneer, target), _Group(pioneer, target)).siblings.add(rid)
        heapq.heappush(self._deadlines, (deadline, rid))
        return info

    def release_ready(self, now_s: float, is_cached: Callable[[H], bool]) -> list[str]:
        """Siblings to hand back now: target cached, or deadline passed. O(groups + released)."""
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
        self._pioneer_hashes.clear()
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
