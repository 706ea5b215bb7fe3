"""One simulated engine replica: a block prefix cache and a service-time model.

**Cache** (:class:`BlockCache`): ``capacity`` KV blocks shared, as in vLLM, by the running
requests and the prefix cache. Blocks of running requests are pinned (reference counted);
when a request finishes its blocks become evictable and most recently used; a new block
evicts the least recently used evictable block. A request hits the longest run of leading
blocks present (pinned or evictable). Decode output takes anonymous pinned blocks that are
never reused. ``kv_usage`` = pinned / capacity, like ``vllm:kv_cache_usage_perc``. An
optional ``on_change(block, stored)`` hears every block that enters (``stored`` true) or leaves
the cache, like vLLM's ``BlockStored`` and ``BlockRemoved`` KV cache events.

**Service** (:class:`ServiceModel`): requests wait in one FIFO queue. The head starts when the
prefill server is idle, fewer than ``max_running`` requests run and its blocks fit beside
the pinned ones (head-of-line blocking, like vLLM's FCFS scheduler). Prefill takes
``prefill_overhead_s + uncached_tokens * prefill_s_per_token`` on one server per replica (the
compute-bound phase); TTFT ends with it. Decode then runs beside other requests for
``output_tokens * decode_s_per_token`` (the memory-bound phase, batched). A request larger
than the whole cache is admitted when the replica is empty and caches what fits.

**Held siblings** (PEEK's holding, modelled minimally): a request's blocks enter the cache when
its prefill starts, so a waiting request that shares blocks with the request in prefill (its
*pioneer*) hits them once it starts, and is *held* while the pioneer computes them
(:meth:`Replica.held_siblings`): the stock ``vllm:num_requests_waiting`` counts it, the honest
queue depth does not, and :meth:`Replica.uncached_waiting_tokens` counts its shared blocks once.
Left out: PEEK's maximum sibling wait and lanes (a held sibling here waits exactly as long as
the FIFO makes it), the batching of released siblings into one engine step (each still pays
``prefill_overhead_s``), and the recomputation a stock engine does for siblings that start
before their pioneer finishes: only the gauges differ between a PEEK and a stock replica.

Defaults model an 8B model on one H100-class GPU with 512-token blocks: about 15k prefill
tokens/s, 20 ms per output token, 64 concurrent sequences, 2,048 blocks (1M tokens of KV).

Cost: O(blocks of the request) per admission and per release.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from prefixserving_lab.workloads.traces import MOONCAKE_BLOCK_TOKENS


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Per-replica capacity and speed (see the module docstring)."""

    prefill_s_per_token: float = 1.0 / 15000.0
    prefill_overhead_s: float = 0.005
    decode_s_per_token: float = 0.020
    max_running: int = 64
    cache_blocks: int = 2048
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.cache_blocks < 1 or self.max_running < 1 or self.block_tokens < 1:
            raise ValueError("cache_blocks, max_running and block_tokens must be at least 1")

    def prefill_s(self, uncached_tokens: int) -> float:
        return self.prefill_overhead_s + uncached_tokens * self.prefill_s_per_token


class BlockCache:
    """Pinned and evictable KV blocks with LRU eviction (see the module docstring)."""

    def __init__(self, capacity: int, on_change: Callable[[int, bool], None] | None = None) -> None:
        self.capacity = capacity
        self.on_change = on_change
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._pinned: dict[int, int] = {}
        self._anonymous = 0

    @property
    def pinned(self) -> int:
        return len(self._pinned) + self._anonymous

    @property
    def cached(self) -> int:
        """Blocks holding prefix content (pinned or evictable)."""
        return len(self._pinned) + len(self._evictable)

    @property
    def kv_usage(self) -> float:
        return self.pinned / self.capacity

    def __contains__(self, block: int) -> bool:
        return block in self._pinned or block in self._evictable

    def hit_blocks(self, blocks: tuple[int, ...]) -> int:
        """Length of the leading run of ``blocks`` that is cached."""
        for i, block in enumerate(blocks):
            if block not in self:
                return i
        return len(blocks)

    def fits(self, blocks: tuple[int, ...], anonymous: int) -> bool:
        """Whether pinning these blocks leaves the pinned total within capacity."""
        new = sum(1 for b in blocks if b not in self._pinned)
        return self.pinned + new + anonymous <= self.capacity or self.pinned == 0

    def pin(self, blocks: tuple[int, ...], anonymous: int) -> tuple[int, ...]:
        """Pin ``blocks`` (inserting missing ones) and ``anonymous`` blocks; returns the blocks
        actually pinned (all of them unless the request is larger than the cache)."""
        pinned: list[int] = []
        for block in blocks:
            if block in self._pinned:
                self._pinned[block] += 1
            elif block in self._evictable:
                del self._evictable[block]
                self._pinned[block] = 1
            elif self._make_room():
                self._pinned[block] = 1
                self._changed(block, True)
            else:
                break
            pinned.append(block)
        for _ in range(anonymous):
            self._make_room()
            self._anonymous += 1
        return tuple(pinned)

    def release(self, blocks: tuple[int, ...], anonymous: int) -> None:
        """Unpin; blocks no longer pinned become the most recently used evictable ones."""
        for block in blocks:
            count = self._pinned[block] - 1
            if count:
                self._pinned[block] = count
            else:
                del self._pinned[block]
                self._evictable[block] = None
        self._anonymous -= anonymous

    def warm(self, blocks: tuple[int, ...]) -> None:
        """Insert blocks as evictable (a pre-warmed replica) while free room lasts; never
        evicts, so a long warm-up keeps its leading blocks."""
        for block in blocks:
            if block in self:
                continue
            if self.cached + self._anonymous >= self.capacity:
                return
            self._evictable[block] = None
            self._changed(block, True)

    def _make_room(self) -> bool:
        if self.cached + self._anonymous < self.capacity:
            return True
        if not self._evictable:
            return False
        block, _ = self._evictable.popitem(last=False)
        self._changed(block, False)
        return True

    def _changed(self, block: int, stored: bool) -> None:
        if self.on_change is not None:
            self.on_change(block, stored)


@dataclass(slots=True)
class Job:
    """A request on a replica."""

    index: int
    arrival_s: float
    blocks: tuple[int, ...]
    input_tokens: int
    output_tokens: int
    hit_tokens: int = 0
    # Set when routed: the most of the prompt any Ready replica held cached then.
    fleet_hit_tokens: int = 0
    pinned: tuple[int, ...] = ()
    anonymous: int = 0


@dataclass(slots=True)
class ReplicaStats:
    """Totals of one replica over a run."""

    routed: int = 0
    input_tokens: int = 0
    hit_tokens: int = 0
    prefill_busy_s: float = 0.0


@dataclass(slots=True)
class Replica:
    """Queue, running set and cache of one replica; the cluster's event loop drives it."""

    name: str
    model: ServiceModel
    cache: BlockCache
    queue: deque[Job] = field(default_factory=deque)
    running: int = 0
    prefilling: bool = False
    ready: bool = False
    draining: bool = False
    # Blocks the request in prefill computes (not cached when it started); meaningful while
    # ``prefilling``.
    pioneer_blocks: frozenset[int] = frozenset()
    stats: ReplicaStats = field(default_factory=ReplicaStats)

    @classmethod
    def create(
        cls,
        name: str,
        model: ServiceModel,
        on_change: Callable[[int, bool], None] | None = None,
    ) -> Replica:
        """A replica with an empty cache; ``on_change`` hears its cache's changes."""
        return cls(name, model, BlockCache(model.cache_blocks, on_change))

    @property
    def idle(self) -> bool:
        return not self.queue and self.running == 0

    def hit_tokens(self, job: Job) -> int:
        hits = self.cache.hit_blocks(job.blocks)
        return min(hits * self.model.block_tokens, job.input_tokens)

    def held_siblings(self) -> int:
        """Queued requests that share a block the request in prefill is computing (PEEK's
        ``prefixserving:peek_held_siblings``); 0 while nothing prefills. Cost: O(blocks of the
        queued requests)."""
        if not self.prefilling or not self.pioneer_blocks:
            return 0
        return sum(1 for job in self.queue if not self.pioneer_blocks.isdisjoint(job.blocks))

    def uncached_waiting_tokens(self, count_held: bool = False) -> int:
        """Prompt tokens the queued requests still need computed, the way PEEK exports them:
        the leading cached blocks of each request are free (the pioneer's blocks among them),
        and a block shared by several queued requests is counted once (its first request
        computes it). ``count_held``: a gauge that knows nothing of siblings, each request
        counting its own uncached tokens, the blocks the pioneer is computing included. Cost:
        O(blocks of the queued requests)."""
        seen: set[int] = set()
        total = 0
        size = self.model.block_tokens
        computing = self.pioneer_blocks if count_held and self.prefilling else frozenset()
        for job in self.queue:
            cached = self.cache.hit_blocks(job.blocks)
            if computing:
                cached = next(
                    (i for i, b in enumerate(job.blocks[:cached]) if b in computing), cached
                )
            new = [b for b in job.blocks[cached:] if count_held or b not in seen]
            seen.update(new)
            # Tokens past the last full block are always computed.
            tail = max(job.input_tokens - len(job.blocks) * size, 0)
            total += min(len(new) * size + tail, job.input_tokens)
        return total

    def try_start(self) -> tuple[Job, float] | None:
        """Start the head's prefill if it can run now; returns it and its prefill time."""
        if self.prefilling or not self.queue or self.running >= self.model.max_running:
            return None
        job = self.queue[0]
        total_blocks = math.ceil((job.input_tokens + job.output_tokens) / self.model.block_tokens)
        anonymous = max(total_blocks - len(job.blocks), 0)
        if not self.cache.fits(job.blocks, anonymous):
            return None
        self.queue.popleft()
        hits = self.cache.hit_blocks(job.blocks)
        job.hit_tokens = self.hit_tokens(job)
        job.pinned = self.cache.pin(job.blocks, anonymous)
        self.pioneer_blocks = frozenset(job.pinned[hits:])
        job.anonymous = anonymous
        self.running += 1
        self.prefilling = True
        duration = self.model.prefill_s(job.input_tokens - job.hit_tokens)
        self.stats.input_tokens += job.input_tokens
        self.stats.hit_tokens += job.hit_tokens
        self.stats.prefill_busy_s += duration
        return job, duration

    def finish(self, job: Job) -> None:
        """The job's decode ended: free its slot and blocks."""
        self.running -= 1
        self.cache.release(job.pinned, job.anonymous)
