"""The standard workloads of the replay benchmark (issue: "Replay benchmark on the real vLLM
scheduler"), built deterministically from a seed and the traces in ``../shared/traces``.

| name             | what                                                                   |
|------------------|------------------------------------------------------------------------|
| gsp-q25          | (1) SGLang generated-shared-prefix: 64 groups x 16 prompts, 2048-token |
|                  | system prompt, 128-token question, 256 output; cache = 1/4 of the      |
|                  | distinct prefixes; Poisson arrivals at load 0.9 (x estimated capacity) |
| gsp-cold-q25     | (1) the same plus 1 cold (shares nothing) request per 8 shared ones    |
| gsp-cold-full    | (1) with cold requests; the cache holds every prefix                   |
| gsp-cold-big     | (1) with cold requests; cache 4x the prefixes (they never need to be   |
|                  | evicted), max_num_seqs 32 and load 1.2 so a queue forms: where a naive |
|                  | longest-prefix-first order starves cold requests                       |
| gsp-chunked      | (2) gsp-cold with ``long_prefill_token_threshold`` 512, cache 1/2      |
| docs             | (3) 16 shared 12,288-token documents x 8 questions, step budget 8,192  |
| mooncake-1x/4x/16x | (4) Mooncake trace, first 2,000 rows, offered load 0.5 at 1x, then   |
|                  | compressed 4x and 16x; cache 1/4 of the shared blocks                  |
| chat-multiturn   | (6) 64 sessions x 6 turns: 8 system prompts of 1024 tokens, a 256-token |
|                  | first message, then each turn resends the history plus its answer (128 |
|                  | tokens) and a 128-token message; 5 s think time; cache 1/2 of shared   |
| agent-loop       | (7) 32 agents x 8 steps: one 4096-token tool-definition prompt, a      |
|                  | 512-token task, then each step appends the model's 64-token tool call  |
|                  | and a 1024-token tool output; 0.5 s tool latency; cache 1/2 of shared  |
| azure-code       | (5) no-sharing control: first 2,000 rows of the Azure code trace,      |
|                  | load 0.8                                                               |
| real-check       | the shape of ``bench/real_engine_peek.py`` (4 groups x 6, 1536 + 64    |
|                  | tokens, 8 out, 2 req/s, block 128, budget 1024, chunks of 256), to     |
|                  | compare the ranking of policies with the real CPU engine               |

Variants: ``<name>+hdr16`` and ``<name>+hdr64`` run a sharing workload with a common
:data:`HEADER_TOKENS`-token chat-template header in front of every prompt (one or more whole
blocks: the normal case of one template, or one system prompt, for all users) on an engine with
16- or 64-token blocks. ``BuildContext.load`` replaces every workload's own load (the load
sweep: :data:`SWEEP_LOADS`); :data:`SWEEP` names the workloads of the sweep.

``scale`` (0 < scale <= 1) shrinks every workload proportionally (groups, documents, sessions,
trace rows) so smaller runs keep the same shape; 1.0 is the issue's size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prefixserving_lab.models.cost import CostModel
from prefixserving_lab.models.replay_engine import EngineShape
from prefixserving_lab.workloads import segments as workloads
from prefixserving_lab.workloads.segments import Workload
from prefixserving_lab.workloads.traces import AZURE_CODE_FILE, MOONCAKE_FILE

# Trace rows at scale 1.0 (the Mooncake file has 3,993; the Azure code one 8,818).
MOONCAKE_ROWS = 2000
AZURE_ROWS = 2000


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What every builder gets: the cost model (arrival rates), the base engine shape (a
    ``num_blocks`` > 0 there fixes the cache size), the seed, the scale, the traces folder
    and an optional cache fraction that replaces each workload's own."""

    cost: CostModel
    base: EngineShape
    seed: int = 0
    scale: float = 1.0
    traces: Path = Path(".")
    cache_fraction: float | None = None
    load: float | None = None
    header_tokens: int = 0

    def fraction(self, default: float) -> float:
        return default if self.cache_fraction is None else self.cache_fraction

    def offered(self, default: float) -> float:
        return default if self.load is None else self.load

    def header(self) -> str:
        return f", {self.header_tokens}-token common header" if self.header_tokens else ""


Builder = Callable[[BuildContext], Workload]


def _n(value: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, math.ceil(value * scale))


def _gsp(
    name: str,
    *,
    cold: bool,
    cache_fraction: float,
    threshold: int = 0,
    load: float = 0.9,
    max_num_seqs: int | None = None,
) -> Builder:
    def build(ctx: BuildContext) -> Workload:
        groups = _n(64, ctx.scale, 2)
        fraction = ctx.fraction(cache_fraction)
        offered = ctx.offered(load)
        return workloads.gsp(
            name=name,
            description=(
                f"{groups} groups x 16 prompts (2048 shared + 128 tokens, 256 out)"
                + (f", {groups * 2} cold" if cold else "")
                + f", cache {fraction:g} of prefixes"
                + (f", long_prefill_token_threshold {threshold}" if threshold else "")
                + f", load {offered:g}"
                + (f", max_num_seqs {max_num_seqs}" if max_num_seqs else "")
                + ctx.header()
            ),
            cost=ctx.cost,
            base=replace(
                ctx.base,
                long_prefill_token_threshold=threshold,
                max_num_seqs=max_num_seqs or ctx.base.max_num_seqs,
            ),
            seed=ctx.seed,
            groups=groups,
            cold_requests=groups * 2 if cold else 0,
            cache_fraction=fraction,
            load=offered,
            header_tokens=ctx.header_tokens,
        )

    return build


def _docs(ctx: BuildContext) -> Workload:
    docs = _n(16, ctx.scale, 2)
    fraction = ctx.fraction(0.5)
    return workloads.gsp(
        name="docs",
        description=f"{docs} documents x 8 questions (12288 shared + 128 tokens, 64 out), "
        f"{docs} cold, budget 8192, cache {fraction:g} of documents, "
        f"load {ctx.offered(0.9):g}{ctx.header()}",
        cost=ctx.cost,
        base=replace(ctx.base, max_num_batched_tokens=8192),
        seed=ctx.seed,
        groups=docs,
        prompts_per_group=8,
        system_tokens=12288,
        question_tokens=128,
        output_tokens=64,
        cold_requests=docs,
        cache_fraction=fraction,
        load=ctx.offered(0.9),
        header_tokens=ctx.header_tokens,
    )


def _mooncake(speed: float) -> Builder:
    def build(ctx: BuildContext) -> Workload:
        rows = _n(MOONCAKE_ROWS, ctx.scale, 20)
        fraction = ctx.fraction(0.25)
        return workloads.mooncake(
            ctx.traces / MOONCAKE_FILE,
            name=f"mooncake-{speed:g}x",
            description=f"first {rows} rows, load {ctx.offered(0.5):g} at 1x, time compressed "
            f"{speed:g}x, cache {fraction:g} of shared blocks{ctx.header()}",
            cost=ctx.cost,
            base=ctx.base,
            time_scale=speed,
            limit=rows,
            cache_fraction=fraction,
            load=ctx.offered(0.5),
            seed=ctx.seed,
            header_tokens=ctx.header_tokens,
        )

    return build


def _sessions(name: str, sessions: int, what: str, **shape: Any) -> Builder:
    """Closed-loop sessions (:func:`workloads.sessions`): ``sessions`` of them at scale 1,
    ``shape`` the rest of its arguments, ``what`` how the description names their parts."""

    def build(ctx: BuildContext) -> Workload:
        n = _n(sessions, ctx.scale, 2)
        fraction, load = ctx.fraction(0.5), ctx.offered(0.9)
        return workloads.sessions(
            name=name,
            description=f"{n} sessions x {shape['turns']} turns ({what}), {shape['think_s']:g} s "
            f"think time, cache {fraction:g} of shared blocks, load {load:g}{ctx.header()}",
            cost=ctx.cost,
            base=ctx.base,
            seed=ctx.seed,
            sessions=n,
            cache_fraction=fraction,
            load=load,
            header_tokens=ctx.header_tokens,
            **shape,
        )

    return build


def _azure(ctx: BuildContext) -> Workload:
    rows = _n(AZURE_ROWS, ctx.scale, 20)
    return workloads.azure(
        ctx.traces / AZURE_CODE_FILE,
        name="azure-code",
        description=f"first {rows} rows, unique prompts (no sharing), load {ctx.offered(0.8):g}",
        cost=ctx.cost,
        base=ctx.base,
        limit=rows,
        load=ctx.offered(0.8),
        seed=ctx.seed,
    )


def _real_check(ctx: BuildContext) -> Workload:
    return workloads.gsp(
        name="real-check",
        description="4 groups x 6 prompts (1536 shared + 64 tokens, 8 out), 2 req/s, "
        "block 128, budget 1024, long_prefill_token_threshold 256, cache 1024 blocks",
        cost=ctx.cost,
        base=replace(
            ctx.base,
            num_blocks=1024,
            block_size=128,
            max_num_batched_tokens=1024,
            long_prefill_token_threshold=256,
        ),
        seed=ctx.seed,
        groups=4,
        prompts_per_group=6,
        system_tokens=1536,
        question_tokens=64,
        output_tokens=8,
        rate_rps=2.0,
    )


STANDARD: dict[str, Builder] = {
    "gsp-q25": _gsp("gsp-q25", cold=False, cache_fraction=0.25),
    "gsp-cold-q25": _gsp("gsp-cold-q25", cold=True, cache_fraction=0.25),
    "gsp-cold-full": _gsp("gsp-cold-full", cold=True, cache_fraction=1.0),
    "gsp-cold-big": _gsp("gsp-cold-big", cold=True, cache_fraction=4.0, load=1.2, max_num_seqs=32),
    "gsp-chunked": _gsp("gsp-chunked", cold=True, cache_fraction=0.5, threshold=512),
    "docs": _docs,
    "mooncake-1x": _mooncake(1.0),
    "mooncake-4x": _mooncake(4.0),
    "mooncake-16x": _mooncake(16.0),
    "chat-multiturn": _sessions(
        "chat-multiturn",
        64,
        "8 system prompts of 1024 tokens, a 256-token first message, each turn + its 128-token "
        "answer + a 128-token message",
        turns=6,
        systems=8,
        system_tokens=1024,
        first_message_tokens=256,
        message_tokens=128,
        output_tokens=128,
        think_s=5.0,
    ),
    "agent-loop": _sessions(
        "agent-loop",
        32,
        "one 4096-token tool-definition prompt, a 512-token task, each step + its 64-token tool "
        "call + a 1024-token tool output",
        turns=8,
        systems=1,
        system_tokens=4096,
        first_message_tokens=512,
        message_tokens=1024,
        output_tokens=64,
        think_s=0.5,
    ),
    "azure-code": _azure,
    "real-check": _real_check,
}
# The common header of the +hdr variants: a chat template's header and date lines, rounded
# up to whole blocks at block size 16 and 64.
HEADER_TOKENS = 64
HEADER_BLOCK_SIZES = (16, 64)
# Workloads built for sharing (the goals apply) and the control; real-check only compares
# rankings with the real engine.
CONTROL = ("azure-code",)
_BASE_SHARING = tuple(name for name in STANDARD if name not in (*CONTROL, "real-check"))


def _with_header(builder: Builder, block_size: int) -> Builder:
    def build(ctx: BuildContext) -> Workload:
        # The same cache in tokens as the base engine (a fixed --cache-blocks is in its blocks).
        blocks = ctx.base.num_blocks * ctx.base.block_size // block_size
        base = replace(ctx.base, block_size=block_size, num_blocks=blocks)
        workload = builder(replace(ctx, base=base, header_tokens=HEADER_TOKENS))
        return replace(workload, name=f"{workload.name}+hdr{block_size}")

    return build


for _name in _BASE_SHARING:
    for _size in HEADER_BLOCK_SIZES:
        STANDARD[f"{_name}+hdr{_size}"] = _with_header(STANDARD[_name], _size)
SHARING = tuple(name for name in STANDARD if name not in (*CONTROL, "real-check"))
# The load sweep: each workload of SWEEP at each load (x the estimated capacity). The trace's
# 4x and 16x compressions are load points of mooncake-1x, so the sweep keeps only that one.
# Ordered cheapest first (the control, the plain workloads, then the header variants, 16-token
# blocks last), so a run stopped early still has every kind of workload.
SWEEP_LOADS = (0.5, 0.8, 1.0, 1.2)
_SWEEP_BASE = tuple(n for n in _BASE_SHARING if n not in ("mooncake-4x", "mooncake-16x"))
SWEEP = (
    *CONTROL,
    *_SWEEP_BASE,
    *(f"{n}+hdr{size}" for size in reversed(HEADER_BLOCK_SIZES) for n in _SWEEP_BASE),
)


def check(names: Sequence[str], ctx: BuildContext) -> None:
    """Refuse a scale outside (0, 1] or an unknown name (``KeyError`` lists the known ones)."""
    if not 0 < ctx.scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {ctx.scale}")
    unknown = [n for n in names if n not in STANDARD]
    if unknown:
        raise KeyError(f"unknown workload(s) {unknown}; known: {', '.join(STANDARD)}")


def build(names: Sequence[str], ctx: BuildContext) -> list[Workload]:
    """Build the named standard workloads (after :func:`check`)."""
    check(names, ctx)
    return [STANDARD[n](ctx) for n in names]


def role(name: str) -> str:
    """``sharing``, ``control`` or ``other`` (which goals apply to the workload)."""
    return "sharing" if name in SHARING else "control" if name in CONTROL else "other"
