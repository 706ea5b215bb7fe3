"""A bursty conversational workload for the autoscaling and rollout simulations.

**Arrivals**: the Azure LLM inference conversation trace (``azure-conv-2023.csv``: arrival
times, context and generated tokens of a real chat service) replayed with a time compression
that changes over time (:class:`BurstSchedule`): ``base_scale`` outside bursts and
``burst_scale`` inside each burst window, so a burst is the same real traffic arriving
``burst_scale / base_scale`` times faster. The trace repeats from its start if the schedule
outlasts it.

**Prefixes** (the trace has none; :class:`ConversationShape` adds the structure chat services
have): every request belongs to one of ``apps`` applications drawn with Zipf popularity
(exponent ``zipf_s``); an application's requests open with its ``system_tokens``-token system
prompt. With probability ``followup_p`` a request is the next turn of one of the application's
``open_conversations`` most recent conversations whose last context was shorter: clients
resend the history, so it shares all of that turn's full blocks, then adds new ones; otherwise
it starts a conversation. Everything past the shared part is unique. Block ids are per
``block_tokens`` tokens; equal leading ids mean a shared prefix.

Deterministic for a given seed. Cost: O(requests * blocks).
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path

from prefixserving_lab.workloads.traces import (
    AZURE_CONVERSATION_FILE,
    TraceRequest,
    load_azure,
    traces_dir,
)

DEFAULT_TRACE = traces_dir() / AZURE_CONVERSATION_FILE


@dataclass(frozen=True, slots=True)
class BurstSchedule:
    """Time compression over simulated time: ``bursts`` are ``(start_s, end_s)`` windows."""

    duration_s: float = 1800.0
    base_scale: float = 2.0
    burst_scale: float = 6.0
    bursts: tuple[tuple[float, float], ...] = ((480.0, 840.0),)

    def __post_init__(self) -> None:
        if self.base_scale <= 0 or self.burst_scale <= 0 or self.duration_s <= 0:
            raise ValueError("scales and duration_s must be > 0")

    def scale_at(self, time_s: float) -> float:
        inside = any(start <= time_s < end for start, end in self.bursts)
        return self.burst_scale if inside else self.base_scale

    def in_burst(self, time_s: float, after_s: float = 0.0) -> bool:
        """Whether ``time_s`` falls in a burst window, extended by ``after_s``."""
        return any(start <= time_s < end + after_s for start, end in self.bursts)


def compress(trace: Sequence[TraceRequest], schedule: BurstSchedule) -> list[TraceRequest]:
    """``trace`` (arrivals from 0) replayed under ``schedule`` until ``duration_s``."""
    if len(trace) < 2:
        raise ValueError("the trace needs at least two requests")
    span_s = trace[-1].arrival_s + (trace[-1].arrival_s - trace[0].arrival_s) / len(trace)
    out: list[TraceRequest] = []
    now_s = 0.0
    for lap in count():
        previous = 0.0
        for request in trace:
            trace_time = request.arrival_s
            now_s += (trace_time - previous) / schedule.scale_at(now_s)
            previous = trace_time
            if now_s >= schedule.duration_s:
                return out
            out.append(replace(request, arrival_s=now_s))
        now_s += (span_s - previous) / schedule.scale_at(now_s)
        if lap > 1000:
            raise ValueError("the schedule is too long for this trace")
    return out


@dataclass(frozen=True, slots=True)
class ConversationShape:
    """Shared-prefix structure added to a trace without prefixes (see the module docstring)."""

    apps: int = 32
    zipf_s: float = 1.0
    system_tokens: int = 512
    followup_p: float = 0.5
    open_conversations: int = 64
    block_tokens: int = 128
    seed: int = 0

    def apply(self, requests: Sequence[TraceRequest]) -> list[TraceRequest]:
        rng = random.Random(self.seed)
        weights = [1.0 / (a + 1) ** self.zipf_s for a in range(self.apps)]
        cumulative = [sum(weights[: i + 1]) for i in range(self.apps)]
        system_blocks = self.system_tokens // self.block_tokens
        next_id = self.apps * system_blocks
        open_by_app: list[deque[tuple[int, ...]]] = [
            deque(maxlen=self.open_conversations) for _ in range(self.apps)
        ]
        out = []
        for request in requests:
            app = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
            blocks = math.ceil(request.input_tokens / self.block_tokens)
            shared = tuple(range(app * system_blocks, (app + 1) * system_blocks))[:blocks]
            conversations = open_by_app[app]
            if conversations and rng.random() < self.followup_p:
                candidates = [c for c in conversations if len(c) < blocks]
                if candidates:
                    history = rng.choice(candidates)
                    conversations.remove(history)
                    shared = history
            ids = shared + tuple(range(next_id, next_id + blocks - len(shared)))
            next_id += blocks - len(shared)
            full = request.input_tokens // self.block_tokens
            conversations.append(ids[:full])
            out.append(replace(request, block_ids=ids, block_tokens=self.block_tokens))
        return out


def bursty_conversations(
    schedule: BurstSchedule,
    shape: ConversationShape,
    trace_path: Path = DEFAULT_TRACE,
) -> list[TraceRequest]:
    """The Azure conversation trace under ``schedule`` with ``shape``'s prefixes."""
    return shape.apply(compress(load_azure(trace_path), schedule))
