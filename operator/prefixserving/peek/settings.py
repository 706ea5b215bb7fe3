"""PEEK settings: the ``scheduler`` block of a PrefixServing spec, as the engine process sees it.

The operator passes the block to the engine as environment variables (names in
:mod:`prefixserving.constants`); :meth:`PeekSettings.from_env` reads them with these defaults:

========================================  =======  ===============================================
variable                                  default  meaning
========================================  =======  ===============================================
``PREFIXSERVING_MAX_SIBLING_WAIT_MS``     500      longest a sibling is held for its pioneer
                                                   (0 turns holding off)
``PREFIXSERVING_PIN_BUDGET_FRACTION``     0.0      share of the KV pool the guard may hard-pin
                                                   (0: only LRU reordering, no capacity cost)
``PREFIXSERVING_LANES``                   true     under cache pressure, the cache and aged
                                                   lanes, the eviction guard and decode headroom
                                                   (:mod:`.lanes`, :mod:`.queue`); false keeps
                                                   vLLM's own order
``PREFIXSERVING_MAX_OVERTAKES``           128      most younger requests admitted ahead of any
                                                   waiting request (0: arrival order)
``PREFIXSERVING_DECODE_RESERVE_BLOCKS``   1        KV blocks decode headroom keeps for each
                                                   running request beyond what the running
                                                   requests allocate in the next step (1: about
                                                   FCFS's preemptions and TPOT under overload;
                                                   0: more admitted at once; docs/peek.md)
``PREFIXSERVING_MAX_RESPONSE_RATIO``      8        response ratio from which the aged lane goes
                                                   first (:mod:`.lanes`; not in the spec: set it
                                                   through ``spec.engine.env``)
``PREFIXSERVING_CACHE_SHARE``             0        share of the prefill work the cache lane keeps
                                                   while the aged lane has a request over its
                                                   bound, below 1 (:mod:`.lanes`; 0: the aged
                                                   lane goes first; not in the spec either)
``PREFIXSERVING_REORDER_ON_BACKLOG``      false    the lanes also leave arrival order while a
                                                   request waits through a whole step without
                                                   cache pressure (:mod:`.queue`; not in the
                                                   spec; docs/peek.md says when it pays)
``PREFIXSERVING_FCFS_BOUND``              false    a request is also not due in the aged lane
                                                   before the work queued ahead of it when it
                                                   joined was admitted (:mod:`.lanes`; not in
                                                   the spec; pair it with a high
                                                   ``PREFIXSERVING_MAX_OVERTAKES``; docs/peek.md)
========================================  =======  ===============================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from prefixserving.constants import (
    ENV_CACHE_SHARE,
    ENV_DECODE_RESERVE_BLOCKS,
    ENV_FCFS_BOUND,
    ENV_LANES,
    ENV_MAX_OVERTAKES,
    ENV_MAX_RESPONSE_RATIO,
    ENV_MAX_SIBLING_WAIT_MS,
    ENV_PIN_BUDGET_FRACTION,
    ENV_REORDER_ON_BACKLOG,
)
from prefixserving.peek.guard import DEFAULT_PIN_BUDGET_FRACTION
from prefixserving.peek.holding import DEFAULT_MAX_SIBLING_WAIT_S
from prefixserving.peek.lanes import (
    DEFAULT_CACHE_SHARE,
    DEFAULT_MAX_OVERTAKES,
    MAX_RESPONSE_RATIO,
)

# Decode headroom's blocks per running request on top of the next step's. 1 met more goal rows
# than 0 at full size under both cost models, above all TPOT, and about as many at scale 0.125
# (bench/results/replay-sweep-*.md, replay-decode-headroom*.md).
DEFAULT_DECODE_RESERVE_BLOCKS = 1

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class PeekSettings:
    """PEEK knobs (module docstring)."""

    max_sibling_wait_ms: float = DEFAULT_MAX_SIBLING_WAIT_S * 1000.0
    pin_budget_fraction: float = DEFAULT_PIN_BUDGET_FRACTION
    lanes: bool = True
    max_overtakes: int = DEFAULT_MAX_OVERTAKES
    max_response_ratio: float = MAX_RESPONSE_RATIO
    cache_share: float = DEFAULT_CACHE_SHARE
    decode_reserve_blocks: int = DEFAULT_DECODE_RESERVE_BLOCKS
    reorder_on_backlog: bool = False
    fcfs_bound: bool = False

    def __post_init__(self) -> None:
        if self.max_sibling_wait_ms < 0:
            raise ValueError(f"{ENV_MAX_SIBLING_WAIT_MS} must be >= 0")
        if not 0.0 <= self.pin_budget_fraction <= 1.0:
            raise ValueError(f"{ENV_PIN_BUDGET_FRACTION} must be between 0 and 1")
        if self.max_overtakes < 0:
            raise ValueError(f"{ENV_MAX_OVERTAKES} must be >= 0")
        if self.max_response_ratio < 1.0:
            raise ValueError(f"{ENV_MAX_RESPONSE_RATIO} must be >= 1 (1: always the aged lane)")
        if not 0.0 <= self.cache_share < 1.0:
            raise ValueError(f"{ENV_CACHE_SHARE} must be >= 0 and < 1, e.g. {ENV_CACHE_SHARE}=0.5")
        if self.decode_reserve_blocks < 0:
            raise ValueError(f"{ENV_DECODE_RESERVE_BLOCKS} must be >= 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> PeekSettings:
        """Read the settings; raise ValueError naming the variable on a bad value."""
        env = os.environ if env is None else env
        kwargs: dict[str, float | int | bool] = {}
        if (raw := env.get(ENV_MAX_SIBLING_WAIT_MS)) is not None:
            kwargs["max_sibling_wait_ms"] = _number(ENV_MAX_SIBLING_WAIT_MS, raw)
        if (raw := env.get(ENV_PIN_BUDGET_FRACTION)) is not None:
            kwargs["pin_budget_fraction"] = _number(ENV_PIN_BUDGET_FRACTION, raw)
        if (raw := env.get(ENV_LANES)) is not None:
            kwargs["lanes"] = _flag(ENV_LANES, raw)
        if (raw := env.get(ENV_MAX_OVERTAKES)) is not None:
            kwargs["max_overtakes"] = _count(ENV_MAX_OVERTAKES, raw, DEFAULT_MAX_OVERTAKES)
        if (raw := env.get(ENV_MAX_RESPONSE_RATIO)) is not None:
            kwargs["max_response_ratio"] = _number(ENV_MAX_RESPONSE_RATIO, raw)
        if (raw := env.get(ENV_CACHE_SHARE)) is not None:
            kwargs["cache_share"] = _number(ENV_CACHE_SHARE, raw)
        if (raw := env.get(ENV_DECODE_RESERVE_BLOCKS)) is not None:
            kwargs["decode_reserve_blocks"] = _count(ENV_DECODE_RESERVE_BLOCKS, raw, 1)
        if (raw := env.get(ENV_REORDER_ON_BACKLOG)) is not None:
            kwargs["reorder_on_backlog"] = _flag(ENV_REORDER_ON_BACKLOG, raw)
        if (raw := env.get(ENV_FCFS_BOUND)) is not None:
            kwargs["fcfs_bound"] = _flag(ENV_FCFS_BOUND, raw)
        return cls(**kwargs)  # type: ignore[arg-type]


def _number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number, e.g. {name}=500") from None


def _count(name: str, raw: str, example: int) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number, e.g. {name}={example}") from None


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean, e.g. {name}=true")
