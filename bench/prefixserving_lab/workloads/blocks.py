"""Workloads for the cluster simulator: chained block keys, generated shared-prefix groups,
arrival scaling and the ideal (one unbounded cache) hit rate.

All requests are :class:`~prefixserving_lab.workloads.traces.TraceRequest` rows, so generated
groups and replayed Mooncake traces go through the same code.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from prefixserving.router.policies.ranking import mix64
from prefixserving_lab.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest

_CHAIN_SEED = 0x6A09E667F3BCC908


@lru_cache(maxsize=1 << 16)
def chain_block_ids(block_ids: tuple[int, ...]) -> tuple[int, ...]:
    """Chained 64-bit keys: key ``i`` depends on ids ``0..i``, like vLLM's block hashes and
    the router's prefix keys, so equal keys mean equal prefixes. Memoised: benchmarks replay
    the same requests under every policy."""
    out = []
    previous = _CHAIN_SEED
    for block_id in block_ids:
        previous = mix64(previous ^ mix64(block_id))
        out.append(previous)
    return tuple(out)


def ideal_hit_rate(requests: Sequence[TraceRequest]) -> float:
    """Share of prompt tokens a single unbounded cache would serve, in arrival order."""
    seen: set[int] = set()
    hit = total = 0
    for request in requests:
        blocks = chain_block_ids(request.block_ids)
        hits = 0
        while hits < len(blocks) and blocks[hits] in seen:
            hits += 1
        hit += min(hits * request.block_tokens, request.input_tokens)
        total += request.input_tokens
        seen.update(blocks)
    return hit / total if total else 0.0


def scale_arrivals(requests: Sequence[TraceRequest], time_scale: float) -> list[TraceRequest]:
    """The same requests arriving ``time_scale`` times faster."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    return [replace(r, arrival_s=r.arrival_s / time_scale) for r in requests]


@dataclass(frozen=True, slots=True)
class SharedPrefixGroups:
    """Requests that share a system prompt, then one of ``groups`` documents, then a question.

    Every request is ``system_blocks`` blocks common to all, ``group_blocks`` blocks of its
    group's document and ``question_blocks`` blocks of its own. Groups are drawn with Zipf
    popularity (exponent ``zipf_s``), so a few documents are hot. Arrivals are Poisson at
    ``rate_per_s``; outputs are uniform in ``[output_tokens // 2, output_tokens * 3 // 2]``.
    """

    requests: int = 4000
    groups: int = 128
    system_blocks: int = 2
    group_blocks: int = 12
    question_blocks: int = 2
    zipf_s: float = 0.9
    rate_per_s: float = 4.0
    output_tokens: int = 150
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    seed: int = 0

    def generate(self) -> list[TraceRequest]:
        rng = random.Random(self.seed)
        weights = [1.0 / (g + 1) ** self.zipf_s for g in range(self.groups)]
        system = list(range(self.system_blocks))
        next_id = self.system_blocks + self.groups * self.group_blocks
        out = []
        t = 0.0
        for _ in range(self.requests):
            t += rng.expovariate(self.rate_per_s)
            group = rng.choices(range(self.groups), weights)[0]
            start = self.system_blocks + group * self.group_blocks
            document = list(range(start, start + self.group_blocks))
            question = list(range(next_id, next_id + self.question_blocks))
            next_id += self.question_blocks
            ids = system + document + question
            input_tokens = len(ids) * self.block_tokens - rng.randrange(self.block_tokens)
            output = rng.randint(self.output_tokens // 2, self.output_tokens * 3 // 2)
            out.append(TraceRequest(t, input_tokens, max(output, 1), tuple(ids), self.block_tokens))
        return out
