"""Eviction guard: keep the cached blocks that the next picks will read.

The engine keeps freed, still-cached blocks in an LRU free queue and evicts from its LRU end
when it needs new blocks. Before each step the queue hands the guard its **plan**: the requests
its next picks come from, best first, and for each the cached blocks it will read (see
:meth:`prefixserving.peek.lanes.Lanes.plan`). The guard works on the free queue through
:class:`BlockPoolPort`:

**Algorithm**
1. Translate the plan's hashes into the pool's cache keys (the form the free queue's blocks
   carry), then walk the free queue from the LRU end across the blocks this step could evict
   (``window_blocks`` blocks the plan does not need, at most ``4 x window_blocks`` in all).
   An empty plan (no planned request has a cached block) needs no walk.
2. For each planned request with a block met there, move its free cached blocks (``plan_blocks``:
   root first) to the most-recently-used end: worst plan rank first, and within a rank deepest
   first, so eviction meets them in reverse plan order (the next pick's blocks go last) and
   takes each chain from its end. A block's prefix moves with it: a lookup stops at the first
   missing block, so a chain that lost a block in its middle is worth only what lies before
   it. (Moving only the blocks met in the window would rotate a chain that fills the LRU end:
   a few steps of that, and the engine evicts from its middle.) Moving costs no capacity;
   blocks that only later picks need are not protected (the queue asks again next step, when
   they are nearer).
3. Optionally hard-pin instead (reference count + 1, so the block cannot be evicted this step):
   planned blocks while the pins stay within ``pin_budget_fraction`` of the pool and leave
   ``window_blocks`` free (the most one step can allocate, so a pin never costs a running
   request its next block: it cannot cause a preemption), one block per prefix hash (the engine
   may cache two copies of a block that two requests computed in the same step; one copy serves
   every lookup, and a second pin under the same key would never be released). Pins last one
   step: ``release_all`` runs before the next plan, on preemption, on a prefix-cache reset and
   at shutdown. The engine passes ``pin=False`` for the step after one that preempted or
   scheduled nothing while requests waited: vLLM admits a request (a preempted one too) only
   when its whole prompt fits, which pins of later picks can prevent, and with nothing running
   nothing would change before the next step.

A planned block inside the window, or a free queue shorter than the window (the step may evict
every cached block), is **pressure**: the cache cannot keep what the next picks read.

**Parameters**: ``pin_budget_fraction`` (default 0.0: pins off; env
``PREFIXSERVING_PIN_BUDGET_FRACTION``), ``window_blocks`` (most blocks one step may allocate:
token budget / block size + one per running request; each ``step`` may pass a smaller estimate).

**Cost**: ``step`` O(planned blocks + window_blocks + m log m), the walk capped at
4 x window_blocks (O(1) for an empty plan), where m is the cached blocks of the planned requests
with a block in the window (one lookup each); ``release_all`` O(pinned).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import Generic, Protocol, TypeVar

B = TypeVar("B")
H = TypeVar("H", bound=Hashable)

DEFAULT_PIN_BUDGET_FRACTION = 0.0


class BlockPoolPort(Protocol[B, H]):
    """What the guard needs from an engine's block pool."""

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        ...

    @property
    def num_free(self) -> int:
        """Blocks in the free queue (empty or evictable cached blocks)."""
        ...

    def free_lru(self) -> Iterator[tuple[B, Hashable | None]]:
        """Free blocks from the LRU (evict-first) end, with their cache key (``cache_key`` of
        their prefix hash, in the pool's own form: no per-block conversion) or None."""
        ...

    def cache_key(self, block_hash: H) -> Hashable:
        """The pool's key for a prefix hash, as ``free_lru`` gives it."""
        ...

    def cached_block(self, key: Hashable) -> B | None:
        """A block cached under ``key`` (a ``cache_key``), or None."""
        ...

    def is_free(self, block: B) -> bool:
        """Whether the block is in the free queue (no request uses it)."""
        ...

    def move_to_mru(self, block: B) -> None:
        """Move a free block to the most-recently-used end of the free queue."""
        ...

    def pin(self, block: B) -> None:
        """Take a reference on the block (it leaves the free queue)."""
        ...

    def unpin(self, block: B) -> None:
        """Drop the reference taken by ``pin``."""
        ...


@dataclass(frozen=True, slots=True)
class GuardReport:
    """What one ``step`` did: planned blocks met in the eviction window, moved, pinned, and
    whether the free queue is smaller than the window (the step may evict every free block)."""

    needed_in_window: int
    moved: int
    pinned: int
    free_short: bool

    @property
    def pressure(self) -> bool:
        """The cache cannot keep what the next picks read: a planned block is about to be
        evicted, or the step may evict all free blocks."""
        return self.needed_in_window > 0 or self.free_short


class Guard(Generic[B, H]):
    """Protects the cached blocks the next picks read, through a :class:`BlockPoolPort`."""

    def __init__(
        self,
        port: BlockPoolPort[B, H],
        window_blocks: int,
        pin_budget_fraction: float = DEFAULT_PIN_BUDGET_FRACTION,
    ) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise ValueError("pin_budget_fraction must be in [0, 1]")
        self.port = port
        self.window_blocks = max(1, window_blocks)
        self.pin_budget_blocks = int(pin_budget_fraction * port.num_blocks)
        self._pinned: dict[Hashable, B] = {}  # by cache key

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def pinned_blocks(self) -> list[B]:
        """The blocks pinned now, in the order they were pinned."""
        return list(self._pinned.values())

    def is_pinned(self, block_hash: H) -> bool:
        return self.port.cache_key(block_hash) in self._pinned

    def step(
        self,
        plan_rank: dict[H, int],
        window_blocks: int | None = None,
        plan_blocks: Callable[[int], Sequence[H]] | None = None,
        pin: bool = True,
    ) -> GuardReport:
        """Protect the planned blocks in the eviction window (module docstring).
        ``plan_rank``: block hash -> rank of the best planned request that reads it (0 first);
        ``window_blocks``: this step's estimate of blocks it allocates (capped at the maximum);
        ``plan_blocks``: rank -> the planned request's cached block hashes, root first (None:
        only the blocks met in the window move); ``pin``: whether this step may take pins."""
        window = (
            self.window_blocks if window_blocks is None else min(window_blocks, self.window_blocks)
        )
        window = max(1, window)
        needed: list[tuple[int, B, Hashable]] = []
        cache_key = self.port.cache_key
        if plan_rank:  # an empty plan needs no block: nothing to find in the window
            ranks = {cache_key(block_hash): rank for block_hash, rank in plan_rank.items()}
            unneeded = 0
            for block, key in islice(self.port.free_lru(), 4 * window):
                if key in ranks:
                    needed.append((ranks[key], block, key))
                    continue
                unneeded += 1
                if unneeded >= window:
                    break
        needed.sort(key=lambda item: -item[0])
        pinned = 0
        budget = self.pin_budget_blocks if pin else 0
        for _, block, key in reversed(needed):
            if len(self._pinned) >= budget or self.port.num_free <= self.window_blocks:
                break
            if key in self._pinned:
                continue  # a second copy of a pinned prefix block
            self.port.pin(block)
            self._pinned[key] = block
            pinned += 1
        moving: dict[Hashable, tuple[tuple[int, int], B]] = {}
        met = sorted({rank for rank, _, key in needed if key not in self._pinned})
        for rank in met if plan_blocks else ():  # best first: a shared prefix is walked once
            path = plan_blocks(rank)
            for depth in range(len(path) - 1, -1, -1):
                block_hash = path[depth]
                key = cache_key(block_hash)
                if key in moving:
                    break  # collected with its whole prefix by a better rank
                if key in self._pinned:
                    continue  # cannot be evicted this step; its prefix may be
                found = self.port.cached_block(key)
                if found is None:
                    continue  # evicted: the blocks before it still count
                if not self.port.is_free(found):
                    break  # a request uses it, so it holds the whole prefix too
                moving[key] = ((-plan_rank[block_hash], -depth), found)
        for rank, block, key in needed:
            if key not in self._pinned and key not in moving:
                moving[key] = ((-rank, 0), block)
        for _, block in sorted(moving.values(), key=itemgetter(0)):
            self.port.move_to_mru(block)
        return GuardReport(
            needed_in_window=len(needed),
            moved=len(moving),
            pinned=pinned,
            free_short=self.port.num_free < window,
        )

    def release_all(self) -> int:
        """Release every pin (preemption pressure, prefix-cache reset, shutdown). O(pinned)."""
        blocks = list(self._pinned.values())
        self._pinned.clear()
        # Deepest pins were taken last; release them first so they are evicted first.
        for block in reversed(blocks):
            self.port.unpin(block)
        return len(blocks)
