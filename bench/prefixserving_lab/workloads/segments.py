"""Replay workloads, built deterministically from a seed or from a trace file.

A prompt is a sequence of *segments*: a segment is a run of deterministic tokens drawn from a
generator seeded by the segment's key, so equal keys give equal tokens (and equal vLLM block
hashes) and different keys give different tokens. Shared prefixes are shared leading
segments:

- ``gsp``: SGLang's generated-shared-prefix shape: ``groups`` system prompts, each followed by
  ``prompts_per_group`` different questions, plus ``cold_requests`` prompts of the same
  length that share nothing; order shuffled, Poisson arrivals at ``load`` times the engine's
  estimated capacity (:func:`arrival_rate_rps`).
- ``docs``: the same shape with long shared documents (longer than the step budget).
- ``mooncake``: a Mooncake-format trace (``hash_ids``: one 512-token block each; each id is
  one segment, the last one cut to ``input_length``).
- ``azure``: an Azure LLM inference trace: one unique segment per request (no sharing).

The KV cache of each workload is sized from its *distinct shared blocks* (blocks of the
chosen block size that belong to a prefix two or more requests share):
``num_blocks = max(cache_fraction * shared_blocks, 2 * longest request)``; a workload with no
sharing (``cache_fraction=None``) gets room for ``MIN_BATCH`` average requests; a base engine
shape with ``num_blocks > 0`` fixes the size instead.

The *ideal hit rate* is what an unbounded cache gives when every prefix is computed once:
for each request, the leading full blocks that an earlier request already had.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.models.replay_engine import VOCAB_SIZE, EngineShape
from prefixserving_lab.workloads.traces import TraceRequest, load_azure, load_mooncake

MIN_BATCH = 32

# Segment key namespaces, so different workload kinds never produce equal tokens.
NS_SYSTEM, NS_QUESTION, NS_COLD, NS_MOONCAKE, NS_UNIQUE = 1, 2, 3, 4, 5

SegmentKey = tuple[int, ...]
Segment = tuple[SegmentKey, int]


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One request to replay: prompt segments, output length and arrival on the clock.

    ``shares_prefix``: whether the first block of its prompt belongs to another request too
    (the TTFT goal for "requests that share nothing" reads this).
    """

    request_id: str
    arrival_s: float
    segments: tuple[Segment, ...]
    output_tokens: int
    shares_prefix: bool

    @property
    def prompt_tokens(self) -> int:
        return sum(n for _, n in self.segments)

    def prompt_token_ids(self) -> list[int]:
        tokens: list[int] = []
        for key, n in self.segments:
            tokens.extend(_segment_tokens(key, n))
        return tokens


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests sorted by arrival, the engine they run on, and their ideal hit rate."""

    name: str
    description: str
    requests: tuple[ReplayRequest, ...]
    engine: EngineShape
    ideal_hit_rate: float
    shared_blocks: int

    def summary(self) -> dict[str, object]:
        prompts = [r.prompt_tokens for r in self.requests]
        return {
            "name": self.name,
            "description": self.description,
            "requests": len(self.requests),
            "prompt_tokens_total": sum(prompts),
            "prompt_tokens_mean": round(sum(prompts) / max(1, len(prompts)), 1),
            "cold_requests": sum(1 for r in self.requests if not r.shares_prefix),
            "duration_s": round(self.requests[-1].arrival_s, 3) if self.requests else 0.0,
            "ideal_hit_rate": round(self.ideal_hit_rate, 4),
            "shared_blocks": self.shared_blocks,
            "engine": {
                "num_blocks": self.engine.num_blocks,
                "block_size": self.engine.block_size,
                "max_num_seqs": self.engine.max_num_seqs,
                "max_num_batched_tokens": self.engine.max_num_batched_tokens,
                "long_prefill_token_threshold": self.engine.long_prefill_token_threshold,
            },
        }


@lru_cache(maxsize=4096)
def _segment_tokens(key: SegmentKey, n: int) -> tuple[int, ...]:
    rng = np.random.default_rng(list(key))
    return tuple(rng.integers(1, VOCAB_SIZE, size=n).tolist())


def gsp(
    *,
    name: str,
    cost: CostModel,
    base: EngineShape,
    seed: int = 0,
    groups: int = 64,
    prompts_per_group: int = 16,
    system_tokens: int = 2048,
    question_tokens: int = 128,
    output_tokens: int = 256,
    cold_requests: int = 0,
    cache_fraction: float = 0.25,
    load: float = 0.9,
    rate_rps: float | None = None,
    description: str = "",
) -> Workload:
    """Shared-prefix groups (SGLang's generated-shared-prefix shape), shuffled, Poisson at
    ``load`` x the estimated capacity, or at ``rate_rps`` requests/s when given."""
    prompts: list[tuple[tuple[Segment, ...], int]] = []
    for g in range(groups):
        system = ((NS_SYSTEM, seed, g), system_tokens)
        for q in range(prompts_per_group):
            question = ((NS_QUESTION, seed, g, q), question_tokens)
            prompts.append(((system, question), output_tokens))
    for c in range(cold_requests):
        prompts.append(((((NS_COLD, seed, c), system_tokens + question_tokens),), output_tokens))
    random.Random(seed).shuffle(prompts)
    return _assemble(
        name=name,
        description=description,
        prompts=prompts,
        shape=None,
        base=base,
        cost=cost,
        cache_fraction=cache_fraction,
        load=load,
        seed=seed,
        rate_rps=rate_rps,
    )


def mooncake(
    path: Path,
    *,
    name: str,
    cost: CostModel,
    base: EngineShape,
    time_scale: float = 1.0,
    limit: int | None = None,
    cache_fraction: float = 0.25,
    load: float | None = 0.5,
    seed: int = 0,
    description: str = "",
) -> Workload:
    """A Mooncake-format trace. With ``load``, arrival times keep the trace's shape but are
    rescaled so the offered load at ``time_scale`` 1 is ``load`` times the engine's estimated
    capacity (the original timestamps are for a whole cluster); ``time_scale`` then
    compresses them further. With ``load=None`` the trace's own timestamps are used
    (divided by ``time_scale``)."""
    rows = load_mooncake(path, limit=limit)
    prompts = [(_mooncake_segments(row), row.output_tokens) for row in rows]
    return _assemble(
        name=name,
        description=description,
        prompts=prompts,
        shape=[row.arrival_s for row in rows],
        base=base,
        cost=cost,
        cache_fraction=cache_fraction,
        load=load,
        seed=seed,
        time_scale=time_scale,
    )


def azure(
    path: Path,
    *,
    name: str,
    cost: CostModel,
    base: EngineShape,
    limit: int | None = None,
    load: float | None = 0.8,
    seed: int = 0,
    description: str = "",
) -> Workload:
    """An Azure LLM inference trace: unique prompts of the trace's lengths (the no-sharing
    control); arrivals rescaled to ``load`` like :func:`mooncake`."""
    rows = load_azure(path, limit=limit)
    prompts = [
        ((((NS_UNIQUE, seed, i), row.input_tokens),), row.output_tokens)
        for i, row in enumerate(rows)
    ]
    return _assemble(
        name=name,
        description=description,
        prompts=prompts,
        shape=[row.arrival_s for row in rows],
        base=base,
        cost=cost,
        cache_fraction=None,
        load=load,
        seed=seed,
    )


def _mooncake_segments(row: TraceRequest) -> tuple[Segment, ...]:
    segments: list[Segment] = []
    remaining = row.input_tokens
    for block_id in row.block_ids:
        n = min(row.block_tokens, remaining)
        if n <= 0:
            break
        segments.append(((NS_MOONCAKE, block_id), n))
        remaining -= n
    return tuple(segments)


def _assemble(
    *,
    name: str,
    description: str,
    prompts: Sequence[tuple[tuple[Segment, ...], int]],
    shape: Sequence[float] | None,
    base: EngineShape,
    cost: CostModel,
    cache_fraction: float | None,
    load: float | None,
    seed: int,
    time_scale: float = 1.0,
    rate_rps: float | None = None,
) -> Workload:
    """Size the cache, compute the ideal prefill, then place arrivals on the clock.

    ``shape``: arrival times from a trace (rescaled when ``load`` is set) or None for
    Poisson arrivals at ``load`` times the estimated capacity (or at ``rate_rps``).
    """
    block = base.block_size
    for segments, output in prompts:
        total = sum(n for _, n in segments) + output
        if total > base.max_model_len:
            raise ValueError(
                f"workload {name}: a request needs {total} tokens, more than max_model_len "
                f"{base.max_model_len}; raise it with --max-model-len"
            )
    shared_blocks, ideal_prefill, ideal_hits = _sharing(prompts, block)
    prompt_lens = [sum(n for _, n in segs) for segs, _ in prompts]
    request_blocks = [
        math.ceil((p + o) / block) for p, (_, o) in zip(prompt_lens, prompts, strict=True)
    ]
    mean_blocks = sum(request_blocks) / max(1, len(request_blocks))
    longest = max(request_blocks)
    if base.num_blocks > 0:
        wanted = base.num_blocks - 1
    elif cache_fraction is None:
        wanted = math.ceil(MIN_BATCH * mean_blocks)
    else:
        wanted = round(cache_fraction * shared_blocks)
    # +1: vLLM reserves one block (the null block).
    engine = replace(base, num_blocks=max(wanted, 2 * longest) + 1)
    if rate_rps is not None:
        capacity, load = rate_rps, 1.0
    else:
        capacity = arrival_rate_rps(prompts, prompt_lens, ideal_prefill, cost, engine)
    arrivals = _arrivals(len(prompts), shape, capacity, load, seed, time_scale)
    first_segments = Counter(segs[0] for segs, _ in prompts if segs and segs[0][1] >= block)
    requests = tuple(
        ReplayRequest(
            request_id=f"{name}-{i}",
            arrival_s=arrivals[i],
            segments=segs,
            output_tokens=output,
            shares_prefix=bool(segs) and first_segments[segs[0]] > 1,
        )
        for i, (segs, output) in enumerate(prompts)
    )
    ordered = tuple(sorted(requests, key=lambda r: r.arrival_s))
    return Workload(
        name=name,
        description=description,
        requests=ordered,
        engine=engine,
        ideal_hit_rate=ideal_hits / max(1, sum(prompt_lens)),
        shared_blocks=shared_blocks,
    )


def _sharing(
    prompts: Sequence[tuple[tuple[Segment, ...], int]], block: int
) -> tuple[int, list[int], int]:
    """Distinct shared blocks, each request's prefill under an unbounded cache (in list
    order) and the total tokens that cache would hit.

    A prefix is identified by its chain of segments; a segment's blocks are shared when the
    chain up to it appears in two or more requests.
    """
    chain_count: Counter[tuple[int, Segment]] = Counter()
    chains: list[list[tuple[int, Segment]]] = []
    for segments, _ in prompts:
        parent = 0
        chain = []
        for seg in segments:
            link = (parent, seg)
            chain.append(link)
            parent = hash(link)
        chain_count.update(chain)
        chains.append(chain)
    shared_tokens = 0
    counted: set[tuple[int, Segment]] = set()
    for chain in chains:
        offset = 0
        for link in chain:
            n = link[1][1]
            if chain_count[link] > 1 and link not in counted:
                counted.add(link)
                # Whole blocks that lie inside this segment.
                shared_tokens += (offset + n) // block * block - math.ceil(offset / block) * block
            offset += n
    seen: set[tuple[int, Segment]] = set()
    ideal_prefill: list[int] = []
    hits_total = 0
    for chain, (segments, _) in zip(chains, prompts, strict=True):
        prompt = sum(n for _, n in segments)
        hit = 0
        for link in chain:
            if link not in seen:
                break
            hit += link[1][1]
        hit = min(hit // block * block, (prompt - 1) // block * block)
        seen.update(chain)
        ideal_prefill.append(prompt - hit)
        hits_total += hit
    return max(0, shared_tokens // block), ideal_prefill, hits_total


def arrival_rate_rps(
    prompts: Sequence[tuple[tuple[Segment, ...], int]],
    prompt_lens: Sequence[int],
    ideal_prefill: Sequence[int],
    cost: CostModel,
    engine: EngineShape,
) -> float:
    """Estimated capacity of the engine on these requests with every prefix computed once:
    requests per second at which the estimated work (:meth:`CostModel.request_work_s`)
    fills the engine. The decode batch is bounded by ``max_num_seqs`` and by how many
    requests' unshared tokens fit in the cache."""
    n = len(prompts)
    private = sum(p + o for p, (_, o) in zip(ideal_prefill, prompts, strict=True)) / max(1, n)
    batch = max(1, min(engine.max_num_seqs, int(engine.num_blocks * engine.block_size / private)))
    work = sum(
        cost.request_work_s(pre, p, o, batch)
        for pre, p, (_, o) in zip(ideal_prefill, prompt_lens, prompts, strict=True)
    )
    return n / work if work > 0 else float("inf")


def _arrivals(
    n: int,
    shape: Sequence[float] | None,
    capacity_rps: float,
    load: float | None,
    seed: int,
    time_scale: float,
) -> list[float]:
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    if shape is None:
        if load is None or load <= 0:
            raise ValueError("Poisson arrivals need a load > 0")
        rng = random.Random(seed)
        rate = load * capacity_rps * time_scale
        t = 0.0
        out = []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    if load is None:
        return [t / time_scale for t in shape]
    span = shape[-1] - shape[0] if len(shape) > 1 else 0.0
    if span <= 0:
        return [0.0] * n
    # Trace rate n/span; scale so it equals load * capacity, then compress by time_scale.
    factor = (n / span) / (load * capacity_rps)
    return [(t - shape[0]) * factor / time_scale for t in shape]
