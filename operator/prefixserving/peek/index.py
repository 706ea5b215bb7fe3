"""Queue index: the prefix tree of the waiting requests' *uncached* blocks, with counts.

The engine hashes a prompt block by block with chained hashes (each hash covers its block and,
through its parent, everything before it), so a hash names a whole prefix: the tree's node for a
prefix is its last block's hash, and parent and child links are implicit in each request's own
hash sequence. Every question PEEK asks walks one request's own path (how many others need the
next block, how deep the shared part goes), so a map from hash to count answers exactly what a
linked radix tree would, at the same O(path) cost, without the links.

Each waiting request is indexed with its **frontier**: the number of its leading blocks the
engine has cached now. Only blocks at or beyond the frontier count, so a node's count is the
number of waiting requests that still have to compute that block, and:

* the **cluster** of a request is the run of blocks from its frontier on that two or more
  waiting requests need (:meth:`QueueIndex.shared_blocks`): computing it once serves them all;
* ``num_nodes`` is that distinct uncached work in blocks (the autoscaler's backlog signal);
* ``has_reuse``: some waiting request has a cached prefix, or two share their first uncached
  block: only then can the order of the queue save prefill work (two counters kept as requests
  enter and leave their frontier).

**Algorithm**
1. ``insert(key, hashes, frontier)``: add one to the count of every block at or beyond the
   frontier; remember the request under its frontier block (``at(block)``).
2. ``move_frontier(key, frontier)``: blocks became cached (frontier forward: their counts drop)
   or were evicted (backward: they count again).
3. ``remove(key)``: subtract the request's remaining uncached blocks.

**Invariants** (property tests recount them from scratch): a node exists iff its count is
positive; a node's count is the number of indexed requests whose path holds that block at or
beyond their frontier; ``at(h)`` holds exactly the requests whose frontier block is ``h``.

**Cost**: insert, remove and a frontier move are O(blocks moved); ``count`` and ``at`` are O(1);
``shared_blocks`` is O(uncached blocks of the request). Nothing is proportional to the queue
length.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)


class QueueIndex(Generic[H]):
    """Counts of the waiting requests' uncached blocks; see the module docstring."""

    def __init__(self) -> None:
        self._counts: dict[H, int] = {}
        self._paths: dict[str, tuple[H, ...]] = {}
        self._frontier: dict[str, int] = {}
        self._at: dict[H, set[str]] = {}
        self._with_cached_prefix = 0  # requests whose frontier is past their first block
        self._clusters = 0  # frontier blocks that two or more requests need next

    def __len__(self) -> int:
        """Indexed requests."""
        return len(self._paths)

    def __contains__(self, key: object) -> bool:
        return key in self._paths

    def keys(self) -> Iterator[str]:
        return iter(self._paths)

    @property
    def num_nodes(self) -> int:
        """Distinct blocks some waiting request still has to compute."""
        return len(self._counts)

    @property
    def has_cached_prefix(self) -> bool:
        """Whether some waiting request has cached leading blocks (frontier > 0). O(1)."""
        return self._with_cached_prefix > 0

    @property
    def has_reuse(self) -> bool:
        """Whether a waiting request has a cached prefix or shares its next block. O(1)."""
        return self.has_cached_prefix or self._clusters > 0

    def count(self, block_hash: H) -> int:
        """Waiting requests that still have to compute ``block_hash`` (0 if none). O(1)."""
        return self._counts.get(block_hash, 0)

    def path(self, key: str) -> tuple[H, ...]:
        """All full-block hashes of ``key`` (empty if not indexed)."""
        return self._paths.get(key, ())

    def frontier(self, key: str) -> int:
        """Leading blocks of ``key`` that were cached when last looked at."""
        return self._frontier.get(key, 0)

    def at(self, block_hash: H) -> set[str]:
        """Requests whose first uncached block is ``block_hash`` (a live view; do not keep)."""
        return self._at.get(block_hash, _EMPTY)

    def insert(self, key: str, hashes: Sequence[H], frontier: int) -> None:
        """Index a request whose first ``frontier`` blocks are cached. Re-inserting a key
        replaces it. O(uncached blocks)."""
        if key in self._paths:
            self.remove(key)
        path = tuple(hashes)
        frontier = min(max(frontier, 0), len(path))
        self._paths[key] = path
        self._frontier[key] = frontier
        self._count(path[frontier:])
        self._enter(key, path, frontier)

    def move_frontier(self, key: str, frontier: int) -> None:
        """``key``'s cached prefix is now ``frontier`` blocks long. O(blocks moved)."""
        path = self._paths[key]
        old = self._frontier[key]
        frontier = min(max(frontier, 0), len(path))
        if frontier == old:
            return
        self._leave(key, path, old)
        if frontier > old:
            self._uncount(path[old:frontier])
        else:
            self._count(path[frontier:old])
        self._frontier[key] = frontier
        self._enter(key, path, frontier)

    def remove(self, key: str) -> None:
        """Drop a request; a key that is not indexed is ignored. O(uncached blocks)."""
        path = self._paths.pop(key, None)
        if path is None:
            return
        frontier = self._frontier.pop(key)
        self._leave(key, path, frontier)
        self._uncount(path[frontier:])

    def shared_blocks(self, key: str) -> int:
        """Uncached blocks from ``key``'s frontier on that another waiting request also needs:
        the depth of its cluster. O(depth)."""
        path, depth = self._paths.get(key, ()), 0
        counts = self._counts
        for block_hash in path[self._frontier.get(key, 0) :]:
            if counts.get(block_hash, 0) < 2:
                break
            depth += 1
        return depth

    def check_invariants(self) -> None:
        """Raise AssertionError when the counts or the frontier sets differ from a recount.
        O(total path length); for tests."""
        counts: dict[H, int] = {}
        at: dict[H, set[str]] = {}
        for key, path in self._paths.items():
            frontier = self._frontier[key]
            for block_hash in path[frontier:]:
                counts[block_hash] = counts.get(block_hash, 0) + 1
            if frontier < len(path):
                at.setdefault(path[frontier], set()).add(key)
        assert counts == self._counts, "counts differ from a recount of the uncached paths"
        assert at == self._at, "frontier sets differ from a recount"
        assert self._with_cached_prefix == sum(1 for f in self._frontier.values() if f > 0)
        assert self._clusters == sum(1 for members in at.values() if len(members) > 1)

    def _enter(self, key: str, path: tuple[H, ...], frontier: int) -> None:
        if frontier > 0:
            self._with_cached_prefix += 1
        if frontier < len(path):
            members = self._at.setdefault(path[frontier], set())
            members.add(key)
            if len(members) == 2:
                self._clusters += 1

    def _leave(self, key: str, path: tuple[H, ...], frontier: int) -> None:
        if frontier > 0:
            self._with_cached_prefix -= 1
        if frontier < len(path):
            members = self._at[path[frontier]]
            if len(members) == 2 and key in members:
                self._clusters -= 1
            members.discard(key)
            if not members:
                del self._at[path[frontier]]

    def _count(self, blocks: tuple[H, ...]) -> None:
        counts = self._counts
        for block_hash in blocks:
            counts[block_hash] = counts.get(block_hash, 0) + 1

    def _uncount(self, blocks: tuple[H, ...]) -> None:
        counts = self._counts
        for block_hash in blocks:
            left = counts[block_hash] - 1
            if left:
                counts[block_hash] = left
            else:
                del counts[block_hash]


_EMPTY: set[str] = set()
