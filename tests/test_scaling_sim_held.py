"""PEEK's held siblings in the scaling simulator: the stock queue gauge counts them, the honest
queue depth does not, and backlog seconds count their shared blocks once."""

from __future__ import annotations

from collections import deque

import pytest

from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.replica import Job, Replica, ServiceModel
from prefixserving_lab.models.scaling import ScalingSetup, SyncRecord
from prefixserving_lab.runners.scaling import flaps, run_scaling
from prefixserving_lab.workloads.conversations import BurstSchedule
from prefixserving_lab.workloads.traces import TraceRequest

BLOCK = 128
SERVICE = ServiceModel(cache_blocks=8192, block_tokens=BLOCK, max_running=64)
PREFIX_BLOCKS = 117  # 15k tokens: the pioneer prefills for about a second
# The burst lands a tenth of a second before the HPA's sync at 75 s: the pioneer is computing.
BURST_AT_S = 74.9
SIBLINGS = 49
SETUP = ScalingSetup(
    schedule=BurstSchedule(duration_s=300.0, bursts=((BURST_AT_S, BURST_AT_S + 5),)),
    service=SERVICE,
    lifecycle=PodLifecycle(load_s=30.0, hot_prefixes=0),
    min_replicas=1,
    max_replicas=6,
)


def fanout(count: int = SIBLINGS + 1) -> list[TraceRequest]:
    """A pioneer and ``count - 1`` siblings behind one long prompt, one own block each."""
    prefix = tuple(range(PREFIX_BLOCKS))
    return [
        TraceRequest(
            BURST_AT_S + i * 0.0001,
            (PREFIX_BLOCKS + 1) * BLOCK,
            20,
            (*prefix, 10_000 + i),
            BLOCK,
        )
        for i in range(count)
    ]


def replica_with_pioneer() -> Replica:
    """A replica whose pioneer prefills blocks 1-3 (block 0 was cached), with two siblings and
    one unrelated request waiting."""
    replica = Replica.create("r", SERVICE)
    replica.cache.warm((0,))
    replica.queue = deque(
        [
            Job(0, 0.0, (0, 1, 2, 3), 4 * BLOCK, 1),
            Job(1, 0.0, (0, 1, 2, 3, 4), 5 * BLOCK, 1),
            Job(2, 0.0, (0, 1, 2, 3, 5), 5 * BLOCK, 1),
            Job(3, 0.0, (0, 9), 2 * BLOCK, 1),
        ]
    )
    assert replica.try_start() is not None
    return replica


def test_siblings_are_held_while_their_pioneer_prefills() -> None:
    replica = replica_with_pioneer()
    assert replica.pioneer_blocks == {1, 2, 3}, "block 0 was cached, not computed"
    assert replica.held_siblings() == 2, "job 3 shares only the cached block 0"
    replica.prefilling = False  # the pioneer's prefill finished
    assert replica.held_siblings() == 0


def test_backlog_counts_the_pioneers_blocks_only_where_held_siblings_are_counted() -> None:
    replica = replica_with_pioneer()
    # Honest: each sibling costs its own block; job 3 its block 9.
    assert replica.uncached_waiting_tokens() == 3 * BLOCK
    # Counted: each sibling also the three blocks the pioneer computes.
    assert replica.uncached_waiting_tokens(count_held=True) == 2 * 4 * BLOCK + BLOCK


def _sync_at(outcome_syncs: tuple[SyncRecord, ...], time_s: float) -> SyncRecord:
    return next(s for s in outcome_syncs if s.time_s >= time_s)


def test_the_honest_queue_leaves_out_held_siblings_and_the_stock_gauge_counts_them() -> None:
    requests = fanout()
    honest = run_scaling(requests, SETUP, "queue", warmup=False)
    counted = run_scaling(requests, SETUP, "queue", warmup=False, held_counted=True)
    assert _sync_at(honest.syncs, BURST_AT_S).means["queue"] == 0.0
    assert _sync_at(counted.syncs, BURST_AT_S).means["queue"] == float(SIBLINGS)
    assert honest.scale_ups == 0, honest.summary()
    assert counted.scale_ups >= 1 and counted.react_s is not None, counted.summary()
    assert (honest.label, counted.label) == ("queue", "queue+held")


def test_backlog_scales_out_on_a_fanout_only_where_held_siblings_are_counted() -> None:
    requests = fanout()
    honest = run_scaling(requests, SETUP, "backlog", warmup=False)
    counted = run_scaling(requests, SETUP, "backlog", warmup=False, held_counted=True)
    s_per_token = SERVICE.prefill_s_per_token
    assert _sync_at(honest.syncs, BURST_AT_S).means["backlog"] == pytest.approx(
        SIBLINGS * BLOCK * s_per_token
    )
    assert _sync_at(counted.syncs, BURST_AT_S).means["backlog"] == pytest.approx(
        SIBLINGS * (PREFIX_BLOCKS + 1) * BLOCK * s_per_token
    )
    assert honest.scale_ups == 0 and counted.scale_ups >= 1


def test_flaps_count_scale_downs_undone_within_ten_minutes() -> None:
    syncs = [
        SyncRecord(0.0, 2, 4, 2),
        SyncRecord(100.0, 4, 3, 4),  # undone at 400
        SyncRecord(400.0, 3, 4, 3),
        SyncRecord(500.0, 4, 3, 4),  # the next scale-up comes 700 s later
        SyncRecord(1200.0, 3, 5, 3),
        SyncRecord(1300.0, 5, 4, 5),  # never undone
    ]
    assert flaps(syncs) == 1
    assert flaps(syncs, within_s=800.0) == 2
