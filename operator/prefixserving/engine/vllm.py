"""PEEK inside vLLM: ``--scheduler-cls prefixserving.engine.vllm.PeekScheduler``.

:class:`PeekScheduler` subclasses vLLM's v1 ``Scheduler`` and keeps its ``schedule()``: it only

* replaces ``self.waiting`` with :class:`PeekRequestQueue` (vLLM's full ``RequestQueue``
  contract, in PEEK order; see :mod:`prefixserving.peek.queue`),
* calls ``begin_step`` before each ``super().schedule()`` (eviction guard, pioneer retirement),
  releases the guard's pins after a step that preempted, before a prefix-cache reset and at
  shutdown,
* publishes its metrics (:mod:`prefixserving.peek.metrics`).

Interfaces used, all kept by vLLM 0.33: ``Scheduler.__init__`` / ``schedule`` /
``reset_prefix_cache`` / ``shutdown``, ``SchedulerOutput.preempted_req_ids``,
``RequestQueue``, ``Request.block_hashes`` / ``num_tokens`` / ``num_computed_tokens`` /
``status``, and on the block pool ``get_cached_block``, ``get_num_free_blocks``, ``touch``,
``free_blocks``, ``free_block_queue.remove`` / ``append`` and the free list's
``next_free_block`` links.

Settings come from the environment (:class:`prefixserving.peek.settings.PeekSettings`). LoRA
adapters and ``cache_salt`` are part of vLLM's block hashes, so requests that differ in them never
share an index node, a lane or a pioneer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, KVCacheBlock, get_block_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from prefixserving.peek.guard import Guard
from prefixserving.peek.metrics import PeekSnapshot, SnapshotWriter
from prefixserving.peek.queue import PeekQueue
from prefixserving.peek.settings import PeekSettings

logger = logging.getLogger(__name__)

# Blocks the guard scans beyond the previous step's allocation (a step can grow).
WINDOW_MARGIN_BLOCKS = 32


class VllmBlockPoolPort:
    """The guard's view of a vLLM ``BlockPool`` (one KV cache group, id 0)."""

    def __init__(self, pool: BlockPool, group_ids: Sequence[int] = (0,)) -> None:
        self.pool = pool
        self.group_ids = list(group_ids)

    @property
    def num_blocks(self) -> int:
        return self.pool.num_gpu_blocks

    @property
    def num_free(self) -> int:
        return self.pool.get_num_free_blocks()

    def free_lru(self) -> Iterator[tuple[KVCacheBlock, BlockHash | None]]:
        queue = self.pool.free_block_queue
        block = queue.fake_free_list_head.next_free_block
        tail = queue.fake_free_list_tail
        while block is not None and block is not tail:
            key = block.block_hash
            yield block, (None if key is None else get_block_hash(key))
            block = block.next_free_block

    def cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        blocks = self.pool.get_cached_block(block_hash, self.group_ids)
        return None if not blocks else blocks[0]

    def is_cached(self, block_hash: BlockHash) -> bool:
        return self.pool.get_cached_block(block_hash, self.group_ids) is not None

    def is_free(self, block: KVCacheBlock) -> bool:
        return block.ref_cnt == 0 and not block.is_null

    def move_to_mru(self, block: KVCacheBlock) -> None:
        self.pool.free_block_queue.remove(block)
        self.pool.free_block_queue.append(block)

    def pin(self, block: KVCacheBlock) -> None:
        self.pool.touch([block])

    def unpin(self, block: KVCacheBlock) -> None:
        self.pool.free_blocks([block])


class VllmEngineView:
    """The PEEK queue's view of vLLM requests and prefix cache."""

    def __init__(self, block_size: int, is_cached: Callable[[BlockHash], bool]) -> None:
        self.block_size = block_size
        # The pool probe itself, not a method that forwards to it: the queue calls it for
        # every block it walks.
        self.is_cached = is_cached

    def request_id(self, request: Request) -> str:
        return request.request_id

    def block_hashes(self, request: Request) -> Sequence[BlockHash]:
        return request.block_hashes

    def num_tokens(self, request: Request) -> int:
        return request.num_tokens

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

    def __new__(cls, *args: Any, **kwargs: Any) -> PeekScheduler:
        if cls is PeekScheduler and schedules_async(args, kwargs):
            cls = PeekAsyncScheduler
        return super().__new__(cls)

    waiting: PeekRequestQueue  # type: ignore[assignment]

    clock: Callable[[], float] = staticmethod(time.monotonic)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peek_settings = PeekSettings.from_env()
        pool = self.kv_cache_manager.block_pool
        # Block hashes are probed in the pool directly only when both use one block size.
        probe = self.cache_config.enable_prefix_caching and self.hash_block_size == self.block_size
        if not probe:
            logger.warning(
                "PEEK: prefix caching is off or hash block size differs from the block size; "
                "holding and the eviction guard are disabled, order stays FCFS."
            )
        port = VllmBlockPoolPort(pool)
        guard = None
        if probe:
            window_blocks = (
                self.max_num_scheduled_tokens // self.block_size + self.max_num_running_reqs
            )
            guard = Guard(
                port,
                window_blocks=window_blocks,
                pin_budget_fraction=self.peek_settings.pin_budget_fraction,
            )
        view = VllmEngineView(self.block_size, port.is_cached if probe else _never_cached)
        old_waiting = self.waiting
        self.waiting = PeekRequestQueue(view, self.peek_settings, guard)
        for request in old_waiting:
            self.waiting.add_request(request)
        self._window_blocks: int | None = None
        self._metrics_writer = SnapshotWriter.from_env(
            engine=str(self.parallel_config.data_parallel_index),
            model_name=_served_name(self.vllm_config.model_config.served_model_name),
        )
        logger.info("PEEK scheduler enabled on vLLM's %s: %s", self.base, self.peek_settings)

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
            "admitted": snap.admitted,
            "pick_tokens": snap.pick_tokens,
            "lane_tokens": snap.lane_tokens,
        }

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        self.waiting.begin_step(self.clock(), self._window_blocks)
        output = super().schedule(*args, **kwargs)
        # The next step allocates about what this one did: its tokens' blocks plus one block
        # per scheduled request, with a margin; the guard scans that much of the LRU end.
        self._window_blocks = (
            output.total_num_scheduled_tokens // self.block_size
            + len(output.num_scheduled_tokens)
            + WINDOW_MARGIN_BLOCKS
        )
        if output.preempted_req_ids:
            self.waiting.release_pins()
        if self._metrics_writer is not None and self._metrics_writer.due():
            self._metrics_writer.write(self.peek_snapshot())
        return output

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
        stats = self.waiting.stats
        return PeekSnapshot(
            held_siblings=self.waiting.num_held,
            pinned_blocks=self.waiting.num_pinned,
            lanes=self.waiting.lanes.num_lanes,
            lane_tokens=dict(stats.lane_tokens),
            pick_tokens=dict(stats.admitted_tokens),
            admitted=dict(stats.admitted),
            sibling_holds=stats.holds,
            pressure_steps=stats.pressure_steps,
        )


class PeekAsyncScheduler(PeekScheduler, AsyncScheduler):
    """PEEK on vLLM's ``AsyncScheduler``. :class:`PeekScheduler` builds this class by itself
    when the engine schedules asynchronously; naming it in ``--scheduler-cls`` forces the
    async base (vLLM's own tests construct it directly)."""
