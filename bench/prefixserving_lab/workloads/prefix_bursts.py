"""A shared-prefix burst workload for the autoscaling simulation: fan-outs and cold documents
over background conversations.

**Fan-out bursts** (:class:`PrefixBursts`, the burst a prefix-caching engine absorbs): inside
each ``fanout`` window, every ``fanout_every_s`` a new ``prefix_tokens``-token prompt (a long
system prompt or a shared document) arrives with ``fanout_requests`` requests behind it, spread
evenly over ``fanout_spread_s``, each adding ``question_tokens`` of its own (one block) and
generating ``output_tokens``. The prefix is computed once by the first request (the pioneer);
the others wait for it and then cost only their own block: a queue-depth gauge that counts them
reads a burst of ``fanout_requests``, their uncached tokens read one prefix.

**Cold-document bursts**: inside each ``cold`` window, ``cold_per_s`` unrelated
``cold_tokens``-token documents a second (evenly spaced), each generating ``output_tokens``:
prefill work no cache helps with.

Either list of windows may be empty (``bench scaling`` runs the two kinds as two workloads).
Both mix with ``background`` (any trace with block ids, e.g. the bursty conversations without
bursts). Block ids of the bursts start at :data:`BURST_BLOCK_BASE`, past any the conversation
shape hands out. Deterministic (no randomness). Cost: O(requests * blocks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from prefixserving_lab.workloads.traces import TraceRequest

BURST_BLOCK_BASE = 1 << 40

Window = tuple[float, float]


@dataclass(frozen=True, slots=True)
class PrefixBursts:
    """Fan-out and cold-document bursts (see the module docstring)."""

    fanout: tuple[Window, ...] = ((300.0, 480.0),)
    fanout_every_s: float = 7.0
    fanout_requests: int = 32
    fanout_spread_s: float = 0.5
    prefix_tokens: int = 16384
    question_tokens: int = 128
    cold: tuple[Window, ...] = ((300.0, 480.0),)
    cold_per_s: float = 2.0
    cold_tokens: int = 16384
    output_tokens: int = 32
    block_tokens: int = 128

    def __post_init__(self) -> None:
        for name in ("fanout_every_s", "fanout_spread_s", "cold_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("fanout_requests", "prefix_tokens", "question_tokens", "cold_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.question_tokens > self.block_tokens:
            raise ValueError("question_tokens must fit in one block (at most block_tokens)")
        for start, end in (*self.fanout, *self.cold):
            if not 0 <= start < end:
                raise ValueError(f"burst window {start:g}:{end:g} must have 0 <= START < END")

    def requests(self, background: Sequence[TraceRequest]) -> list[TraceRequest]:
        """The bursts merged with ``background``, ordered by arrival."""
        ids = count(BURST_BLOCK_BASE)
        out = list(background)
        prefix_blocks = self.prefix_tokens // self.block_tokens
        for start, end in self.fanout:
            for k in range(math.ceil((end - start) / self.fanout_every_s)):
                at = start + k * self.fanout_every_s
                prefix = tuple(next(ids) for _ in range(prefix_blocks))
                tokens = prefix_blocks * self.block_tokens + self.question_tokens
                gap = self.fanout_spread_s / self.fanout_requests
                out += [
                    TraceRequest(
                        at + i * gap,
                        tokens,
                        self.output_tokens,
                        (*prefix, next(ids)),
                        self.block_tokens,
                    )
                    for i in range(self.fanout_requests)
                ]
        blocks = math.ceil(self.cold_tokens / self.block_tokens)
        for start, end in self.cold:
            for k in range(math.ceil((end - start) * self.cold_per_s)):
                document = tuple(next(ids) for _ in range(blocks))
                out.append(
                    TraceRequest(
                        start + k / self.cold_per_s,
                        self.cold_tokens,
                        self.output_tokens,
                        document,
                        self.block_tokens,
                    )
                )
        return sorted(out, key=lambda r: r.arrival_s)
