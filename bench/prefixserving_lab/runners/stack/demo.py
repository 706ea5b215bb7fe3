"""The README's main job: PrefixServing's stack against a baseline stack, side by side.

Both stacks run the same programs on the same machine, one after the other, and replay the
same shared-prefix chat workload (:mod:`prefixserving_lab.workloads.prompts`) through their router:

- ``prefixserving``: two engines with the PEEK scheduler, the ``prefix-affinity`` router,
  and a warm-up sidecar per engine that pre-fills the prefix list (the group system prompts
  the operator would put in ``spec.warmup.prompts``) before the engine takes traffic.
- ``baseline``: two engines with vLLM's stock scheduler, a ``round-robin`` router, no warm-up.

Reported per stack: hit rate (cached prompt tokens / prompt tokens, from the engines'
``vllm:prefix_cache_*`` counters over the replay), client TTFT p50/p99, throughput, errors.
Writes ``demo.json``, ``demo.md`` and ``demo.png`` to the output folder.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.reports.demo import chart, markdown
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.client import RequestResult, replay
from prefixserving_lab.runners.stack.engines import MODEL_NAME, Engine, sum_metric
from prefixserving_lab.runners.stack.local import StackConfig, running_stack
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.prompts import PrefixGroups, TimedRequest

QUESTION_WORDS = 24


@dataclass(frozen=True)
class DemoWorkload:
    """The demo's chat requests: ``groups`` system prompts of ``system_words`` words, each with
    ``per_group`` 24-word questions (:class:`~prefixserving_lab.workloads.prompts.PrefixGroups`),
    shuffled, Poisson arrivals at ``rate_per_s``."""

    groups: int = 8
    per_group: int = 8
    system_words: int = 600
    max_tokens: int = 8
    rate_per_s: float = 3.0
    seed: int = 0

    @property
    def prefix_groups(self) -> PrefixGroups:
        return PrefixGroups(
            groups=self.groups,
            per_group=self.per_group,
            prefix_len=self.system_words,
            suffix_len=QUESTION_WORDS,
            rate_per_s=self.rate_per_s,
            seed=self.seed,
        )

    def requests(self) -> list[TimedRequest]:
        return self.prefix_groups.requests("chat", model=MODEL_NAME, max_tokens=self.max_tokens)

    def warmup_prompts(self) -> list[dict[str, object]]:
        """The prefix list: each group's system prompt, as clients send it."""
        return self.prefix_groups.warmup_prompts()


@dataclass(frozen=True)
class StackResult:
    stack: str
    scheduler: str
    router_policy: str
    warmup: bool
    requests: int
    errors: int
    hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    throughput_rps: float
    duration_s: float


def _prefix_counters(engines: list[Engine]) -> tuple[float, float]:
    texts = [engine.metrics_text() for engine in engines]
    hits = sum(sum_metric(t, "vllm:prefix_cache_hits_total") for t in texts)
    queries = sum(sum_metric(t, "vllm:prefix_cache_queries_total") for t in texts)
    return hits, queries


def run_stack(config: StackConfig, workload: DemoWorkload) -> StackResult:
    """Start one stack, replay the workload through its router, stop it."""
    requests = workload.requests()
    with running_stack(config) as stack:
        hits0, queries0 = _prefix_counters(stack.engines)
        with tqdm(total=len(requests), desc=f"{config.name:>13}", unit="req") as bar:
            results: list[RequestResult] = asyncio.run(
                replay(stack.router_url, requests, on_done=lambda _: bar.update())
            )
            duration = bar.format_dict["elapsed"]
        hits1, queries1 = _prefix_counters(stack.engines)
    ok = [r for r in results if r.ok]
    ttfts = sorted(r.ttft_s for r in ok)
    return StackResult(
        stack=config.name,
        scheduler=config.scheduler,
        router_policy=config.router_policy,
        warmup=bool(config.warmup_prompts),
        requests=len(results),
        errors=len(results) - len(ok),
        hit_rate=(hits1 - hits0) / max(queries1 - queries0, 1.0),
        ttft_p50_s=quantile(ttfts, 0.5),
        ttft_p99_s=quantile(ttfts, 0.99),
        throughput_rps=len(ok) / duration if duration else 0.0,
        duration_s=duration,
    )


def stacks(workload: DemoWorkload, engines: int = 2) -> list[StackConfig]:
    """PrefixServing's stack and the baseline's, ``engines`` engines each."""
    return [
        StackConfig(
            name="prefixserving",
            scheduler="peek",
            router_policy="prefix-affinity",
            engines=engines,
            warmup_prompts=workload.warmup_prompts(),
        ),
        StackConfig(
            name="baseline", scheduler="fcfs", router_policy="round-robin", engines=engines
        ),
    ]


def run_demo(out_dir: Path, workload: DemoWorkload, engines: int = 2) -> list[StackResult]:
    """Run both stacks, write demo.json, demo.md and demo.png; return the results."""
    record = machine()
    results = [run_stack(config, workload) for config in stacks(workload, engines)]
    payload = {
        "benchmark": "demo",
        "machine": record,
        "engines": engines,
        "workload": asdict(workload),
        "stacks": [asdict(r) for r in results],
    }
    write_results(out_dir, "demo", payload, markdown(results, machine_line(record)))
    chart(results, out_dir / "demo.png")
    return results
