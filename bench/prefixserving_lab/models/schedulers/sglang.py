"""SGLang's cache-aware waiting-queue orders, each a small subclass of vLLM's ``Scheduler``.

Source: SGLang ``python/sglang/srt/managers/schedule_policy.py`` (``SchedulePolicy``:
``calc_priority``, ``_determine_active_policy``, ``_compute_prefix_matches``,
``_sort_by_longest_prefix``, ``_sort_by_hrrn``, ``_sort_by_shortest_prefill``), and the
RadixAttention paper (Zheng et al., "SGLang: Efficient Execution of Structured Language Model
Programs", 2024) for cache-aware scheduling.

**Algorithm** (before every step, on vLLM's waiting queue; vLLM's stock ``schedule()`` then
admits in that order):

1. SGLang's ``lpm`` and ``hrrn`` fall back to FCFS while more than ``FCFS_ABOVE`` requests
   wait (matching every request each step is too costly); ``shortest-prefill-first`` and the
   uncapped LPM never do.
2. For each waiting request in arrival order, look up its cached prefix length.
3. In-batch prefix caching: if the cached prefix is at most ``CHECK_THRESHOLD_TOKENS``, match
   the request against a temporary tree of the waiting requests already visited in this pass;
   if that in-batch match is at least ``DEPRIORITIZE_THRESHOLD_TOKENS``, deprioritize it (an
   earlier request is about to compute the same prefix); otherwise insert it into the tree.
4. Stable sort, deprioritized requests last:

   ============================  =====================================================
   policy                        key (smallest first)
   ============================  =====================================================
   ``sglang_lpm``                cached prefix tokens, longest first
   ``lpm_uncapped``              the same, with no FCFS fallback
   ``sglang_hrrn``               ``-(waited prefill tokens / uncached prompt tokens)``:
                                 highest response ratio first; waited tokens are the
                                 prefill tokens the engine computed since the request
                                 arrived; nothing uncached goes first
   ``sglang_spf``                uncached tokens (prompt and output), then arrival
   ============================  =====================================================

**Parameters** (SGLang's defaults): ``FCFS_ABOVE = 128``, ``CHECK_THRESHOLD_TOKENS = 32``,
``DEPRIORITIZE_THRESHOLD_TOKENS = 32``.

**Deviations**: matching is at vLLM block granularity (SGLang's radix tree matches tokens); the
temporary tree is a set of chained block hashes (a chain hash names the whole prefix, so a set
lookup per block is a tree walk); HRRN ties are broken by arrival order (SGLang breaks them by
request id, a random UUID there); SGLang's ``shortest_prefill_chunk_limit`` (capping a running
chunked prefill to leave budget for shorter waiting requests) has no hook in vLLM's scheduler and
is left out.

**Complexity**: O(sum of blocks of the waiting requests) per step, bounded by the fallback where
it applies.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from prefixserving_lab.models.schedulers.common import cached_tokens

FCFS_ABOVE = 128
CHECK_THRESHOLD_TOKENS = 32
DEPRIORITIZE_THRESHOLD_TOKENS = 32


class SglangOrderScheduler(Scheduler):
    """vLLM's scheduler with one of SGLang's waiting-queue orders (module docstring)."""

    fcfs_above: ClassVar[int | None] = FCFS_ABOVE

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        waiting = len(self.waiting)
        if waiting > 1 and (self.fcfs_above is None or waiting <= self.fcfs_above):
            ordered = self._order(list(self.waiting))
            self.waiting.clear()
            self.waiting.extend(ordered)
        return super().schedule(*args, **kwargs)

    def _order(self, waiting: list[Request]) -> list[Request]:
        in_batch: set[object] = set()
        keyed: list[tuple[bool, float, int, Request]] = []
        for position, request in enumerate(waiting):
            cached = cached_tokens(self, request)
            deprioritized = False
            if cached <= CHECK_THRESHOLD_TOKENS:
                matched = 0
                for block_hash in request.block_hashes:
                    if block_hash not in in_batch:
                        break
                    matched += self.block_size
                if matched >= DEPRIORITIZE_THRESHOLD_TOKENS:
                    deprioritized = True
                else:
                    in_batch.update(request.block_hashes)
            keyed.append((deprioritized, self._key(request, cached), position, request))
        keyed.sort(key=lambda item: item[:3])
        return [request for *_, request in keyed]

    def _key(self, request: Request, cached: int) -> float:
        raise NotImplementedError


class SglangLpmScheduler(SglangOrderScheduler):
    """``--schedule-policy lpm``: longest cached prefix first, FCFS above 128 waiting."""

    def _key(self, request: Request, cached: int) -> float:
        return -cached


class UncappedLpmScheduler(SglangLpmScheduler):
    """Longest cached prefix first with no FCFS fallback (SGLang's LPM, uncapped)."""

    fcfs_above = None


class SglangSpfScheduler(SglangOrderScheduler):
    """``--schedule-policy shortest-prefill-first``: least uncached work first."""

    fcfs_above = None

    def _key(self, request: Request, cached: int) -> float:
        return max(1, request.num_tokens - cached)


class SglangHrrnScheduler(SglangOrderScheduler):
    """``--schedule-policy hrrn``: highest response ratio next, aged in prefill tokens."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.processed_tokens = 0
        self._arrival_processed: dict[str, int] = {}

    def add_request(self, request: Request) -> None:
        self._arrival_processed[request.request_id] = self.processed_tokens
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        output = super().schedule(*args, **kwargs)
        for rid, tokens in output.num_scheduled_tokens.items():
            request = self.requests[rid]
            if request.num_computed_tokens - tokens < request.num_prompt_tokens:
                self.processed_tokens += tokens
        return output

    def _key(self, request: Request, cached: int) -> float:
        uncached = request.num_prompt_tokens - cached
        if uncached <= 0:
            return -math.inf
        waited = self.processed_tokens - self._arrival_processed.get(request.request_id, 0)
        return -max(0, waited) / uncached
