"""SGLang-style longest-prefix-match (LPM) admission order with in-batch deprioritization.

Source: SGLang ``python/sglang/srt/managers/schedule_policy.py`` (``SchedulePolicy``:
``_determine_active_policy``, ``_compute_prefix_matches``, ``_sort_by_longest_prefix``) and
the RadixAttention paper (Zheng et al., "SGLang: Efficient Execution of Structured Language
Model Programs", 2024), cache-aware scheduling.

**Algorithm** (before every step, on vLLM's waiting queue):

1. If more than ``LPM_MAX_QUEUE`` requests wait, keep FCFS (SGLang falls back to FCFS there
   because matching every request each step is too costly).
2. For each waiting request in arrival order, look up its cached prefix length.
3. In-batch prefix caching: if the cached prefix is at most ``CHECK_THRESHOLD_TOKENS``, match
   the request against a temporary tree of the waiting requests already visited in this pass;
   if that in-batch match is at least ``DEPRIORITIZE_THRESHOLD_TOKENS``, deprioritize it (an
   earlier request is about to compute the same prefix); otherwise insert it into the tree.
4. Stable sort: deprioritized requests last, the others by cached prefix length, longest
   first. vLLM's stock ``schedule()`` then admits in that order.

**Parameters** (SGLang's defaults): ``LPM_MAX_QUEUE = 128``, ``CHECK_THRESHOLD_TOKENS = 32``,
``DEPRIORITIZE_THRESHOLD_TOKENS = 32``. Matching is at vLLM block granularity (SGLang's
radix tree matches tokens), and the temporary tree is a set of chained block hashes (a chain
hash identifies the whole prefix, so a set lookup per block is a tree walk).

**Complexity**: O(sum of blocks of the waiting requests) per step, bounded by the fallback.
"""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from prefixserving.engine.replay.baselines.common import cached_tokens

LPM_MAX_QUEUE = 128
CHECK_THRESHOLD_TOKENS = 32
DEPRIORITIZE_THRESHOLD_TOKENS = 32


class SglangLpmScheduler(Scheduler):
    """vLLM's scheduler with SGLang's LPM order (module docstring)."""

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if 1 < len(self.waiting) <= LPM_MAX_QUEUE:
            ordered = self._lpm_order(list(self.waiting))
            self.waiting.clear()
            self.waiting.extend(ordered)
        return super().schedule(throttle_prefills)

    def _lpm_order(self, waiting: list[Request]) -> list[Request]:
        in_batch: set[object] = set()
        keyed: list[tuple[float, int, Request]] = []
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
            keyed.append((float("inf") if deprioritized else -cached, position, request))
        keyed.sort(key=lambda item: (item[0], item[1]))
        return [request for _, _, request in keyed]
