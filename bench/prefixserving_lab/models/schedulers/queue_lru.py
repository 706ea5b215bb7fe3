"""Waiting-queue-informed LRU eviction of prefix-cache blocks.

Source: vLLM RFC #48485, "Waiting-Queue-Informed LRU for Prefix Cache Eviction" (and its
implementation pull request #54366): free cached blocks that requests near the head of the
waiting queue will reuse are evicted after the other free blocks. Admission order is
unchanged; nothing is reserved or pinned.

**Algorithm** (before every step):

0. Act only when this step's allocations could evict cached data: some block among the
   first ``budget blocks`` of the free queue (the most one step can allocate:
   ``max_num_scheduled_tokens / block_size + max_num_seqs``) holds a cached prefix (the
   RFC acts "when an allocation would evict cached data").
1. Take the first ``max_num_seqs`` fresh requests of the waiting queue (the RFC's window).
2. Probe each one's cached prefix (read-only lookup).
3. Move every free (reference count 0) block of those prefixes to the most-recently-used end
   of vLLM's free block queue, requests farthest from the head first and each prefix in
   reverse chain order, so blocks of the head request are evicted last and a prefix loses
   its tail before its head.

Deviation: the RFC keeps the LRU order among retained blocks and acts only when an
allocation would evict; here the retained blocks are re-ordered by queue position once per
step, before any allocation of that step (the free queue has no cheap position lookup).

**Parameters**: the window, ``max_num_seqs`` (as in the RFC).

**Complexity**: O(budget blocks) per step, plus O(cached blocks of the window) when it acts.
"""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler


class QueueInformedLruScheduler(Scheduler):
    """vLLM's scheduler with queue-informed LRU eviction (module docstring)."""

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._retain_queued_prefixes()
        return super().schedule(throttle_prefills)

    def _retain_queued_prefixes(self) -> None:
        if not self.waiting or not self._allocation_may_evict():
            return
        window = []
        for request in self.waiting:
            if len(window) >= self.max_num_running_reqs:
                break
            if request.num_computed_tokens == 0:
                window.append(request)
        if not window:
            return
        manager = self.kv_cache_manager
        free_queue = manager.block_pool.free_block_queue
        for request in reversed(window):
            blocks = manager.get_computed_blocks(request)[0].blocks[0]
            for block in reversed(blocks):
                if block.ref_cnt == 0:
                    free_queue.remove(block)
                    free_queue.append(block)

    def _allocation_may_evict(self) -> bool:
        """Whether a cached block sits within the first ``budget`` blocks of the free queue."""
        free_queue = self.kv_cache_manager.block_pool.free_block_queue
        budget = self.max_num_scheduled_tokens // self.block_size + self.max_num_running_reqs
        block = free_queue.fake_free_list_head.next_free_block
        tail = free_queue.fake_free_list_tail
        for _ in range(budget):
            if block is None or block is tail:
                return False
            if block.block_hash is not None:
                return True
            block = block.next_free_block
        return False
