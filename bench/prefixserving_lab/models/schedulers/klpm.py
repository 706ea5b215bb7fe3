"""k-LPM: interleave FCFS and longest-prefix-match picks for a latency bound.

Source: Dexter et al., "LLM Query Scheduling with Prefix Reuse and Latency Constraints"
(arXiv 2502.04677, NeurIPS 2025), Algorithm 1: process the oldest query, then ``k - 1`` queries
that maximize the prefix cache hit, and repeat. ``k = 1`` is FCFS, ``k = inf`` is LPM.

**Algorithm** (before every step, on vLLM's waiting queue): lay the queue out as the picks
Algorithm 1 would make, continuing its cycle across steps: at cycle position 0 the oldest
remaining request, otherwise the remaining request with the longest cached prefix (ties in
arrival order). vLLM's stock ``schedule()`` admits in that order; the cycle advances by the
requests the step admitted.

**Parameters**: ``K`` (default 2, the smallest interleave; the paper leaves ``k`` to the
workload).

**Deviation**: the cached prefix is probed once per step for the whole queue, so picks later in
a step do not see the blocks earlier picks of the same step register.

**Complexity**: O(sum of cached blocks of the waiting requests + n log n) per step.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from prefixserving_lab.models.schedulers.common import cached_tokens

K = 2


class KLpmScheduler(Scheduler):
    """vLLM's scheduler in k-LPM order (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cycle = 0

    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        if len(self.waiting) > 1:
            ordered = self._order(list(self.waiting))
            self.waiting.clear()
            self.waiting.extend(ordered)
        output = super().schedule(*args, **kwargs)
        self._cycle = (self._cycle + len(output.scheduled_new_reqs)) % K
        return output

    def _order(self, waiting: list[Request]) -> list[Request]:
        by_hit = sorted(range(len(waiting)), key=lambda i: (-cached_tokens(self, waiting[i]), i))
        taken = [False] * len(waiting)
        oldest = hit = 0
        ordered: list[Request] = []
        for position in range(len(waiting)):
            if (self._cycle + position) % K == 0:
                while taken[oldest]:
                    oldest += 1
                index = oldest
            else:
                while taken[by_hit[hit]]:
                    hit += 1
                index = by_hit[hit]
            taken[index] = True
            ordered.append(waiting[index])
        return ordered
