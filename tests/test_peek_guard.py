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


def evicted_by_allocation(pool: BlockPool, hashes: list[BlockHash], count: int) -> set[int]:
    """Allocate ``count`` blocks and return which of ``hashes`` lost their cached block."""
    before = {i for i, h in enumerate(hashes) if pool.get_cached_block(h, [0]) is not None}
    taken: list[KVCacheBlock] = pool.get_new_blocks(count)
    after = {i for i, h in enumerate(hashes) if pool.get_cached_block(h, [0]) is not None}
    pool.free_blocks(taken)
    return before - after


def test_step_protects_the_plan_in_the_eviction_window_and_reports_pressure() -> None:
    pool = make_pool(num_blocks=7)  # 6 usable blocks: both chains fill the pool
    port = VllmBlockPoolPort(pool)
    planned = cache_chain(pool, "planned", 3)  # older: at the LRU end
    cache_chain(pool, "other", 3)
    guard = Guard(port, window_blocks=3)
    report = guard.step(dict.fromkeys(planned, 0))
    assert report.pressure and report.needed_in_window == 3 and report.moved == 3
    assert evicted_by_allocation(pool, planned, 3) == set()
    # Nothing planned near the LRU end any more: no pressure.
    assert not guard.step(dict.fromkeys(planned, 0)).pressure


def test_the_next_pick_is_evicted_last() -> None:
    """Two planned chains in the window: the better-ranked one ends at the MRU end, so an
    allocation that must evict one of them takes the later pick's blocks."""
    pool = make_pool(num_blocks=7)
    port = VllmBlockPoolPort(pool)
    first = cache_chain(pool, "first", 3)
    later = cache_chain(pool, "later", 3)
    guard = Guard(port, window_blocks=6)
    rank = {**dict.fromkeys(later, 1), **dict.fromkeys(first, 0)}
    assert guard.step(rank).moved == 6
    taken = pool.get_new_blocks(3)
    assert all(pool.get_cached_block(h, [0]) is not None for h in first)
    assert all(pool.get_cached_block(h, [0]) is None for h in later)
    pool.free_blocks(taken)


def test_a_block_only_a_later_request_needs_is_not_protected() -> None:
    """The guard protects what the plan reads, not every block a waiting request touches."""
    pool = make_pool(num_blocks=7)
    port = VllmBlockPoolPort(pool)
    unplanned = cache_chain(pool, "unplanned", 3)
    cache_chain(pool, "other", 3)
    report = Guard(port, window_blocks=3).step({})
    assert report.needed_in_window == 0 and report.moved == 0
    assert evicted_by_allocation(pool, unplanned, 3) == {0, 1, 2}


def test_a_free_queue_shorter_than_the_window_is_pressure() -> None:
    """The step may allocate more blocks than are free: every cached block can go, planned or
    not, so the lanes must reorder even though no planned block sits near the LRU end."""
    pool = make_pool(num_blocks=7)
    port = VllmBlockPoolPort(pool)
    cache_chain(pool, "other", 3)
    held = pool.get_new_blocks(4)  # running requests hold most of the pool: 2 blocks free
    report = Guard(port, window_blocks=3).step({})
    assert report.needed_in_window == 0 and report.free_short and report.pressure
    pool.free_blocks(held)
    assert not Guard(port, window_blocks=3).step({}).pressure


def test_without_guard_the_same_allocation_evicts_the_planned_chain() -> None:
    pool = make_pool(num_blocks=7)
    planned = cache_chain(pool, "planned", 3)
    cache_chain(pool, "other", 3)
    # Control for the tests above: plain LRU evicts the older chain first.
    assert evicted_by_allocation(pool, planned, 3) == {0, 1, 2}


def planned_at_the_lru_end(copies: int = 1) -> tuple[BlockPool, list[BlockHash]]:
    """A pool of 20 usable blocks, all free and cached: ``copies`` copies of a 4-block planned
    chain at the LRU end (vLLM caches a second copy when two requests compute a block in the
    same step), then other chains."""
    pool = make_pool(num_blocks=21)
    planned = cache_chain(pool, "planned", 4)
    for _ in range(copies - 1):
        assert cache_chain(pool, "planned", 4) == planned
    cache_chain(pool, "other", 20 - 4 * copies)
    return pool, planned


def test_pins_stay_within_budget_last_one_step_and_are_released() -> None:
    pool, planned = planned_at_the_lru_end()
    guard = Guard(VllmBlockPoolPort(pool), window_blocks=4, pin_budget_fraction=0.1)  # 2 of 21
    free_before = pool.get_num_free_blocks()
    report = guard.step(dict.fromkeys(planned, 0))
    assert report.pinned == 2 and guard.num_pinned == 2 and report.moved == 2
    assert pool.get_num_free_blocks() == free_before - 2
    pinned = [h for h in planned if guard.is_pinned(h)]
    # Even allocating every free block cannot evict a pinned one.
    taken = pool.get_new_blocks(pool.get_num_free_blocks())
    assert all(pool.get_cached_block(h, [0]) is not None for h in pinned)
    pool.free_blocks(taken)
    assert guard.release_all() == 2
    assert guard.num_pinned == 0 and pool.get_num_free_blocks() == free_before
    assert pool.reset_prefix_cache()  # no reference left behind


def test_pins_leave_free_what_one_step_can_allocate() -> None:
    """A pin never takes a block a running request may need this step (it would be
    preempted, and the next step would pin the blocks it freed again)."""
    pool, planned = planned_at_the_lru_end()
    guard = Guard(VllmBlockPoolPort(pool), window_blocks=18, pin_budget_fraction=0.5)
    report = guard.step(dict.fromkeys(planned, 0))
    assert report.pinned == 2 and pool.get_num_free_blocks() == 18
    assert report.moved == 2  # the rest of the plan is still protected by LRU order


def test_a_block_cached_twice_is_pinned_once_and_every_pin_is_released() -> None:
    """One pin per prefix hash covers both copies; a second pin under one key was never
    released, and the block leaked."""
    pool, planned = planned_at_the_lru_end(copies=2)
    guard = Guard(VllmBlockPoolPort(pool), window_blocks=4, pin_budget_fraction=1.0)
    free_before = pool.get_num_free_blocks()
    report = guard.step(dict.fromkeys(planned, 0))
    assert report.needed_in_window == 8 and report.pinned == 4
    assert len({block.block_id for block in guard.pinned_blocks}) == 4
    assert guard.release_all() == 4 and pool.get_num_free_blocks() == free_before
    assert pool.reset_prefix_cache()  # no reference left behind


@pytest.mark.parametrize("pin", [True, False])
def test_a_step_told_not_to_pin_only_moves(pin: bool) -> None:
    pool, planned = planned_at_the_lru_end()
    guard = Guard(VllmBlockPoolPort(pool), window_blocks=4, pin_budget_fraction=0.5)
    report = guard.step(dict.fromkeys(planned, 0), pin=pin)
    assert (report.pinned, report.moved) == ((4, 0) if pin else (0, 4))


def test_the_ports_probe_answers_as_get_cached_block() -> None:
    """The queue's one-lookup probe agrees with vLLM's own ``get_cached_block`` while blocks
    are cached, cached twice under one hash (the map then holds a dict), evicted, taken, and
    after a prefix-cache reset (vLLM replaces the map)."""
    pool = make_pool(num_blocks=9)  # 8 usable blocks
    port = VllmBlockPoolPort(pool)
    first = cache_chain(pool, "first", 4)
    assert cache_chain(pool, "first", 4) == first  # the same tokens: a second block per hash
    stored = pool.cached_block_hash_to_block._cache
    assert any(isinstance(blocks, dict) for blocks in stored.values())
    unknown = [BlockHash(b"not a block hash")]

    def agree(hashes: list[BlockHash]) -> None:
        for block_hash in hashes:
            expected = pool.get_cached_block(block_hash, [0]) is not None
            assert port.is_cached(block_hash) == expected

    agree(first + unknown)
    later = cache_chain(pool, "later", 4)  # evicts four blocks from the LRU end
    agree(first + later + unknown)
    assert all(port.is_cached(h) for h in later) and not port.is_cached(unknown[0])
    taken = pool.get_new_blocks(3)
    agree(first + later)
    pool.free_blocks(taken)
    assert pool.reset_prefix_cache()
    agree(first + later)
    assert not any(port.is_cached(h) for h in first + later)


def leading_cached(pool: BlockPool, hashes: list[BlockHash]) -> int:
    """How many of ``hashes`` a prefix lookup hits: it stops at the first uncached block."""
    for i, block_hash in enumerate(hashes):
        if pool.get_cached_block(block_hash, [0]) is None:
            return i
    return len(hashes)


@pytest.mark.parametrize("with_prefix", [True, False], ids=["prefix-moves", "window-only"])
def test_a_chain_that_fills_the_lru_end_is_evicted_from_its_end(with_prefix: bool) -> None:
    """A planned chain fills the free queue and each step allocates a block (decodes grow).
    Moving its blocks with their prefix keeps it a chain: eviction takes its last blocks, and a
    lookup still hits every block left. Moving only the window's blocks (control) rotates the
    chain, and eviction soon takes a block from its middle: the blocks after it stay cached but
    a lookup cannot reach them."""
    pool = make_pool(num_blocks=42)  # 41 usable: the chain and one spare block
    port = VllmBlockPoolPort(pool)
    chain = cache_chain(pool, "planned", 40)
    guard = Guard(port, window_blocks=2)
    rank = dict.fromkeys(chain, 0)
    taken: list[KVCacheBlock] = []
    for _ in range(12):
        guard.step(rank, 2, (lambda _: chain) if with_prefix else None)
        taken += pool.get_new_blocks(1)
    cached = sum(pool.get_cached_block(h, [0]) is not None for h in chain)
    assert cached == 29  # one spare block, then one block of the chain per step
    if with_prefix:
        assert leading_cached(pool, chain) == cached
    else:
        assert leading_cached(pool, chain) < cached
    pool.free_blocks(taken)
