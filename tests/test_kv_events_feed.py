"""The resync decisions of one engine's feed, without sockets: which batches count as
missing, when the blocks are cleared, and that a replay short of the gap clears. The same
paths against vLLM's own publisher: ``test_kv_events_vllm_publisher.py``."""

from __future__ import annotations

import pytest
import zmq.asyncio

from prefixserving.router.kv_events.index import EngineBlocks
from prefixserving.router.kv_events.subscriber import EngineFeed, FeedConfig, Resync
from prefixserving.router.kv_events.wire import BlockStored, EventBatch


def _feed() -> EngineFeed:
    return EngineFeed(
        "http://10.0.0.1:8000", EngineBlocks(), FeedConfig(), zmq.asyncio.Context.instance()
    )


def _batch(*keys: int) -> EventBatch:
    return EventBatch(ts=0.0, events=[BlockStored(block_hashes=list(keys))])


def test_endpoints_are_the_backends_host_on_the_event_ports() -> None:
    feed = _feed()
    assert feed.endpoint == "tcp://10.0.0.1:5557"
    assert feed.replay_endpoint == "tcp://10.0.0.1:5558"


def test_missing_batches() -> None:
    feed = _feed()
    assert feed._missing(0) is None  # the first batch ever
    feed.expected = None
    assert feed._missing(5) == (0, 5)  # joined late: replay from the start
    feed.expected = 5
    assert feed._missing(5) is None
    assert feed._missing(8) == (5, 8)
    feed.blocks.store([1])
    assert feed._missing(2) == (0, 2)  # below the expected one: a restarted engine
    assert len(feed.blocks) == 0


@pytest.mark.parametrize(
    ("replayed", "outcome", "held"),
    [
        ([(5, _batch(50)), (6, _batch(60)), (7, _batch(70))], Resync.REPLAYED, {1, 50, 60}),
        ([(6, _batch(60)), (7, _batch(70))], Resync.CLEARED, {60}),  # batch 5 is gone
        (None, Resync.CLEARED, set()),  # no answer
    ],
    ids=["covered", "short", "silent"],
)
async def test_a_replay_short_of_the_gap_clears(
    monkeypatch: pytest.MonkeyPatch, replayed: list | None, outcome: str, held: set[int]
) -> None:
    feed = _feed()
    feed.blocks.store([1])
    feed.expected = 5

    async def replay(start: int) -> list | None:
        assert start == 5
        return replayed

    monkeypatch.setattr(feed, "_replay", replay)
    await feed._resync(5, 7)  # batch 7 is the one in hand: applied by the caller
    assert feed.resyncs == {outcome: 1}
    assert {k for k in (1, 50, 60, 70) if k in feed.blocks} == held
