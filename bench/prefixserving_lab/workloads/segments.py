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
- ``sessions``: closed-loop sessions (multi-turn chat, agent loops): each turn's prompt is
  the previous turn's prompt, its answer and a new message (a user turn, or a tool's output);
  the next turn arrives ``think_s`` after the previous one finished.

``header_tokens`` > 0 prepends one common segment to every prompt of a workload: a chat
template's header (Llama 3's template with its date lines is about 30 tokens; the suite uses
whole blocks), so every prompt starts with the same blocks.

An answer segment is ``output_tokens`` copies of :data:`SAMPLED_TOKEN`, the token the
replay's fabricated model samples, so a later turn's prompt holds exactly the tokens the
engine cached for the earlier turn's output.

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
# The token the replay's fabricated model samples (any id works: outputs ignore EOS).
SAMPLED_TOKEN = 7

# Segment key namespaces, so different workload kinds never produce equal tokens.
NS_SYSTEM, NS_QUESTION, NS_COLD, NS_MOONCAKE, NS_UNIQUE = 1, 2, 3, 4, 5
NS_HEADER, NS_ANSWER, NS_MESSAGE = 6, 7, 8

SegmentKey = tuple[int, ...]
Segment = tuple[SegmentKey, int]


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One request to replay: prompt segments, output length and arrival on the clock.

    ``shares_prefix``: whether the first block of its prompt past the common header belongs
    to another request too (the TTFT figures of "requests that share nothing" read this).
    ``after``: the request whose finish this one waits for (a session's previous turn); it
    then arrives ``think_s`` after that finish and ``arrival_s`` is unused (0).
    """

    request_id: str
    arrival_s: float
    segments: tuple[Segment, ...]
    output_tokens: int
    shares_prefix: bool
    after: str | None = None
    think_s: float = 0.0

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
    """Requests (open arrivals sorted by arrival, then the closed-loop ones), the engine they
    run on, and their ideal hit rate."""

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
            "duration_s": round(max((r.arrival_s for r in self.requests), default=0.0), 3),
            "closed_loop_requests": sum(1 for r in self.requests if r.after is not None),
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
    if key[0] == NS_ANSWER:
        return (SAMPLED_TOKEN,) * n
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
    header_tokens: int = 0,
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
        header_tokens=header_tokens,
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
    header_tokens: int = 0,
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
        header_tokens=header_tokens,
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


def sessions(
    *,
    name: str,
    cost: CostModel,
    base: EngineShape,
    seed: int = 0,
    sessions: int = 64,
    turns: int = 6,
    systems: int = 8,
    system_tokens: int = 1024,
    first_message_tokens: int = 256,
    message_tokens: int = 128,
    output_tokens: int = 128,
    think_s: float = 5.0,
    cache_fraction: float = 0.25,
    load: float = 0.9,
    header_tokens: int = 0,
    description: str = "",
) -> Workload:
    """Closed-loop sessions (multi-turn chat, or an agent loop when the message is a tool's
    output): session ``c`` opens with system prompt ``c % systems`` and a first message; turn
    ``t`` > 0 sends turn ``t - 1``'s prompt, its answer and a new ``message_tokens`` message,
    and arrives ``think_s`` after turn ``t - 1`` finished. Sessions start in Poisson order at
    ``load`` x the estimated capacity / ``turns`` (so the offered request rate is about
    ``load`` x capacity while think time is short against a turn). Cost: O(sessions *
    turns^2) segments."""
    prompts: list[tuple[tuple[Segment, ...], int]] = []
    follows: list[int | None] = []
    for c in range(sessions):
        segments: list[Segment] = [
            ((NS_SYSTEM, seed, c % systems), system_tokens),
            ((NS_MESSAGE, seed, c, 0), first_message_tokens),
        ]
        for t in range(turns):
            if t:
                segments += [
                    ((NS_ANSWER, seed, c, t - 1), output_tokens),
                    ((NS_MESSAGE, seed, c, t), message_tokens),
                ]
            follows.append(len(prompts) - 1 if t else None)
            prompts.append((tuple(segments), output_tokens))
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
        header_tokens=header_tokens,
        follows=follows,
        think_s=think_s,
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
    header_tokens: int = 0,
    follows: Sequence[int | None] | None = None,
    think_s: float = 0.0,
) -> Workload:
    """Prepend the header, size the cache, compute the ideal prefill, then place arrivals on
    the clock.

    ``shape``: arrival times from a trace (rescaled when ``load`` is set) or None for
    Poisson arrivals at ``load`` times the estimated capacity (or at ``rate_rps``).
    ``follows[i]``: the index of the request that request ``i`` waits for (closed loop,
    ``think_s`` after its finish), or None for an open arrival; open arrivals get the share
    of the rate that keeps the offered request rate at ``load`` x capacity.
    """
    block = base.block_size
    follows = follows or [None] * len(prompts)
    skip = 1 if header_tokens else 0
    if header_tokens:
        header: Segment = ((NS_HEADER, seed), header_tokens)
        prompts = [((header, *segments), output) for segments, output in prompts]
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
    opened = [i for i, parent in enumerate(follows) if parent is None]
    arrivals = dict(
        zip(
            opened,
            _arrivals(
                len(opened), shape, capacity * len(opened) / len(prompts), load, seed, time_scale
            ),
            strict=True,
        )
    )
    first_segments = Counter(
        segs[skip] for segs, _ in prompts if len(segs) > skip and segs[skip][1] >= block
    )
    requests = tuple(
        ReplayRequest(
            request_id=f"{name}-{i}",
            arrival_s=arrivals.get(i, 0.0),
            segments=segs,
            output_tokens=output,
            shares_prefix=len(segs) > skip and first_segments[segs[skip]] > 1,
            after=None if follows[i] is None else f"{name}-{follows[i]}",
            think_s=0.0 if follows[i] is None else think_s,
        )
        for i, (segs, output) in enumerate(prompts)
    )
    ordered = tuple(sorted(requests, key=lambda r: (r.after is not None, r.arrival_s)))
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
