"""The router's KV event feed against vLLM's own publisher (``ZmqEventPublisher``, the code a
real engine runs): decoding, the replay after joining late or after a gap, clearing when the
replay cannot cover a gap, and an engine restart. Imports vLLM, hence slow."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from prefixserving.router.kv_events.index import KvIndex
from prefixserving.router.kv_events.subscriber import FeedConfig, KvEventSubscriptions, Resync
from prefixserving.router.kv_events.wire import block_key
from prefixserving_lab.runners.stack.processes import free_port

pytestmark = pytest.mark.slow

kv_events = pytest.importorskip("vllm.distributed.kv_events")
TOPIC = "kv-events"
BACKEND_HOST = "127.0.0.1"
DEADLINE_S = 20.0
# Batches the publisher keeps for replay in the gap test: more than one gap plus the empty
# batches a feed may miss while it joins, fewer than the other gap.
BUFFER_STEPS = 8


def _stored(*hashes: int | bytes) -> object:
    return kv_events.BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=list(range(16 * len(hashes))),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )


def _removed(*hashes: int) -> object:
    return kv_events.BlockRemoved(block_hashes=list(hashes), medium="GPU")


class Engine:
    """A vLLM publisher as an engine runs it, on free loopback ports."""

    def __init__(self, buffer_steps: int = 10_000) -> None:
        self.port, self.replay_port = free_port(), free_port()
        self.buffer_steps = buffer_steps
        self.publisher = self._start()

    def _start(self) -> object:
        return kv_events.ZmqEventPublisher(
            data_parallel_rank=0,
            endpoint=f"tcp://*:{self.port}",
            replay_endpoint=f"tcp://*:{self.replay_port}",
            buffer_steps=self.buffer_steps,
            topic=TOPIC,
        )

    @property
    def backend(self) -> str:
        return f"http://{BACKEND_HOST}:8000"

    def publish(self, *events: object) -> None:
        self.publisher.publish(kv_events.KVEventBatch(ts=time.time(), events=list(events)))

    def flush(self) -> None:
        """Wait until every published batch went out on the socket (and into the buffer)."""
        self.publisher._event_queue.join()

    def restart(self) -> None:
        """A new publisher on the same ports (retried until the old one has let them go)."""
        import zmq

        self.publisher.shutdown()
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                self.publisher = self._start()
                return
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.fixture
def engine() -> Iterator[Engine]:
    started = Engine()
    yield started
    started.publisher.shutdown()


@contextlib.asynccontextmanager
async def following(engine: Engine, index: KvIndex) -> AsyncIterator[KvEventSubscriptions]:
    config = FeedConfig(port=engine.port, replay_port=engine.replay_port, topic=TOPIC)
    subscriptions = KvEventSubscriptions(index, config)
    subscriptions.follow([engine.backend])
    try:
        yield subscriptions
    finally:
        await subscriptions.close()


async def until(condition: Callable[[], bool], what: str, within_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.01)


async def joined(engine: Engine, subscriptions: KvEventSubscriptions) -> None:
    """Publish an empty batch every 0.2 s until the feed has received one (a ZMQ subscriber
    joins some time after it connects, and misses what was published before)."""
    feed = subscriptions.feeds[engine.backend]
    seen = feed.batches
    deadline = time.monotonic() + DEADLINE_S
    while feed.batches == seen:
        assert time.monotonic() < deadline, "the feed received nothing"
        engine.publish()
        with contextlib.suppress(AssertionError):
            await until(lambda: feed.batches > seen, "a batch", within_s=0.2)


async def converged(engine: Engine, condition: Callable[[], bool], what: str) -> None:
    """Publish an empty batch every 0.2 s until ``condition`` holds."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        engine.publish()
        with contextlib.suppress(AssertionError):
            await until(condition, what, within_s=0.2)


async def test_a_late_subscriber_replays_what_it_missed_and_follows_removals(
    engine: Engine,
) -> None:
    engine.publish(_stored(1, 2, 3))  # before anyone subscribed
    engine.publish(_removed(2), _stored(b"\x00" * 24 + (4).to_bytes(8, "big")))
    engine.flush()
    index = KvIndex()
    async with following(engine, index) as subscriptions:
        await joined(engine, subscriptions)
        blocks = index.engine(engine.backend)
        assert {k for k in (1, 2, 3, 4) if k in blocks} == {1, 3, 4}
        feed = subscriptions.feeds[engine.backend]
        assert feed.resyncs == {Resync.REPLAYED: 1}
        assert feed.lag_s is not None and feed.lag_s < DEADLINE_S
        assert index.cached_depth(engine.backend, [1, 3, 4]) == 3
        assert index.cached_depth(engine.backend, [1, 2, 3]) == 1

        engine.publish(kv_events.AllBlocksCleared())
        await until(lambda: len(blocks) == 0, "AllBlocksCleared empties the engine's blocks")


async def test_a_gap_is_replayed_and_a_gap_past_the_buffer_clears() -> None:
    engine = Engine(buffer_steps=BUFFER_STEPS)
    index = KvIndex()
    try:
        async with following(engine, index) as subscriptions:
            await joined(engine, subscriptions)
            feed = subscriptions.feeds[engine.backend]
            blocks = index.engine(engine.backend)
            engine.publish(_stored(10, 11))
            await until(lambda: 11 in blocks, "the stored blocks")
            resumed_at = feed.expected

            # Unsubscribed while the engine publishes two batches: the buffer covers them.
            subscriptions.follow([])
            subscriptions.follow([engine.backend])  # a new feed, same blocks (a new index entry)
            feed = subscriptions.feeds[engine.backend]
            blocks = index.engine(engine.backend)
            assert len(blocks) == 0  # leaving the pool forgot them
            feed.expected = resumed_at  # what the previous feed had: resume from there
            blocks.store([10, 11])
            engine.publish(_removed(10))
            engine.publish(_stored(12))
            engine.flush()  # sent before the new feed subscribes: it misses them
            await joined(engine, subscriptions)
            assert feed.resyncs == {Resync.REPLAYED: 1}
            assert [k for k in (10, 11, 12) if k in blocks] == [11, 12]

            # A gap of twelve batches, past the buffer: the blocks are cleared.
            resumed_at = feed.expected
            subscriptions.follow([])
            subscriptions.follow([engine.backend])
            feed = subscriptions.feeds[engine.backend]
            blocks = index.engine(engine.backend)
            feed.expected = resumed_at
            blocks.store([11, 12])
            for key in range(20, 32):
                engine.publish(_stored(key))
            engine.flush()
            await joined(engine, subscriptions)
            assert feed.resyncs == {Resync.CLEARED: 1}
            assert 11 not in blocks and 12 not in blocks  # possibly evicted meanwhile: gone
            assert 31 in blocks  # the replayed tail still counts
    finally:
        engine.publisher.shutdown()


async def test_an_engine_restart_clears_its_blocks(engine: Engine) -> None:
    index = KvIndex()
    async with following(engine, index) as subscriptions:
        await joined(engine, subscriptions)
        blocks = index.engine(engine.backend)
        engine.publish(_stored(*range(100, 110)))
        await until(lambda: 109 in blocks, "the stored blocks")
        engine.restart()  # its sequence starts at 0 again
        engine.publish(_stored(200))
        # The feed notices the reconnect (before or after the first batch of the new engine
        # arrives) and resyncs from 0: the old engine's blocks go, the new one's come.
        await converged(
            engine,
            lambda: 200 in blocks and not any(key in blocks for key in range(100, 110)),
            "the restarted engine's blocks only",
        )


def test_block_keys_match_the_events_int_conversion() -> None:
    from vllm.v1.core.kv_cache_utils import BlockHash, maybe_convert_block_hash

    digest = bytes(range(32))
    assert block_key(maybe_convert_block_hash(BlockHash(digest))) == block_key(digest)
