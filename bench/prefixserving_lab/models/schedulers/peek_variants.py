"""PEEK with one thing changed, for ablation rows next to ``peek`` in the same replay run.

- Setting variants (:class:`PeekSettingVariant`) are
  :class:`prefixserving.engine.vllm.PeekScheduler` constructed with one of PEEK's environment
  settings (:mod:`prefixserving.peek.settings`) set for that construction only, so the engine
  code under test is exactly the shipped scheduler.
- Experiments (:class:`PeekBlockReserveScheduler`) change one method of the shipped scheduler
  to measure a change before it ships.
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


class PeekBlockReserveScheduler(PeekScheduler):
    """``peek_block_reserve``, an experiment: decode headroom reserves, on top of the shipped
    reserve (the running requests' blocks of the next step), one block for every running
    request, what each needs within its next block of tokens. It reads no ``max_tokens``.
    O(running)."""

    def _next_step_blocks(self) -> int | None:
        blocks = super()._next_step_blocks()
        return None if blocks is None else blocks + len(self.running)
