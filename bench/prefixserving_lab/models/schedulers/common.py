"""Read-only prefix-cache probes the baselines share."""

from __future__ import annotations

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request


def cached_tokens(scheduler: Scheduler, request: Request) -> int:
    """Prompt tokens of a waiting ``request`` that would hit the prefix cache now.

    ``KVCacheManager.get_computed_blocks`` only looks blocks up (no reference counts, no LRU
    update, no stats), so probing never changes what the stock scheduler then does.
    Cost: O(cached blocks of the request).
    """
    if request.num_computed_tokens > 0:
        return request.num_computed_tokens
    return scheduler.kv_cache_manager.get_computed_blocks(request)[1]
