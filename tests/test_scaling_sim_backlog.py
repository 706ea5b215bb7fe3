"""Backlog seconds in the cluster simulator: a waiting request weighs its uncached prompt
tokens, so a same-prefix burst that one replica absorbs does not scale out, while a few cold
documents do, at the first sync after they arrive."""

from __future__ import annotations

from collections import deque

from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.replica import Job, Replica, ServiceModel
from prefixserving_lab.models.scaling import ScalingSetup
from prefixserving_lab.runners.scaling import run_scaling
from prefixserving_lab.workloads.conversations import BurstSchedule
from prefixserving_lab.workloads.traces import TraceRequest

BLOCK = 128
SERVICE = ServiceModel(cache_blocks=8192, block_tokens=BLOCK, max_running=64)
# The burst lands half a second before the HPA's sync at 75 s.
BURST_AT_S = 74.5
SETUP = ScalingSetup(
    schedule=BurstSchedule(duration_s=300.0, bursts=((BURST_AT_S, BURST_AT_S + 5),)),
    service=SERVICE,
    lifecycle=PodLifecycle(load_s=30.0, hot_prefixes=0),
    min_replicas=1,
    max_replicas=6,
)


def same_prefix_burst(count: int = 50, shared_blocks: int = 31) -> list[TraceRequest]:
    """``count`` requests behind one 31-block system prompt, one own block each."""
    shared = tuple(range(shared_blocks))
    return [
        TraceRequest(
            BURST_AT_S + i * 0.001, (shared_blocks + 1) * BLOCK, 20, (*shared, 10_000 + i), BLOCK
        )
        for i in range(count)
    ]


def cold_documents(count: int = 4, blocks: int = 234) -> list[TraceRequest]:
    """``count`` unrelated 30k-token documents."""
    return [
        TraceRequest(
            BURST_AT_S + i * 0.001,
            blocks * BLOCK,
            20,
            tuple(range(100_000 * (i + 1), 100_000 * (i + 1) + blocks)),
            BLOCK,
        )
        for i in range(count)
    ]


def test_shared_blocks_are_counted_once_and_cached_ones_not_at_all() -> None:
    replica = Replica.create("r", SERVICE)
    replica.cache.warm((1, 2))
    replica.queue = deque(
        [
            Job(0, 0.0, (1, 2, 3, 4), 4 * BLOCK + 10, 1),  # 1, 2 cached; 3, 4 new; 10-token tail
            Job(1, 0.0, (1, 2, 3, 4, 5), 5 * BLOCK, 1),  # only 5 is new
            Job(2, 0.0, (7,), BLOCK, 1),
        ]
    )
    assert replica.uncached_waiting_tokens() == (2 * BLOCK + 10) + BLOCK + BLOCK


def test_a_same_prefix_burst_scales_out_on_queue_depth_but_not_on_backlog() -> None:
    requests = same_prefix_burst()
    queue = run_scaling(requests, SETUP, "queue", warmup=False)
    backlog = run_scaling(requests, SETUP, "backlog", warmup=False)
    assert queue.scale_ups >= 1, queue.summary()
    assert backlog.scale_ups == 0, backlog.summary()
    assert backlog.peak_replicas == SETUP.min_replicas < queue.peak_replicas


def test_a_few_cold_documents_scale_out_on_backlog_at_the_first_sync() -> None:
    requests = cold_documents()
    queue = run_scaling(requests, SETUP, "queue", warmup=False)
    backlog = run_scaling(requests, SETUP, "backlog", warmup=False)
    assert queue.scale_ups == 0, queue.summary()  # 3 waiting: under the target of 5
    assert backlog.react_s is not None and backlog.react_s <= SETUP.sync_s, backlog.summary()
