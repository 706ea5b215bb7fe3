"""The per-engine block index: events applied, the LRU bound, depth lookups, and the memory
per block that the bound in ``kv_events.index`` is stated in."""

from __future__ import annotations

import tracemalloc

import pytest

from prefixserving.router.kv_events.index import BYTES_PER_BLOCK, EngineBlocks, KvIndex
from prefixserving.router.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored


def test_events_add_refresh_and_remove_blocks() -> None:
    blocks = EngineBlocks()
    blocks.apply(BlockStored(block_hashes=[1, 2, 3], medium="GPU"))
    blocks.apply(BlockStored(block_hashes=[9], medium="CPU"))  # an offload tier: ignored
    blocks.apply(BlockRemoved(block_hashes=[2], medium="GPU"))
    blocks.apply(BlockRemoved(block_hashes=[3], medium="CPU"))  # not the engine's cache
    assert [k for k in (1, 2, 3, 9) if k in blocks] == [1, 3]
    assert blocks.depth([1, 3, 4]) == 2
    assert blocks.depth([1, 2, 3]) == 1
    assert blocks.depth([5, 1]) == 0
    blocks.apply(AllBlocksCleared())
    assert len(blocks) == 0


def test_the_bound_evicts_the_oldest_stored_block() -> None:
    blocks = EngineBlocks(max_blocks=3)
    blocks.store([1, 2, 3])
    blocks.store([1])  # stored again: now the newest
    blocks.store([4])
    assert [k for k in (1, 2, 3, 4) if k in blocks] == [1, 3, 4]
    assert blocks.evicted == 1
    with pytest.raises(ValueError, match="max_blocks"):
        EngineBlocks(max_blocks=0)


def test_cached_lists_every_followed_backend_with_its_leading_depth() -> None:
    """A followed engine holding none of the request is listed with 0 (the policy tells a
    request no engine holds from a router without events); one not followed is left out."""
    index = KvIndex()
    index.engine("a").store([1, 2])
    index.engine("b").store([2])
    assert index.cached(["a", "b", "c"], [1, 2, 3]) == {"a": 2, "b": 0}
    assert index.cached(["b"], [1, 2, 3]) == {"b": 0}
    assert index.cached(["a"], []) == {}
    index.drop("a")
    assert index.sizes() == {"b": 1}


def test_memory_per_block_is_within_the_stated_figure() -> None:
    count = 100_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        blocks = EngineBlocks(max_blocks=count)
        blocks.store((1 << 63) + i for i in range(count))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(blocks) == count
    assert used / count <= BYTES_PER_BLOCK, f"{used / count:.0f} bytes per block"
