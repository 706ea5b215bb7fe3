"""The simulated replica: block cache (pinning, LRU eviction, prefix hits) and service times."""

from __future__ import annotations

import pytest

from prefixserving_lab.models.replica import BlockCache, Job, Replica, ServiceModel


def test_hits_count_only_the_leading_run_of_cached_blocks() -> None:
    cache = BlockCache(8)
    cache.release(cache.pin((1, 2, 3), 0), 0)
    assert cache.hit_blocks((1, 2, 3, 4)) == 3
    assert cache.hit_blocks((1, 9, 3)) == 1
    assert cache.hit_blocks((9, 1, 2)) == 0


def test_lru_evicts_the_least_recently_released_block() -> None:
    cache = BlockCache(4)
    cache.release(cache.pin((1, 2), 0), 0)
    cache.release(cache.pin((3, 4), 0), 0)
    cache.release(cache.pin((1,), 0), 0)  # 1 is now the most recently used
    cache.release(cache.pin((5, 6), 0), 0)  # evicts 2 then 3
    assert 1 in cache and 4 in cache and 5 in cache and 6 in cache
    assert 2 not in cache and 3 not in cache


def test_pinned_blocks_are_never_evicted_and_count_as_kv_usage() -> None:
    cache = BlockCache(4)
    pinned = cache.pin((1, 2), 1)
    assert cache.kv_usage == pytest.approx(0.75)
    assert not cache.fits((7, 8), 0)
    assert cache.fits((1, 2), 1)  # shares the pinned blocks: only the output block is new
    cache.release(pinned, 1)
    assert cache.kv_usage == 0.0
    assert cache.fits((7, 8, 9, 10), 0)
    cache.release(cache.pin((7, 8, 9, 10), 0), 0)
    assert 1 not in cache and 2 not in cache


def test_request_larger_than_the_cache_runs_alone_and_caches_what_fits() -> None:
    cache = BlockCache(3)
    assert cache.fits((1, 2, 3, 4, 5), 0)
    assert cache.pin((1, 2, 3, 4, 5), 0) == (1, 2, 3)


def test_warm_inserts_evictable_blocks_and_keeps_the_leading_ones() -> None:
    cache = BlockCache(2)
    cache.warm((1, 2, 3))
    assert cache.hit_blocks((1, 2, 3)) == 2
    assert cache.kv_usage == 0.0


def test_prefill_time_charges_only_uncached_tokens() -> None:
    model = ServiceModel(prefill_s_per_token=0.001, prefill_overhead_s=0.01, block_tokens=4)
    replica = Replica.create("r", model)
    replica.cache.warm((11, 12))
    replica.queue.append(Job(0, 0.0, (11, 12, 13), input_tokens=10, output_tokens=1))
    started = replica.try_start()
    assert started is not None
    job, duration = started
    assert job.hit_tokens == 8
    assert duration == pytest.approx(0.01 + 2 * 0.001)
    assert replica.try_start() is None  # one prefill at a time


def test_head_of_line_waits_for_kv_room() -> None:
    model = ServiceModel(cache_blocks=4, block_tokens=4, max_running=8)
    replica = Replica.create("r", model)
    replica.queue.append(Job(0, 0.0, (1, 2, 3), input_tokens=12, output_tokens=1))
    replica.queue.append(Job(1, 0.0, (4, 5), input_tokens=8, output_tokens=1))
    first = replica.try_start()
    assert first is not None
    replica.prefilling = False
    assert replica.try_start() is None  # 3 + 1 output blocks pinned, no room for 2 more
    replica.finish(first[0])
    assert replica.try_start() is not None
