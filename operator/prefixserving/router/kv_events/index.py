"""Which block hashes each engine holds, from its KV cache events.

:class:`EngineBlocks` is one engine's set of block keys (``wire.block_key``), ordered by when
each was last stored: ``BlockStored`` adds (or refreshes) its blocks, ``BlockRemoved`` drops
them, ``AllBlocksCleared`` and :meth:`EngineBlocks.clear` empty the set.

**Memory bound**: at most ``max_blocks`` keys per engine; storing one more evicts the oldest
stored. An evicted block the engine still holds only costs a missed hit (the router falls back
to its rendezvous ranking), never a wrong one. Each key costs about
:data:`BYTES_PER_BLOCK` bytes (an ``OrderedDict`` entry plus its 64-bit int: 145 measured on
CPython 3.11, ``tests/test_kv_events_index.py``), so the default of
:data:`DEFAULT_MAX_BLOCKS` keys is at most about 29 MiB per engine; an engine whose KV cache holds
fewer blocks than that never reaches the bound.

:class:`KvIndex` holds one :class:`EngineBlocks` per backend id. Cost: O(blocks in the event)
per event, O(depth) per :meth:`KvIndex.cached_depth`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from prefixserving.router.kv_events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEvent,
    block_key,
    in_engine_cache,
)

DEFAULT_MAX_BLOCKS = 200_000
BYTES_PER_BLOCK = 150


class EngineBlocks:
    """The block keys one engine holds, at most ``max_blocks`` (oldest stored evicted)."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self._keys: OrderedDict[int, None] = OrderedDict()
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def apply(self, event: KvEvent) -> None:
        """Apply one event; events of an offload tier (``medium`` other than the engine's
        cache) are ignored."""
        if isinstance(event, BlockStored):
            if in_engine_cache(event.medium):
                self.store(block_key(h) for h in event.block_hashes)
        elif isinstance(event, BlockRemoved):
            if in_engine_cache(event.medium):
                for block_hash in event.block_hashes:
                    self._keys.pop(block_key(block_hash), None)
        elif isinstance(event, AllBlocksCleared):
            self.clear()

    def store(self, keys: Iterable[int]) -> None:
        """Add ``keys`` as the newest, evicting the oldest over ``max_blocks``."""
        held = self._keys
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.max_blocks:
            held.popitem(last=False)
            self.evicted += 1

    def clear(self) -> None:
        self._keys.clear()

    def depth(self, keys: Sequence[int]) -> int:
        """How many of ``keys`` (a request's chain, first block first) are held from the
        first on: the engine's cached prefix in blocks. O(depth)."""
        held = self._keys
        depth = 0
        for key in keys:
            if key not in held:
                break
            depth += 1
        return depth


class KvIndex:
    """One :class:`EngineBlocks` per backend id."""

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self._engines: dict[str, EngineBlocks] = {}

    def engine(self, backend: str) -> EngineBlocks:
        """The blocks of ``backend`` (an empty set the first time)."""
        blocks = self._engines.get(backend)
        if blocks is None:
            blocks = self._engines[backend] = EngineBlocks(self.max_blocks)
        return blocks

    def drop(self, backend: str) -> None:
        """Forget ``backend`` (it left the pool)."""
        self._engines.pop(backend, None)

    def sizes(self) -> Mapping[str, int]:
        """Blocks held per backend."""
        return {backend: len(blocks) for backend, blocks in self._engines.items()}

    def cached_depth(self, backend: str, keys: Sequence[int]) -> int:
        """Leading blocks of ``keys`` that ``backend`` holds (0 for an unknown backend)."""
        blocks = self._engines.get(backend)
        return 0 if blocks is None else blocks.depth(keys)

    def cached(self, backends: Iterable[str], keys: Sequence[int]) -> dict[str, int]:
        """``RoutingContext.cached``: for each of ``backends`` this index follows, how many
        leading blocks of ``keys`` it holds, 0 included (so that a request no engine holds is
        told apart from a router without events, which gives an empty mapping); empty when
        there are no keys. Cost: O(depth) per backend."""
        if not keys:
            return {}
        return {
            backend: self.cached_depth(backend, keys)
            for backend in backends
            if backend in self._engines
        }
