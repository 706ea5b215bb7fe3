"""Queue index: a radix tree over the block hashes of the *waiting* requests.

The engine hashes a prompt block by block with chained hashes (each hash covers the block and,
through its parent, everything before it), so a hash names a whole prefix and the tree needs
neither edge labels nor parent pointers: a node is one cacheable prefix block, and the tree is a
map from block hash to the number of waiting requests whose prompt passes through it.

**Algorithm**
1. ``insert(key, hashes)``: walk the hashes root to leaf, creating missing nodes and adding one
   to every node's count. The path is remembered under ``key``.
2. ``remove(key)``: walk the remembered path, subtract one per node and delete nodes that drop
   to zero; the hashes of deleted nodes are returned (nobody waiting needs them any more, which
   is what the eviction guard listens for).
3. ``dual_walk(hashes, is_cached)``: walk the request's path in the queue tree and in the
   engine's cache together and return how many leading blocks are cached now and how deep the
   prefix goes that at least one *other* waiting request shares.

**Invariants** (checked by property tests): a node exists iff its count is positive; a node's
count equals the number of indexed requests whose path contains it; a parent's count is at least
its child's count.

**Cost**: insert, remove and dual walk are O(blocks of the request); ``count`` and
``__contains__`` are O(1). Nothing is proportional to the queue length.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)


@dataclass(frozen=True, slots=True)
class DualWalk:
    """Result of walking one request's path in the queue tree and the engine cache together.

    ``cached_blocks``: leading blocks the engine has cached now.
    ``shared_blocks``: leading blocks at least one other waiting request also needs.
    ``total_blocks``: full blocks of the request's prompt.
    """

    cached_blocks: int
    shared_blocks: int
    total_blocks: int

    @property
    def uncached_shared_blocks(self) -> int:
        """Blocks other waiting requests need that nobody has cached yet: a cluster's work."""
        return max(0, self.shared_blocks - self.cached_blocks)


class QueueIndex(Generic[H]):
    """Radix tree over the waiting requests' block-hash paths, with per-node counts."""

    def __init__(self) -> None:
        self._counts: dict[H, int] = {}
        self._paths: dict[str, tuple[H, ...]] = {}

    def __len__(self) -> int:
        """Number of indexed requests."""
        return len(self._paths)

    def __contains__(self, key: object) -> bool:
        return key in self._paths

    @property
    def num_nodes(self) -> int:
        return len(self._counts)

    def insert(self, key: str, hashes: Sequence[H]) -> None:
        """Index a request's path. O(len(hashes)). Re-inserting a key replaces its path."""
        if key in self._paths:
            self.remove(key)
        path = tuple(hashes)
        self._paths[key] = path
        counts = self._counts
        for block_hash in path:
            counts[block_hash] = counts.get(block_hash, 0) + 1

    def remove(self, key: str) -> list[H]:
        """Drop a request's path; return the hashes no waiting request needs any more.
        O(len(path)); a key that is not indexed is ignored."""
        path = self._paths.pop(key, None)
        if path is None:
            return []
        unneeded: list[H] = []
        counts = self._counts
        for block_hash in path:
            left = counts[block_hash] - 1
            if left:
                counts[block_hash] = left
            else:
                del counts[block_hash]
                unneeded.append(block_hash)
        return unneeded

    def count(self, block_hash: H) -> int:
        """Waiting requests whose path passes through ``block_hash`` (0 if none). O(1)."""
        return self._counts.get(block_hash, 0)

    def path(self, key: str) -> tuple[H, ...]:
        """The indexed path of ``key`` (empty if not indexed)."""
        return self._paths.get(key, ())

    def keys(self) -> Iterator[str]:
        return iter(self._paths)

    def shared_depth(self, hashes: Sequence[H], *, self_indexed: bool = True) -> int:
        """Leading blocks of ``hashes`` that another waiting request also needs. When the request
        itself is indexed (``self_indexed``) a block is shared at count >= 2, else at >= 1.
        O(depth)."""
        threshold = 2 if self_indexed else 1
        depth = 0
        counts = self._counts
        for block_hash in hashes:
            if counts.get(block_hash, 0) < threshold:
                break
            depth += 1
        return depth

    def dual_walk(
        self,
        hashes: Sequence[H],
        is_cached: Callable[[H], bool],
        *,
        self_indexed: bool = True,
    ) -> DualWalk:
        """Walk ``hashes`` in the queue tree and in the engine cache together. O(blocks)."""
        cached = 0
        for block_hash in hashes:
            if not is_cached(block_hash):
                break
            cached += 1
        shared = self.shared_depth(hashes, self_indexed=self_indexed)
        return DualWalk(cached_blocks=cached, shared_blocks=shared, total_blocks=len(hashes))

    def check_invariants(self) -> None:
        """Raise AssertionError when the tree and the remembered paths disagree. O(total path
        length); for tests."""
        expected: dict[H, int] = {}
        for path in self._paths.values():
            for block_hash in path:
                expected[block_hash] = expected.get(block_hash, 0) + 1
            for parent, child in pairwise(path):
                assert self._counts[parent] >= self._counts[child], (
                    f"parent count below child at {child!r}"
                )
        assert expected == self._counts, "counts differ from the indexed paths"
