"""Follow every engine's KV cache events (ZMQ SUB, asyncio) into a :class:`KvIndex`.

One :class:`EngineFeed` task per backend: it subscribes to the engine's publisher
(``tcp://HOST:PORT``, the backend's host) and applies each batch to that backend's blocks, in
sequence order. The sequence numbers drive the resync:

- the first batch after subscribing, or a batch whose sequence is past the next expected one
  (ZMQ dropped messages: a slow subscriber, a reconnect): ask the engine's replay socket
  (``tcp://HOST:REPLAY_PORT``) for every batch from the first missing one, apply those
  older than the batch in hand, then that batch. If the replay does not start at the first
  missing batch (the engine's buffer of ``buffer_steps`` batches no longer has it), does not
  answer within ``replay_timeout_s``, or there is no replay port, the backend's blocks are
  cleared first: the router then falls back to its rendezvous ranking for that engine until
  new events arrive, and never routes by blocks the engine may have evicted meanwhile.
- a reconnect to the publisher, or a sequence below the expected one: the engine may have
  restarted (its counter starts at 0 again); its blocks are cleared and the replay from 0
  brings in what the engine still buffers.

:class:`KvEventSubscriptions` keeps one feed per backend of the pool: :meth:`follow` starts
feeds for new backends and stops (and forgets the blocks of) the ones that left. Each feed
records the lag of its last batch (receipt time minus the batch's ``ts``; engine and router
clocks are assumed to be in sync, as NTP keeps nodes within milliseconds) and counts its
resyncs by outcome, for the router's ``/metrics``.

Cost: one msgpack decode per batch and O(blocks) per event, on the router's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from prefixserving import constants
from prefixserving.router.kv_events import wire
from prefixserving.router.kv_events.index import EngineBlocks, KvIndex

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FeedConfig:
    """Where and how to subscribe: the engines' publisher ``port``, their ``replay_port``
    (None: no replay; every gap clears), the ``topic``, and how long a replay may take."""

    port: int = constants.KV_EVENTS_PORT
    replay_port: int | None = constants.KV_EVENTS_REPLAY_PORT
    topic: str = constants.KV_EVENTS_TOPIC
    replay_timeout_s: float = 2.0


class Resync:
    """Outcomes of a resync (the ``outcome`` label of the resync counter)."""

    REPLAYED = "replayed"  # the replay covered every missing batch
    CLEARED = "cleared"  # it did not: the backend's blocks were cleared


def _tcp(url: str, port: int) -> str:
    host = urlsplit(url).hostname
    if not host:
        raise ValueError(f"backend {url!r} has no host")
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _decode(frames: list[bytes]) -> tuple[int, wire.EventBatch]:
    """``(sequence, batch)`` of one published message ``(topic, sequence, payload)``."""
    if len(frames) != 3:
        raise wire.WireError(f"message of {len(frames)} frames, expected 3")
    return wire.decode_sequence(frames[1]), wire.decode_batch(frames[2])


class EngineFeed:
    """The event stream of one engine, applied to ``blocks`` (see the module docstring)."""

    def __init__(
        self,
        backend: str,
        blocks: EngineBlocks,
        config: FeedConfig,
        context: zmq.asyncio.Context,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.blocks = blocks
        self.config = config
        self._context = context
        self._clock = clock
        self.endpoint = _tcp(backend, config.port)
        self.replay_endpoint = (
            None if config.replay_port is None else _tcp(backend, config.replay_port)
        )
        self.expected: int | None = None  # the next sequence number
        self.batches = 0
        self.lag_s: float | None = None
        self.resyncs: dict[str, int] = {}

    def _socket(self, kind: int, endpoint: str) -> zmq.asyncio.Socket:
        """A socket for ``endpoint``, not connected yet."""
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if endpoint.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        return sock

    async def run(self) -> None:
        """Receive and apply batches until cancelled."""
        sub = self._socket(zmq.SUB, self.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        # Monitored before connecting, so that the first connection is counted too.
        monitor = zmq.Socket.shadow(sub.get_monitor_socket(zmq.EVENT_CONNECTED))
        sub.connect(self.endpoint)
        connections = 0
        try:
            while True:
                frames = await sub.recv_multipart()
                connections = self._note_reconnects(monitor, connections)
                try:
                    sequence, batch = _decode(frames)
                except wire.WireError as error:
                    log.warning("KV events of %s: %s", self.backend, error)
                    continue
                missing = self._missing(sequence)
                if missing is not None:
                    await self._resync(*missing)
                self._apply(sequence, batch)
        finally:
            sub.disable_monitor()
            monitor.close()
            sub.close()

    def _note_reconnects(self, monitor: zmq.Socket[bytes], connections: int) -> int:
        """Count the connections made to the publisher so far (ZMQ reports each one on
        ``monitor`` before any message of it arrives); after a reconnect (a restarted engine
        may have published from 0 again meanwhile) forget the sequence, so that this batch
        resyncs from 0 on cleared blocks. Returns the new count."""
        before = connections
        while monitor.poll(0):
            parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            connections += 1
        if connections > before and connections > 1:
            log.info("KV events of %s: reconnected, resyncing", self.backend)
            self.blocks.clear()
            self.expected = None
        return connections

    def _missing(self, sequence: int) -> tuple[int, int] | None:
        """``(first, until)``: the batches missing before ``sequence``, or None; clears the
        blocks when the sequence shows that the engine restarted."""
        expected = self.expected
        if expected is not None and sequence < expected:
            log.info("KV events of %s restarted at %d: clearing", self.backend, sequence)
            self.blocks.clear()
            expected = 0
        first = 0 if expected is None else expected
        return (first, sequence) if sequence > first else None

    def _apply(self, sequence: int, batch: wire.EventBatch) -> None:
        for event in batch.events:
            self.blocks.apply(event)
        self.expected = sequence + 1
        self.batches += 1
        self.lag_s = max(0.0, self._clock() - batch.ts)

    def _count(self, outcome: str) -> None:
        self.resyncs[outcome] = self.resyncs.get(outcome, 0) + 1

    async def _resync(self, start: int, until: int) -> None:
        """Apply the batches ``start..until-1`` from the replay socket; clear the blocks
        first when the replay cannot give all of them."""
        replayed = await self._replay(start) if self.replay_endpoint else None
        if replayed is None or not replayed or replayed[0][0] != start:
            log.warning(
                "KV events of %s: batches %d..%d missing and not replayed: clearing",
                self.backend,
                start,
                until - 1,
            )
            self.blocks.clear()
            self._count(Resync.CLEARED)
            replayed = replayed or []
        else:
            self._count(Resync.REPLAYED)
        for sequence, batch in replayed:
            if sequence < until:
                self._apply(sequence, batch)

    async def _replay(self, start: int) -> list[tuple[int, wire.EventBatch]] | None:
        """The buffered batches from ``start`` on, oldest first; None when the replay socket
        does not answer in time."""
        assert self.replay_endpoint is not None
        dealer = self._socket(zmq.DEALER, self.replay_endpoint)
        dealer.connect(self.replay_endpoint)
        batches: list[tuple[int, wire.EventBatch]] = []
        try:
            async with asyncio.timeout(self.config.replay_timeout_s):
                await dealer.send_multipart((b"", wire.encode_sequence(start)))
                while True:
                    frames = await dealer.recv_multipart()
                    if len(frames) != 4:
                        raise wire.WireError(f"replay message of {len(frames)} frames")
                    sequence = wire.decode_sequence(frames[2])
                    if sequence == wire.END_SEQUENCE:
                        return batches
                    batches.append((sequence, wire.decode_batch(frames[3])))
        except (TimeoutError, wire.WireError) as error:
            log.warning("KV event replay from %s failed: %r", self.replay_endpoint, error)
            return None
        finally:
            dealer.close()


class KvEventSubscriptions:
    """One :class:`EngineFeed` per backend, into ``index``; follows the pool's members."""

    def __init__(self, index: KvIndex, config: FeedConfig | None = None) -> None:
        self.index = index
        self.config = config or FeedConfig()
        self._context = zmq.asyncio.Context()
        self.feeds: dict[str, EngineFeed] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def follow(self, backends: Iterable[str]) -> None:
        """Subscribe to every backend in ``backends`` not yet followed; unsubscribe from (and
        forget the blocks of) the followed ones not in it. Needs a running event loop."""
        wanted = set(backends)
        for backend in list(self._tasks):
            if backend not in wanted:
                self._tasks.pop(backend).cancel()
                del self.feeds[backend]
                self.index.drop(backend)
        for backend in sorted(wanted - self._tasks.keys()):
            feed = EngineFeed(backend, self.index.engine(backend), self.config, self._context)
            self.feeds[backend] = feed
            self._tasks[backend] = asyncio.create_task(self._run(feed), name=f"kv-events {backend}")

    async def _run(self, feed: EngineFeed) -> None:
        try:
            await feed.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("KV events of %s stopped", feed.backend)

    async def close(self) -> None:
        """Stop every feed and close the ZMQ context."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self._context.destroy(linger=0)
