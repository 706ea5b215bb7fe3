"""Eviction guard: keep cached blocks that waiting requests will need.

The engine keeps freed, still-cached blocks in an LRU free queue and evicts from its LRU end
when it needs new blocks. The guard works on that queue through :class:`BlockPoolPort`:

**Algorithm**
1. *Always, at no capacity cost*: when a request joins the queue, its cached prefix blocks that
   sit in the free queue move to the most-recently-used end (deepest block first, so a parent
   stays behind its children and a chain is evicted from its tail). Before every step,
   ``step()`` walks the free queue from the LRU end across the blocks the step could evict
   (``window_blocks`` blocks nobody needs) and moves every needed block it meets to the MRU end
   in the order met, which keeps their relative recency (ordering them by how many requests
   need them instead was measured to lower the hit rate). Meeting a needed block inside that
   window, or a free queue shorter than the window (the step may evict every cached block),
   means the cache cannot keep everything the queue needs: the step reports **pressure**
   (the lanes reorder hot requests first while it lasts).
2. *Optionally, hard pins*: a needed block that ``pin_min_requests`` or more waiting requests
   need is pinned instead (reference count + 1, so it cannot be evicted), while the pinned
   blocks stay within ``pin_budget_fraction`` of the pool. Pins are released when no waiting
   request needs the block (``on_unneeded``), on preemption pressure (``release_all``), on
   prefix-cache reset and on shutdown.

**Parameters**: ``pin_budget_fraction`` (default 0.0: pins off; env
``PREFIXSERVING_PIN_BUDGET_FRACTION``), ``window_blocks`` (most blocks one step may allocate:
token budget / block size + one per running request; each ``step`` may pass a smaller estimate),
``pin_min_requests`` (default 2).

**Cost**: ``protect_path`` O(blocks of the request); ``step`` O(window_blocks + blocks moved),
capped at 4 x window_blocks; ``on_unneeded`` O(hashes); ``release_all`` O(pinned).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

B = TypeVar("B")
H = TypeVar("H", bound=Hashable)

DEFAULT_PIN_BUDGET_FRACTION = 0.0
DEFAULT_PIN_MIN_REQUESTS = 2


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

    def free_lru(self) -> Iterator[tuple[B, H | None]]:
        """Free blocks from the LRU (evict-first) end, with their prefix hash or None."""
        ...

    def cached_block(self, block_hash: H) -> B | None:
        """The block caching ``block_hash``, or None."""
        ...

    def is_free(self, block: B) -> bool:
        """True if the block sits in the free queue (reference count 0)."""
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
    """What one ``step`` did: needed blocks met in the eviction window, moved, pinned, and
    whether the free queue is smaller than the window (the step may evict every free block)."""

    needed_in_window: int
    moved: int
    pinned: int
    free_short: bool

    @property
    def pressure(self) -> bool:
        """The cache cannot keep what the queue needs: a needed block is about to be evicted,
        or the step may evict all free blocks."""
        return self.needed_in_window > 0 or self.free_short


class Guard(Generic[B, H]):
    """Protects the cached blocks waiting requests need, through a :class:`BlockPoolPort`."""

    def __init__(
        self,
        port: BlockPoolPort[B, H],
        window_blocks: int,
        pin_budget_fraction: float = DEFAULT_PIN_BUDGET_FRACTION,
        pin_min_requests: int = DEFAULT_PIN_MIN_REQUESTS,
    ) -> None:
        if not 0.0 <= pin_budget_fraction <= 1.0:
            raise ValueError("pin_budget_fraction must be in [0, 1]")
        self.port = port
        self.window_blocks = max(1, window_blocks)
        self.pin_budget_blocks = int(pin_budget_fraction * port.num_blocks)
        self.pin_min_requests = pin_min_requests
        self._pinned: dict[H, B] = {}

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    def is_pinned(self, block_hash: H) -> bool:
        return block_hash in self._pinned

    def protect_path(self, hashes: Sequence[H]) -> int:
        """Move the free cached blocks of a request's cached prefix to the MRU end, deepest
        first. Returns how many moved. O(blocks)."""
        blocks: list[B] = []
        for block_hash in hashes:
            block = self.port.cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        moved = 0
        for block in reversed(blocks):
            if self.port.is_free(block):
                self.port.move_to_mru(block)
                moved += 1
        return moved

    def step(self, need_count: Callable[[H], int], window_blocks: int | None = None) -> GuardReport:
        """Clear the eviction window of needed blocks (move or pin them). See module doc.
        ``window_blocks``: this step's estimate of blocks it allocates (capped at the maximum)."""
        window = (
            self.window_blocks if window_blocks is None else min(window_blocks, self.window_blocks)
        )
        window = max(1, window)
        needed: list[tuple[B, H]] = []
        unneeded = 0
        limit = 4 * window
        for scanned, (block, block_hash) in enumerate(self.port.free_lru(), start=1):
            if block_hash is not None and need_count(block_hash) > 0:
                needed.append((block, block_hash))
            else:
                unneeded += 1
            if unneeded >= window or scanned >= limit:
                break
        pinned = 0
        for block, block_hash in needed:
            if (
                len(self._pinned) < self.pin_budget_blocks
                and need_count(block_hash) >= self.pin_min_requests
            ):
                self.port.pin(block)
                self._pinned[block_hash] = block
                pinned += 1
            else:
                self.port.move_to_mru(block)
        return GuardReport(
            needed_in_window=len(needed),
            moved=len(needed) - pinned,
            pinned=pinned,
            free_short=self.port.num_free < window,
        )

    def on_unneeded(self, hashes: Iterable[H]) -> int:
        """No waiting request needs these hashes any more: release their pins. O(hashes)."""
        released = 0
        for block_hash in hashes:
            block = self._pinned.pop(block_hash, None)
            if block is not None:
                self.port.unpin(block)
                released += 1
        return released

    def release_all(self) -> int:
        """Release every pin (preemption pressure, prefix-cache reset, shutdown). O(pinned)."""
        blocks = list(self._pinned.values())
        self._pinned.clear()
        # Deepest pins were taken last; release them first so they are evicted first.
        for block in reversed(blocks):
            self.port.unpin(block)
        return len(blocks)
