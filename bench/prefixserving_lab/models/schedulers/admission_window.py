"""vLLM's cache-aware admission window: resident prefixes first within a bounded look-ahead.

Source: vLLM pull request #54625, "[Core][V1] Add cache-aware admission ordering"
(``--cache-aware-admission-window N``, ``--cache-aware-admission-threshold F``): within the
first ``N`` waiting requests, admit those whose prefix is already resident in the KV cache ahead
of those that would compute theirs, so a cold request's allocation does not evict blocks a
request further back was about to reuse.

**Algorithm** (before every step):

0. Act only while KV cache usage is at least ``THRESHOLD`` (below it both fit, and reordering
   would change admission order with nothing to protect).
1. Within the first ``WINDOW`` requests of the waiting queue, take the slots held by plain
   requests with nothing computed (a partially computed or blocked request keeps its slot).
2. Stable-partition the requests in those slots: those with a resident (cached) prefix first,
   then the others, each group in arrival order.

**Parameters**: ``WINDOW`` (the pull request's flag defaults to 0, off; 32 here, a bounded
look-ahead of about one step's admissions), ``THRESHOLD`` (0.5, the default the pull request
settled on in review).

**Complexity**: O(window x cached blocks) per step while usage is above the threshold.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from prefixserving_lab.models.schedulers.common import cached_tokens

WINDOW = 32
THRESHOLD = 0.5


class AdmissionWindowScheduler(Scheduler):
    """vLLM's scheduler with #54625's cache-aware admission window (module docstring)."""

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if len(self.waiting) > 1 and self.kv_cache_manager.usage >= THRESHOLD:
            self._reorder_window()
        return super().schedule(*args, **kwargs)

    def _reorder_window(self) -> None:
        waiting = list(self.waiting)
        window = waiting[:WINDOW]
        slots = [
            i
            for i, r in enumerate(window)
            if r.status == RequestStatus.WAITING and r.num_computed_tokens == 0
        ]
        movable = [window[i] for i in slots]
        resident = [r for r in movable if cached_tokens(self, r) > 0]
        cold = [r for r in movable if cached_tokens(self, r) == 0]
        for slot, request in zip(slots, resident + cold, strict=True):
            window[slot] = request
        self.waiting.clear()
        self.waiting.extend(window + waiting[WINDOW:])
