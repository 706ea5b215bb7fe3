"""The policies the replay compares: name -> scheduler class (imported when first used).

``fcfs`` is vLLM's stock scheduler, ``peek`` is PEEK's adapter
(:class:`prefixserving.engine.vllm.PeekScheduler`), ``peek_rr16``, ``peek_no_reserve``,
``peek_share50``, ``peek_ovt100k``, ``peek_backlog``, ``peek_fcfs_bound`` and
``peek_fcfs_bound_backlog`` PEEK with settings changed (:mod:`.peek_variants`), the others are
the baselines in :mod:`prefixserving_lab.models.schedulers`. Every class has ``Scheduler``'s
constructor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prefixserving import constants

if TYPE_CHECKING:
    from vllm.v1.core.sched.scheduler import Scheduler

BASELINE = "fcfs"
# PEEK and its setting variants: the candidates a replay report evaluates goals for; every other
# policy of a run is a baseline.
PEEK_POLICIES: tuple[str, ...] = (
    "peek",
    "peek_rr16",
    "peek_no_reserve",
    "peek_share50",
    "peek_ovt100k",
    "peek_backlog",
    "peek_fcfs_bound",
    "peek_fcfs_bound_backlog",
)

POLICIES: dict[str, str] = {
    "fcfs": "vllm.v1.core.sched.scheduler:Scheduler",
    "peek": constants.PEEK_SCHEDULER_CLS.replace(".PeekScheduler", ":PeekScheduler"),
    "peek_rr16": "prefixserving_lab.models.schedulers.peek_variants:PeekResponseRatio16Scheduler",
    "peek_no_reserve": "prefixserving_lab.models.schedulers.peek_variants:PeekNoReserveScheduler",
    "peek_share50": "prefixserving_lab.models.schedulers.peek_variants:PeekCacheShareScheduler",
    "peek_ovt100k": "prefixserving_lab.models.schedulers.peek_variants:PeekOvertakes100kScheduler",
    "peek_backlog": "prefixserving_lab.models.schedulers.peek_variants:PeekBacklogScheduler",
    "peek_fcfs_bound": "prefixserving_lab.models.schedulers.peek_variants:PeekFcfsBoundScheduler",
    "peek_fcfs_bound_backlog": (
        "prefixserving_lab.models.schedulers.peek_variants:PeekFcfsBoundBacklogScheduler"
    ),
    "lpm_uncapped": "prefixserving_lab.models.schedulers.sglang:UncappedLpmScheduler",
    "sglang_lpm": "prefixserving_lab.models.schedulers.sglang:SglangLpmScheduler",
    "sglang_hrrn": "prefixserving_lab.models.schedulers.sglang:SglangHrrnScheduler",
    "sglang_spf": "prefixserving_lab.models.schedulers.sglang:SglangSpfScheduler",
    "k_lpm": "prefixserving_lab.models.schedulers.klpm:KLpmScheduler",
    "trtllm_defer": "prefixserving_lab.models.schedulers.trtllm_defer:TrtllmDeferScheduler",
    "queue_lru": "prefixserving_lab.models.schedulers.queue_lru:QueueInformedLruScheduler",
    "admission_window": (
        "prefixserving_lab.models.schedulers.admission_window:AdmissionWindowScheduler"
    ),
}


def scheduler_class(name: str) -> type[Scheduler]:
    """The scheduler class of policy ``name`` (imports vLLM); ``KeyError`` names the known
    policies."""
    from vllm.v1.core.sched.scheduler import Scheduler

    try:
        target = POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
    module_name, attribute = target.split(":")
    cls = getattr(importlib.import_module(module_name), attribute)
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise TypeError(f"{target} is not a vLLM Scheduler subclass")
    return cls
