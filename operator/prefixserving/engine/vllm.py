"""PEEK inside vLLM: ``--scheduler-cls prefixserving.engine.vllm.PeekScheduler``.

:class:`PeekScheduler` subclasses vLLM's v1 ``Scheduler`` (or, when the engine schedules
asynchronously, ``AsyncScheduler``: see the class) and keeps its ``schedule()``: it only

* replaces ``self.waiting`` with :class:`PeekRequestQueue` (vLLM's full ``RequestQueue``
  contract, in PEEK order; see :mod:`prefixserving.peek.queue`),
* before each ``super().schedule()``: calls ``begin_step`` (pioneers, eviction guard, the
  decode reserve) and moves running pioneers that siblings wait for to the front of
  ``self.running`` (their later chunks are scheduled first and they are preempted last);
  releases the guard's pins after a step that preempted or scheduled nothing while requests
  waited (and takes none in the next step), before a prefix-cache reset and at shutdown,
* publishes its metrics (:mod:`prefixserving.peek.metrics`) after each ``update_from_output``,
  where vLLM counts the step's requests for its own gauges.

PEEK keeps vLLM's own order (and says why in the ``prefixserving:peek_info`` metric and the log)
when it cannot probe the prefix cache the way vLLM will hit it: prefix caching off, a hash block
size that differs from the block size, or a hybrid KV layout (several KV cache groups, or a
group that is not full attention: sliding-window or Mamba layers hit a prefix only where every
group agrees, which probing one group cannot tell).

Interfaces used, all kept by vLLM 0.32 and 0.33: ``Scheduler.__init__`` / ``schedule`` /
``update_from_output`` / ``reset_prefix_cache`` / ``shutdown``, ``running``, ``policy``,
``max_num_active_reqs``, ``num_waiting_for_streaming_input``,
``kv_cache_config``, ``SchedulerOutput.preempted_req_ids``, ``RequestQueue``,
``Request.block_hashes`` / ``num_tokens`` / ``num_prompt_tokens`` / ``num_computed_tokens`` /
``status`` / ``priority`` / ``arrival_time``, and on the block pool
``cached_block_hash_to_block`` (its key map; keys packed by ``make_block_hash_with_group_id``),
``get_num_free_blocks``, ``touch``, ``free_blocks``, ``free_block_queue.remove`` / ``append``
and the free list's ``next_free_block`` links.

Settings come from the environment (:class:`prefixserving.peek.settings.PeekSettings`). LoRA
adapters and ``cache_salt`` are part of vLLM's block hashes, so requests that differ in them never
share an index node, a cluster or a pioneer.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    make_block_hash_with_group_id,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request, RequestStatus

from prefixserving.peek.guard import Guard
from prefixserving.peek.metrics import PeekSnapshot, SnapshotWriter
from prefixserving.peek.queue import PeekQueue
from prefixserving.peek.settings import PeekSettings

logger = logging.getLogger(__name__)

# Blocks the guard scans beyond the previous step's allocation (a step can grow).
WINDOW_MARGIN_BLOCKS = 32


class VllmBlockPoolPort:
    """The guard's and the queue's view of a vLLM ``BlockPool`` with one KV cache group."""

    def __init__(self, pool: BlockPool, group_id: int = 0) -> None:
        self.pool = pool
        # vLLM keys its prefix cache by the block hash followed by the group id's bytes; the
        # suffix comes from vLLM's own packing function, once.
        self._key_suffix = make_block_hash_with_group_id(BlockHash(b""), group_id)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_gpu_blocks

    @property
    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    def free_lru(self) -> Iterator[tuple[KVCacheBlock, BlockHashWithGroupId | None]]:
        """Free blocks from the LRU end with their prefix-cache key as vLLM stores it (the
        guard translates its few planned hashes by ``cache_key`` instead)."""
        queue = self.pool.free_block_queue
        block = queue.fake_free_list_head.next_free_block
        tail = queue.fake_free_list_tail
        while block is not None and block is not tail:
            yield block, block.block_hash
            block = block.next_free_block

    def cache_key(self, block_hash: BlockHash) -> BlockHashWithGroupId:
        """vLLM's prefix-cache key of ``block_hash`` in this port's group."""
        return BlockHashWithGroupId(block_hash + self._key_suffix)

    def is_cached(self, block_hash: BlockHash) -> bool:
        """What ``BlockPool.get_cached_block`` answers for the group (a key is in vLLM's
        hash-to-block map only while it holds a block), in one dict lookup instead of building
        its per-group list: the queue probes on every arrival and presentation."""
        return block_hash + self._key_suffix in self.pool.cached_block_hash_to_block._cache

    def cached_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        return self.pool.cached_block_hash_to_block.get_one_block(key)

    @staticmethod
    def is_free(block: KVCacheBlock) -> bool:
        return block.ref_cnt == 0

    def move_to_mru(self, block: KVCacheBlock) -> None:
        self.pool.free_block_queue.remove(block)
        self.pool.free_block_queue.append(block)

    def pin(self, block: KVCacheBlock) -> None:
        self.pool.touch([block])

    def unpin(self, block: KVCacheBlock) -> None:
        self.pool.free_blocks([block])


class VllmEngineView:
    """The PEEK queue's view of vLLM requests, prefix cache and block pool."""

    def __init__(
        self,
        block_size: int,
        is_cached: Callable[[BlockHash], bool],
        free_blocks: Callable[[], int],
        priority_policy: bool,
    ) -> None:
        self.block_size = block_size
        # The pool probe itself, not a method that forwards to it: the queue calls it for
        # every block it walks.
        self.is_cached = is_cached
        self.free_blocks = free_blocks
        self.priority_policy = priority_policy

    def request_id(self, request: Request) -> str:
        return request.request_id

    def block_hashes(self, request: Request) -> Sequence[BlockHash]:
        return request.block_hashes

    def num_tokens(self, request: Request) -> int:
        return request.num_tokens

    def priority_key(self, request: Request) -> tuple[int, tuple[Any, ...]] | None:
        """vLLM's priority order: priority, then arrival time, then request id."""
        if not self.priority_policy:
            return None
        return request.priority, (request.arrival_time, request.request_id)

    def allocated(self, request: Request) -> bool:
        return request.status == RequestStatus.RUNNING

    def computed_tokens(self, request: Request) -> int:
        return request.num_computed_tokens

    def prefill_done(self, request: Request) -> bool:
        if request.status != RequestStatus.RUNNING:
            return True
        full_prompt_tokens = request.num_prompt_tokens // self.block_size * self.block_size
        return request.num_computed_tokens >= full_prompt_tokens


class PeekRequestQueue(PeekQueue[Request, BlockHash], RequestQueue):
    """:class:`PeekQueue` registered as a vLLM ``RequestQueue``."""


def _never_cached(_: BlockHash) -> bool:
    return False


def _served_name(name: str | list[str] | None) -> str:
    if isinstance(name, list):
        return name[0] if name else ""
    return name or ""


def schedules_async(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether the engine that builds a scheduler with these arguments schedules
    asynchronously: ``vllm_config.scheduler_config.async_scheduling`` after vLLM resolved it
    (its default, None, becomes True on GPUs unless the configuration rules it out)."""
    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    return bool(getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False))


class PeekScheduler(Scheduler):
    """``--scheduler-cls prefixserving.engine.vllm.PeekScheduler``: PEEK on the scheduler base
    vLLM would use itself.

    vLLM instantiates a custom ``--scheduler-cls`` as given, and a class that is not an
    ``AsyncScheduler`` silently runs an engine that schedules asynchronously (vLLM's default
    on GPUs) without output placeholders, one step at a time. So construction picks the base
    from the engine's resolved configuration: with ``async_scheduling`` on it builds a
    :class:`PeekAsyncScheduler` (a subclass of this class and of vLLM's ``AsyncScheduler``),
    otherwise this class on vLLM's ``Scheduler``. One value of ``--scheduler-cls`` is right
    for both; :attr:`base` says which one runs (logged, and exported as a metric).

    ``clock`` (seconds, monotonic) times sibling holds; a replay harness with a simulated clock
    passes its own through :meth:`use_clock`.
    """

    waiting: PeekRequestQueue  # type: ignore[assignment]

    clock: Callable[[], float] = staticmethod(time.monotonic)
    # None until __init__ sets it: vLLM's own tests call update_from_output on schedulers whose
    # construction they replaced.
    _metrics_writer: SnapshotWriter | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> PeekScheduler:
        if cls is PeekScheduler and schedules_async(args, kwargs):
            cls = PeekAsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = PeekSettings.from_env()
        self.fallback = self._fallback_reason()
        if self.fallback:
            logger.warning("PEEK keeps vLLM's own order: %s.", self.fallback)
            settings = dataclasses.replace(settings, lanes=False, max_sibling_wait_ms=0)
        self.peek_settings = settings
        pool = self.kv_cache_manager.block_pool
        port = VllmBlockPoolPort(pool)
        guard = None
        if not self.fallback:
            window_blocks = (
                self.max_num_scheduled_tokens // self.block_size + self.max_num_running_reqs
            )
            guard = Guard(
                port, window_blocks=window_blocks, pin_budget_fraction=settings.pin_budget_fraction
            )
        view = VllmEngineView(
            self.block_size,
            _never_cached if self.fallback else port.is_cached,
            pool.get_num_free_blocks,
            priority_policy=self.policy == SchedulingPolicy.PRIORITY,
        )
        old_waiting = self.waiting
        self.waiting = PeekRequestQueue(view, settings, guard)
        for request in old_waiting:
            self.waiting.add_request(request)
        self._window_blocks: int | None = None
        self._pins_paused = False
        self._metrics_writer = SnapshotWriter.from_env(
            engine=str(self.parallel_config.data_parallel_index),
            model_name=_served_name(self.vllm_config.model_config.served_model_name),
        )
        logger.info("PEEK scheduler enabled on vLLM's %s: %s", self.base, settings)

    def _fallback_reason(self) -> str:
        """Why PEEK cannot follow vLLM's prefix cache here ('' when it can)."""
        if not self.cache_config.enable_prefix_caching:
            return "prefix caching is off"
        if self.hash_block_size != self.block_size:
            return "the hash block size differs from the block size"
        groups = self.kv_cache_config.kv_cache_groups
        if len(groups) != 1 or not isinstance(groups[0].kv_cache_spec, FullAttentionSpec):
            kinds = ", ".join(type(group.kv_cache_spec).__name__ for group in groups)
            return f"hybrid KV cache layout ({kinds})"
        return ""

    @property
    def base(self) -> str:
        """The vLLM scheduler this engine runs PEEK on: ``AsyncScheduler`` or ``Scheduler``."""
        return "AsyncScheduler" if isinstance(self, AsyncScheduler) else "Scheduler"

    def use_clock(self, clock: Callable[[], float]) -> None:
        """Time sibling holds with ``clock`` (seconds) instead of ``time.monotonic``."""
        self.clock = clock

    def replay_stats(self) -> dict[str, Any]:
        """PEEK's counters, for benchmark reports."""
        snap = self.peek_snapshot()
        return {
            "held_siblings": snap.held_siblings,
            "pinned_blocks": snap.pinned_blocks,
            "sibling_holds": snap.sibling_holds,
            "longest_sibling_wait_s": round(self.waiting.holding.longest_wait_s, 4),
            "pressure_steps": snap.pressure_steps,
            "headroom_stops": snap.headroom_stops,
            "admitted": snap.admitted,
            "admitted_tokens": snap.admitted_tokens,
        }

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self.waiting.begin_step(
            self.clock(),
            self._window_blocks,
            self._decode_reserve_blocks(),
            pin=not self._pins_paused,
        )
        if self.waiting.num_held:
            self._pioneers_first()
        output = super().schedule(*args, **kwargs)
        # The next step allocates about what this one did: its tokens' blocks plus one block
        # per scheduled request, with a margin; the guard scans that much of the LRU end.
        self._window_blocks = (
            output.total_num_scheduled_tokens // self.block_size
            + len(output.num_scheduled_tokens)
            + WINDOW_MARGIN_BLOCKS
        )
        # After a step that preempted or scheduled nothing while requests waited, vLLM admits
        # (or readmits) a request only when its whole prompt fits, which pins can prevent: drop
        # them, and take none next step (guard, step 3). len, not bool: the queue's bool
        # presents a request, which would count as this step's.
        self._pins_paused = bool(output.preempted_req_ids) or (
            not output.total_num_scheduled_tokens and len(self.waiting) > 0
        )
        if self._pins_paused:
            self.waiting.release_pins()
        return output

    def update_from_output(self, *args: Any, **kwargs: Any) -> dict[int, EngineCoreOutputs]:
        outputs = super().update_from_output(*args, **kwargs)
        # vLLM has just counted this step's waiting requests for its own gauges (make_stats):
        # PEEK's snapshot of the same moment reaches /metrics beside them.
        if self._metrics_writer is not None and self._metrics_writer.due(self.waiting.num_held):
            self._metrics_writer.write(self.peek_snapshot())
        return outputs

    def _decode_reserve_blocks(self) -> int | None:
        """Blocks decode headroom keeps for the running requests: those they are still to
        allocate before they all decode (one for each decode whose next token starts a block,
        and the rest of each prefill beyond this step's chunk, capped by
        ``long_prefill_token_threshold`` or the token budget), plus
        ``decode_reserve_blocks`` for each of them (their next blocks of output). O(running).

        None when nothing runs, when nothing waits and when every request slot is taken. With
        nothing waiting the queue presents nothing this step: a request joins it during a step
        only by preemption, which skips vLLM's waiting loop, or when that loop puts back what it
        skipped, after its last presentation. With every slot taken vLLM admits nothing (its
        waiting loop stops at the slot check, right after asking the queue whether a request is
        presentable, and running requests leave a step only by preemption). So no presentation
        is checked against the reserve, and the loop is skipped: on every step of an engine
        without a queue, and on most steps of one with a deep queue (the batch is full)."""
        if not self.running or len(self.waiting) == 0 or self._slots_full():
            return None
        block_size = self.block_size
        threshold = self.scheduler_config.long_prefill_token_threshold
        chunk = threshold if threshold > 0 else self.max_num_scheduled_tokens
        blocks = self.peek_settings.decode_reserve_blocks * len(self.running)
        for request in self.running:
            computed, prompt = request.num_computed_tokens, request.num_prompt_tokens
            if computed >= prompt:
                blocks += (computed + 1) % block_size == 0
                continue
            after_this_step = min(computed + chunk, prompt)
            blocks += -(-prompt // block_size) - -(-after_this_step // block_size)
        return blocks

    def _slots_full(self) -> bool:
        """vLLM's own slot check in its waiting loop: no request can be admitted now."""
        active = len(self.running) + self.num_waiting_for_streaming_input
        return active >= self.max_num_active_reqs

    def _pioneers_first(self) -> None:
        """Stable-move running pioneers to the front of ``self.running``. O(running)."""
        holding = self.waiting.holding
        pioneers = [r for r in self.running if holding.is_pioneer(r.request_id)]
        if pioneers:
            others = [r for r in self.running if not holding.is_pioneer(r.request_id)]
            self.running[:] = pioneers + others

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        self.waiting.release_pins()
        return super().reset_prefix_cache(*args, **kwargs)

    def shutdown(self) -> None:
        self.waiting.shutdown()
        if self._metrics_writer is not None:
            self._metrics_writer.remove()
        super().shutdown()

    def peek_snapshot(self) -> PeekSnapshot:
        """Current values of PEEK's metrics."""
        waiting = self.waiting
        stats = waiting.stats
        return PeekSnapshot(
            base=self.base,
            fallback=self.fallback,
            held_siblings=waiting.num_held,
            pinned_blocks=waiting.num_pinned,
            uncached_waiting_tokens=waiting.uncached_waiting_tokens,
            admitted=dict(stats.admitted),
            admitted_tokens=dict(stats.admitted_tokens),
            sibling_holds=stats.holds,
            pressure_steps=stats.pressure_steps,
            headroom_stops=stats.headroom_stops,
        )


class PeekAsyncScheduler(PeekScheduler, AsyncScheduler):
    """PEEK on vLLM's ``AsyncScheduler``. :class:`PeekScheduler` builds this class by itself
    when the engine schedules asynchronously; naming it in ``--scheduler-cls`` forces the
    async base (vLLM's own tests construct it directly)."""
