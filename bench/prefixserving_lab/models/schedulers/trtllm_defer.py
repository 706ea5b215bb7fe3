"""TensorRT-LLM-style one-iteration deferral of duplicate uncached prefixes.

Source: NVIDIA/TensorRT-LLM pull request #18195, "Admit one context per uncached prefix
instead of letting every duplicate recompute it" (scheduler v2,
``enable_prefix_aware_scheduling``): when requests share a prefix nothing in the cache covers
yet, admit one and defer the rest by a single iteration, so they read the blocks it commits.

**Algorithm** (through vLLM's ``_handle_blocked_waiting_request`` hook, per step):

1. Track the prompt block hashes of the requests admitted so far in this step (the hook for
   request *k* sees whether request *k-1* went to RUNNING).
2. For a fresh waiting request, find its first uncached block (probe the prefix cache). If
   that block belongs to a prompt admitted in this step, skip the request for this step
   (``return False``: the stock loop moves on to the next request, nothing else is blocked).
3. A request is deferred at most once ("a single iteration"); after that it is admitted
   like in stock vLLM.

vLLM registers full blocks at allocation, so a sibling admitted in the same step already hits
the pioneer's first chunk; the deferral matters when a prefix spans several chunks, which is
also where TensorRT-LLM's commits land one iteration later.

**Parameters**: none (TensorRT-LLM turns it on by default with block reuse).

**Complexity**: O(blocks of the request) per visited waiting request.
"""

from __future__ import annotations

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from prefixserving_lab.models.schedulers.common import cached_tokens


class TrtllmDeferScheduler(Scheduler):
    """vLLM's scheduler with TensorRT-LLM's duplicate-prefix deferral (module docstring)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._claimed: set[object] = set()
        self._previous: Request | None = None
        self._deferred_once: set[str] = set()

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        self._claimed = set()
        self._previous = None
        return super().schedule(throttle_prefills)

    def _handle_blocked_waiting_request(self, request: Request) -> bool:
        if not super()._handle_blocked_waiting_request(request):
            return False
        previous = self._previous
        if previous is not None and previous.status == RequestStatus.RUNNING:
            self._claimed.update(previous.block_hashes)
            self._deferred_once.discard(previous.request_id)
        self._previous = request
        if request.num_computed_tokens > 0 or request.request_id in self._deferred_once:
            return True
        first_uncached = cached_tokens(self, request) // self.block_size
        hashes = request.block_hashes
        if first_uncached < len(hashes) and hashes[first_uncached] in self._claimed:
            self._deferred_once.add(request.request_id)
            return False
        return True
