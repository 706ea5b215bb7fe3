"""Eviction guard on a real vLLM BlockPool: MRU protection, pressure, pins and their release."""

from __future__ import annotations

import random

import pytest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    KVCacheBlock,
    get_request_block_hasher,
    init_none_hash,
)
from vllm.v1.request import Request

from prefixserving.engine.vllm import VllmBlockPoolPort
from prefixserving.peek.guard import Guard

pytestmark = pytest.mark.slow  # imports vLLM

BLOCK_SIZE = 16


def make_pool(num_blocks: int = 11) -> BlockPool:
    return BlockPool(num_gpu_blocks=num_blocks, enable_caching=True, hash_block_size=BLOCK_SIZE)


def cache_chain(pool: BlockPool, name: str, length: int) -> list[BlockHash]:
    """Run a request of ``length`` full blocks through the pool the way vLLM does: allocate,
    register its full blocks, free them (they stay cached in the LRU free queue)."""
    init_none_hash(sha256)
    tokens = random.Random(name)  # the same tokens for a name in every run (no salted hash())
    request = Request(
        request_id=name,
        prompt_token_ids=[tokens.randrange(30000) for _ in range(length * BLOCK_SIZE)],
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
    )
    blocks = pool.get_new_blocks(length)
    pool.cache_full_blocks(request, blocks, 0, length, BLOCK_SIZE, 0)
    pool.free_blocks(reversed(blocks))
    return list(request.block_hashes)


def lru_ids(port: VllmBlockPoolPort) -> list[int]:
    return [block.block_id for block, _ in port.free_lru()]


def evicted_by_allocation(pool: BlockPool, hashes: list[BlockHash], count: int) -> set[int]:
    """Allocate ``count`` blocks and return which of ``hashes`` lost their cached block."""
    before = {i for i, h in enumerate(hashes) if pool.get_cached_block(h, [0]) is not None}
    taken: list[KVCacheBlock] = pool.get_new_blocks(count)
    after = {i for i, h in enumerate(hashes) if pool.get_cached_block(h, [0]) is not None}
    pool.free_blocks(taken)
    return before - after


def test_protect_path_moves_the_cached_prefix_to_the_mru_end_parent_last() -> None:
    pool = make_pool()
    port = VllmBlockPoolPort(pool)
    needed = cache_chain(pool, "needed", 3)
    cache_chain(pool, "other", 3)
    guard = Guard(port, window_blocks=2)
    assert guard.protect_path(needed) == 3
    tail = lru_ids(port)[-3:]
    chain_blocks = [port.cached_block(h).block_id for h in needed]
    assert tail == list(reversed(chain_blocks))  # deepest first, root at the MRU end
    # Allocating all but three free blocks evicts the unneeded chain and keeps the needed one.
    free = pool.get_num_free_blocks()
    assert evicted_by_allocation(pool, needed, free - 3) == set()


def test_step_clears_the_eviction_window_and_reports_pressure() -> None:
    pool = make_pool(num_blocks=7)  # 6 usable blocks: both chains fill the pool
    port = VllmBlockPoolPort(pool)
    needed = cache_chain(pool, "needed", 3)  # older: at the LRU end
    cache_chain(pool, "other", 3)
    guard = Guard(port, window_blocks=3)
    counts = {h: 1 for h in needed}
    report = guard.step(lambda h: counts.get(h, 0))
    assert report.pressure and report.needed_in_window == 3 and report.moved == 3
    assert evicted_by_allocation(pool, needed, 3) == set()
    # Nothing needed near the LRU end any more: no pressure.
    assert not guard.step(lambda h: counts.get(h, 0)).pressure


def test_a_free_queue_shorter_than_the_window_is_pressure() -> None:
    """The step may allocate more blocks than are free: every cached block can go, needed or
    not, so the queue must reorder even though no needed block sits near the LRU end."""
    pool = make_pool(num_blocks=7)
    port = VllmBlockPoolPort(pool)
    cache_chain(pool, "other", 3)
    held = pool.get_new_blocks(4)  # running requests hold most of the pool: 2 blocks free
    report = Guard(port, window_blocks=3).step(lambda h: 0)
    assert report.needed_in_window == 0 and report.free_short and report.pressure
    pool.free_blocks(held)
    assert not Guard(port, window_blocks=3).step(lambda h: 0).pressure


def test_without_guard_the_same_allocation_evicts_the_needed_chain() -> None:
    pool = make_pool(num_blocks=7)
    needed = cache_chain(pool, "needed", 3)
    cache_chain(pool, "other", 3)
    # Control for the test above: plain LRU evicts the needed chain first.
    assert evicted_by_allocation(pool, needed, 3) == {0, 1, 2}


def test_pins_stay_within_budget_and_are_released() -> None:
    pool = make_pool(num_blocks=21)
    port = VllmBlockPoolPort(pool)
    needed = cache_chain(pool, "needed", 4)
    guard = Guard(port, window_blocks=20, pin_budget_fraction=0.1)  # 2 of 21 blocks
    counts = {h: 2 for h in needed}
    free_before = pool.get_num_free_blocks()
    report = guard.step(lambda h: counts.get(h, 0))
    assert report.pinned == 2 and guard.num_pinned == 2
    assert pool.get_num_free_blocks() == free_before - 2
    pinned = [h for h in needed if guard.is_pinned(h)]
    # Even allocating every free block cannot evict a pinned one.
    taken = pool.get_new_blocks(pool.get_num_free_blocks())
    assert all(pool.get_cached_block(h, [0]) is not None for h in pinned)
    pool.free_blocks(taken)
    assert guard.on_unneeded(pinned[:1]) == 1
    assert guard.release_all() == 1
    assert guard.num_pinned == 0 and pool.get_num_free_blocks() == free_before
    assert pool.reset_prefix_cache()  # no reference left behind


def test_requests_needed_by_one_request_are_moved_not_pinned() -> None:
    pool = make_pool(num_blocks=21)
    port = VllmBlockPoolPort(pool)
    needed = cache_chain(pool, "needed", 2)
    guard = Guard(port, window_blocks=20, pin_budget_fraction=0.5)
    report = guard.step(lambda h: 1 if h in needed else 0)
    assert report.pinned == 0 and report.moved == 2
