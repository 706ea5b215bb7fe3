"""PEEK with one setting changed (or one documented combination), for rows next to ``peek`` in
the same replay run.

Each variant is :class:`prefixserving.engine.vllm.PeekScheduler` constructed with PEEK's
environment settings (:mod:`prefixserving.peek.settings`) set for that construction only, so the
engine code under test is exactly the shipped scheduler.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar
from unittest import mock

from prefixserving import constants
from prefixserving.engine.vllm import PeekScheduler


class PeekSettingVariant(PeekScheduler):
    """PeekScheduler with ``env`` added to the environment while it reads its settings."""

    env: ClassVar[dict[str, str]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with mock.patch.dict(os.environ, self.env):
            super().__init__(*args, **kwargs)


class PeekResponseRatio16Scheduler(PeekSettingVariant):
    """``peek_rr16``: the aged lane's response-ratio bound at 16 (PEEK's bound before 8)."""

    env: ClassVar[dict[str, str]] = {constants.ENV_MAX_RESPONSE_RATIO: "16"}


class PeekNoReserveScheduler(PeekSettingVariant):
    """``peek_no_reserve``: decode headroom keeps only what the running requests allocate in the
    next step (``spec.scheduler.decodeReserveBlocks: 0``, PEEK's default before 1)."""

    env: ClassVar[dict[str, str]] = {constants.ENV_DECODE_RESERVE_BLOCKS: "0"}


class PeekCacheShareScheduler(PeekSettingVariant):
    """``peek_share50``: the cache lane keeps half the prefill work while the aged lane has a
    request over its bound (``PREFIXSERVING_CACHE_SHARE=0.5``; the default 0 gives the aged
    lane every such pick)."""

    env: ClassVar[dict[str, str]] = {constants.ENV_CACHE_SHARE: "0.5"}


class PeekOvertakes100kScheduler(PeekSettingVariant):
    """``peek_ovt100k``: the overtake budget at 100,000, the spec's maximum
    (``spec.scheduler.maxOvertakes``; default 128), so the aged lane's response-ratio bound
    alone ages waiting requests."""

    env: ClassVar[dict[str, str]] = {constants.ENV_MAX_OVERTAKES: "100000"}


class PeekBacklogScheduler(PeekSettingVariant):
    """``peek_backlog``: the lanes also leave arrival order on a backlog without cache pressure
    (``PREFIXSERVING_REORDER_ON_BACKLOG=true``; default false: only under pressure)."""

    env: ClassVar[dict[str, str]] = {constants.ENV_REORDER_ON_BACKLOG: "true"}


# The FCFS bound with the overtake budget at the spec's maximum: the bound replaces the budget
# as the backstop (in deep queues the default budget of 128 binds first and little changes).
_FCFS_BOUND_ENV = {constants.ENV_FCFS_BOUND: "true", constants.ENV_MAX_OVERTAKES: "100000"}


class PeekFcfsBoundScheduler(PeekSettingVariant):
    """``peek_fcfs_bound``: a request is due in the aged lane only once the work queued ahead of
    it when it joined was admitted, or later by its response-ratio bound
    (``PREFIXSERVING_FCFS_BOUND=true``), with ``PREFIXSERVING_MAX_OVERTAKES=100000``."""

    env: ClassVar[dict[str, str]] = _FCFS_BOUND_ENV


class PeekFcfsBoundBacklogScheduler(PeekSettingVariant):
    """``peek_fcfs_bound_backlog``: ``peek_fcfs_bound`` with
    ``PREFIXSERVING_REORDER_ON_BACKLOG=true``."""

    env: ClassVar[dict[str, str]] = {
        **_FCFS_BOUND_ENV,
        constants.ENV_REORDER_ON_BACKLOG: "true",
    }
