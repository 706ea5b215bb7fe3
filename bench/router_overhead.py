"""Proxy overhead of the prefix router (issue 5, benchmark 3).

Setup, all on loopback:

- a fast fake engine (a bare asyncio HTTP/1.1 responder in its own process): a streamed
  completion sends ``--chunks`` server-sent events ``--chunk-interval-ms`` apart (a 40 token/s
  stream by default), a non-streamed one answers a fixed JSON body at once;
- the router (``prefixserving router``, policy ``prefix-affinity``), pinned to one core with
  ``taskset``;
- a load generator (the router's own upstream client, :mod:`prefixserving.router.upstream`)
  holding ``C`` concurrent keep-alive connections, each a loop of streamed completions with
  text prompts that share 1 KiB prefixes in 16 groups.

Router CPU per request: a fixed number of non-streamed and of 16-chunk streamed requests,
three times each, with the router process's user + system CPU time (``/proc/PID/stat``) read
before and after; the median and the minimum are reported. Unlike latency, the non-streamed
figure barely moves when other jobs share the machine, so it is the one to compare between
router versions. The streamed figure does move: a router kept off its core by other jobs finds
several chunks waiting per wake-up and passes them in one read and one write, so it spends
less CPU per request than on an idle machine.

Added latency: each concurrency level runs twice against the fake engine directly and twice
through the router, alternating (direct, routed, direct, routed); the time to the first chunk
(TTFB) is pooled per mode, and the added latency at a percentile is routed minus direct at
that percentile. The router's own ``prefixserving_router_added_latency_seconds`` histogram
(time spent in the router before the upstream request and after the first upstream byte) is
reported next to it. Maximum requests per second: non-streamed completions from 64
concurrent clients through the router processes.

The fake engine and the load generator share the last core of the machine; the routers get
the others (on a 2-core machine: one). So on 2 cores the client side can limit the rates; the
report says when the router was not the bottleneck.

Spreading the router: ``--routers N`` starts N router processes on their own ports, and each
client connection sends to one of them in turn (client ``w`` to router ``w mod N``), as a
client or a Service that spreads load would; ``--workers W`` starts each router with
``--workers W`` (W processes on one port, the kernel spreads the connections). Router
process ``i`` is pinned to W router cores of its own while there are enough (then they are
shared, in turn). Router CPU is that of every router process and its workers. The router's own
histogram is merged over the router processes; with ``--workers`` above 1 it is left out, as
each worker keeps its own metrics and a scrape reaches one of them.

Run: ``.venv/bin/python bench/router_overhead.py`` (about 3 minutes). Writes
``router-overhead.json`` and ``.md`` (``--name``) to ``--out`` (``bench/results``);
``--duration-s`` and ``--cpu-scale`` shorten every phase. On a machine with spare cores:
``--routers 2 --name router-overhead-2routers`` and ``--workers 2 --name
router-overhead-2workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import click
import httpx
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from prefixserving.router.upstream import UpstreamError, UpstreamPool
from prefixserving_lab.machine import load_average_1m, machine, machine_line
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.stack.processes import (
    free_port,
    stop_process,
    tree_cpu_seconds,
    wait_http_ok,
)
from prefixserving_lab.stats import quantile
from prefixserving_lab.workloads.prompts import PrefixGroups

RESULTS = Path(__file__).resolve().parent / "results"
START_TIMEOUT_S = 60.0
GOAL_P99_MS = 2.0
CONCURRENCY = (1, 50, 200)  # concurrent streams; 1 shows the path with no queueing at all

# --- The fake engine --------------------------------------------------------------------------

_JSON_BODY = json.dumps(
    {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "ok"}]}
).encode()
_JSON_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(_JSON_BODY)).encode()
    + b"\r\n\r\n"
)
_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)
_METRICS = (
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n'
)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class FakeEngineProtocol(asyncio.Protocol):
    """A minimal HTTP/1.1 server: keep-alive, Content-Length bodies, no pipelining."""

    chunks = 16
    interval_s = 0.025

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.busy:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1")
        length = 0
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        path = head.split(" ", 2)[1]
        self.respond(path, body)

    def respond(self, path: str, body: bytes) -> None:
        assert self.transport is not None
        if path.startswith(("/metrics", "/health")):
            text = _METRICS if path.startswith("/metrics") else b""
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: " + str(len(text)).encode() + b"\r\n\r\n"
            )
            self.transport.write(text)
        elif b'"stream": true' in body or b'"stream":true' in body:
            self.busy = True
            self.transport.write(_STREAM_HEAD + _chunk(b'data: {"i": 0}\n\n'))
            self.next_chunk(1)
        else:
            self.transport.write(_JSON_HEAD + _JSON_BODY)

    def next_chunk(self, i: int) -> None:
        """Send chunk ``i`` after ``interval_s`` (a timer chain: no task per stream)."""
        asyncio.get_running_loop().call_later(self.interval_s, self.send_chunk, i)

    def send_chunk(self, i: int) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        if i < self.chunks:
            self.transport.write(_chunk(b'data: {"i": %d}\n\n' % i))
            self.next_chunk(i + 1)
            return
        self.transport.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        self.busy = False
        if self.buffer:
            self.data_received(b"")


async def _serve_fake_engine(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(
        FakeEngineProtocol, "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


# --- Processes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cores:
    """Where the processes run: the fake engine and the load generator on ``client``, router
    process ``i`` on ``routers[i]`` (its workers inherit it)."""

    client: int
    routers: tuple[tuple[int, ...], ...]

    @classmethod
    def plan(cls, available: list[int], routers: int, workers: int) -> Cores:
        """The last available core for the client side, the others (or the only one) dealt to
        the router processes ``workers`` at a time, in turn."""
        cores = sorted(available)
        pool = cores[:-1] or cores
        deal = [pool[k % len(pool)] for k in range(routers * workers)]
        return cls(
            cores[-1],
            tuple(
                tuple(sorted(set(deal[i * workers : (i + 1) * workers]))) for i in range(routers)
            ),
        )


def _core_list(cores: tuple[int, ...] | list[int]) -> str:
    return ",".join(map(str, cores))


@contextlib.contextmanager
def process(command: list[str], cores: tuple[int, ...]) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` pinned to ``cores`` (``taskset``), stopped on exit."""
    proc = subprocess.Popen(
        ["taskset", "-c", _core_list(cores), *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        stop_process(proc)


# --- Load -------------------------------------------------------------------------------------


# Text prompts in 16 groups sharing about 1 KiB each (the router keys them; the fake engine
# ignores them), cycled through by the load generator.
PROMPTS = [
    request.body["prompt"]
    for request in PrefixGroups(groups=16, per_group=64, prefix_len=170, suffix_len=4).requests(
        "text", model="m", max_tokens=16
    )
]


@dataclass
class Phase:
    ttfb_s: list[float]
    requests: int
    errors: int
    elapsed_s: float


_HEADERS = [(b"content-type", b"application/json")]


async def run_load(
    bases: list[str],
    concurrency: int,
    duration_s: float,
    stream: bool,
    max_requests: int | None = None,
    spread_s: float = 0.0,
) -> Phase:
    """``concurrency`` clients, each sending requests back to back for ``duration_s`` or until
    ``max_requests`` were sent in all (client ``w`` to ``bases[w mod len(bases)]``), over the
    router's own upstream client (a fraction of an HTTP client library's CPU, so the load
    generator and the fake engine can share one core without queueing behind each other). TTFB:
    until the first body bytes.

    Client ``w`` sends its first request ``spread_s * w / concurrency`` after the start. With
    ``spread_s`` one stream's duration, the streams start and end evenly spread instead of in
    waves of ``concurrency`` requests that arrive within the same millisecond (streams of equal
    length keep a closed loop in step: a wave at the start stays a wave)."""
    upstream = UpstreamPool(connect_timeout_s=5.0, max_idle_per_backend=concurrency)
    ttfb: list[float] = []
    counts = {"requests": 0, "errors": 0, "sent": 0}
    limit = max_requests if max_requests is not None else float("inf")
    stop_at = time.perf_counter() + duration_s

    async def client(worker: int) -> None:
        base = bases[worker % len(bases)]
        await asyncio.sleep(spread_s * worker / concurrency)
        i = worker
        while time.perf_counter() < stop_at and counts["sent"] < limit:
            counts["sent"] += 1
            body = {"model": "m", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16}
            body["stream"] = stream
            i += concurrency
            started = time.perf_counter()
            try:
                response = await upstream.request(
                    base, "POST", "/v1/completions", _HEADERS, json.dumps(body).encode()
                )
                await response.read()
                ttfb.append(time.perf_counter() - started)
                while await response.read():
                    pass
                response.release()
                if response.status != 200:
                    counts["errors"] += 1
            except (UpstreamError, OSError, TimeoutError):
                counts["errors"] += 1
            counts["requests"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    upstream.close()
    return Phase(ttfb, counts["requests"], counts["errors"], elapsed)


CPU_WORKLOADS = {  # name: (concurrent clients, requests per repeat, streamed)
    "non-streamed": (64, 3000, False),
    "streamed, 16 chunks": (200, 1000, True),
}
CPU_REPEATS = 3


async def measure_cpu(
    routers: list[str], router_pids: list[int], stream_s: float, scale: float
) -> dict[str, dict[str, float]]:
    """Router CPU milliseconds per request for each of ``CPU_WORKLOADS`` (median and minimum
    of ``CPU_REPEATS`` fixed-count runs, counts times ``scale``; all router processes)."""
    out = {}
    for name, (clients, full_count, stream) in CPU_WORKLOADS.items():
        requests = max(1, round(full_count * scale))
        per_request_ms = []
        errors = 0
        for _ in range(CPU_REPEATS):
            before = routers_cpu_seconds(router_pids)
            phase = await run_load(
                routers,
                clients,
                120.0,
                stream,
                max_requests=requests,
                spread_s=stream_s if stream else 0.0,
            )
            per_request_ms.append(
                (routers_cpu_seconds(router_pids) - before) / phase.requests * 1000
            )
            errors += phase.errors
        out[name] = {
            "clients": clients,
            "requests_per_repeat": requests,
            "cpu_ms_per_request_median": quantile(per_request_ms, 0.5),
            "cpu_ms_per_request_min": min(per_request_ms),
            "errors": errors,
        }
    return out


def routers_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds so far of the router processes and their workers."""
    return sum(tree_cpu_seconds(pid) for pid in pids)


def histogram_quantiles(metrics_texts: list[str], name: str) -> dict[str, float]:
    """p50/p99 (upper bucket bound) of a Prometheus histogram summed over the expositions
    ``metrics_texts``, in ms, and its count."""
    counts: dict[float, float] = {}
    for text in metrics_texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{name}_bucket":
                    le = float(sample.labels["le"])
                    counts[le] = counts.get(le, 0.0) + sample.value
    buckets = sorted(counts.items())
    total = buckets[-1][1] if buckets else 0.0
    out = {"count": total}
    for q in (50, 99):
        bound = next((le for le, c in buckets if c >= total * q / 100), float("inf"))
        out[f"p{q}_ms_at_most"] = bound * 1000
    return out


async def measure(
    engine: str,
    routers: list[str],
    router_pids: list[int],
    duration_s: float,
    stream_s: float,
    cpu_scale: float,
    histogram: bool,
) -> dict[str, object]:
    """All measurements; ``stream_s`` is one stream's duration (see :func:`run_load`);
    ``histogram``: read the routers' own added-latency histogram (None in the results if not)."""
    out: dict[str, object] = {}
    for concurrency in CONCURRENCY:
        pooled: dict[str, Phase] = {}
        router_cpu_s = 0.0
        for _ in range(2):
            for mode, bases in (("direct", [engine]), ("routed", routers)):
                cpu_before = routers_cpu_seconds(router_pids)
                phase = await run_load(
                    bases, concurrency, duration_s, stream=True, spread_s=stream_s
                )
                if mode == "routed":
                    router_cpu_s += routers_cpu_seconds(router_pids) - cpu_before
                if mode in pooled:
                    prior = pooled[mode]
                    phase = Phase(
                        prior.ttfb_s + phase.ttfb_s,
                        prior.requests + phase.requests,
                        prior.errors + phase.errors,
                        prior.elapsed_s + phase.elapsed_s,
                    )
                pooled[mode] = phase
        row: dict[str, object] = {}
        for mode, phase in pooled.items():
            row[mode] = {
                "requests": phase.requests,
                "errors": phase.errors,
                "req_per_s": phase.requests / phase.elapsed_s,
                "ttfb_p50_ms": quantile(phase.ttfb_s, 0.5) * 1000,
                "ttfb_p99_ms": quantile(phase.ttfb_s, 0.99) * 1000,
            }
        for q in (50, 99):
            key = f"ttfb_p{q}_ms"
            row[f"added_p{q}_ms"] = row["routed"][key] - row["direct"][key]  # type: ignore[index]
        row["router_cpu_ms_per_request"] = router_cpu_s / max(pooled["routed"].requests, 1) * 1000
        out[str(concurrency)] = row
    out["router_histogram"] = (
        histogram_quantiles(
            [httpx.get(f"{router}/metrics", timeout=5).text for router in routers],
            "prefixserving_router_added_latency_seconds",
        )
        if histogram
        else None
    )
    throughput: dict[str, dict[str, float]] = {}
    for mode, bases in (("direct", [engine]), ("routed", routers)):
        cpu_before = routers_cpu_seconds(router_pids)
        phase = await run_load(bases, 64, duration_s, stream=False)
        throughput[mode] = {
            "requests": phase.requests,
            "errors": phase.errors,
            "req_per_s": phase.requests / phase.elapsed_s,
        }
    cpu_ms = (routers_cpu_seconds(router_pids) - cpu_before) / max(phase.requests, 1) * 1000
    throughput["routed"]["router_cpu_ms_per_request"] = cpu_ms
    throughput["routed"]["req_per_s_per_busy_core"] = 1000 / cpu_ms if cpu_ms else float("nan")
    out["max_throughput_64_clients"] = throughput
    out["cpu_per_request"] = await measure_cpu(routers, router_pids, stream_s, cpu_scale)
    return out


def markdown(result: dict) -> str:
    params = result["params"]
    routers, workers = params["routers"], params["workers"]
    placement = "; ".join(
        f"router {i} on core(s) {_core_list(cores)}"
        for i, cores in enumerate(params["router_cores"])
    )
    lines = [
        "# Router proxy overhead",
        "",
        f"Machine: {machine_line(result['machine'])} at the start, load average "
        f"{result['load_average_end']} at the end. {routers} router process(es), each with "
        f"{workers} worker(s): {placement}; fake engine and load generator share core "
        f"{params['client_core']}"
        + (f"; client connection w sends to router w mod {routers}." if routers > 1 else "."),
        f"Streams: {result['params']['chunks']} chunks, {result['params']['chunk_interval_ms']} ms "
        f"apart; {result['params']['duration_s']} s per phase, direct and routed alternated twice. "
        "Each client connection sends requests back to back; their first requests are spread "
        "over one stream's duration, so requests arrive evenly rather than in waves.",
        "",
        "| concurrent streams | direct TTFB p50 / p99 (ms) | routed TTFB p50 / p99 (ms) "
        "| added p50 / p99 (ms) | routed req/s | router CPU per request (ms) | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in map(str, CONCURRENCY):
        row = result["results"][c]
        d, r = row["direct"], row["routed"]
        # At a few requests per second the router's scrape loop dominates its CPU time.
        cpu = f"{row['router_cpu_ms_per_request']:.2f}" if r["requests"] >= 100 else "-"
        lines.append(
            f"| {c} | {d['ttfb_p50_ms']:.2f} / {d['ttfb_p99_ms']:.2f} "
            f"| {r['ttfb_p50_ms']:.2f} / {r['ttfb_p99_ms']:.2f} "
            f"| {row['added_p50_ms']:.2f} / {row['added_p99_ms']:.2f} "
            f"| {r['req_per_s']:.0f} | {cpu} | {r['errors']} |"
        )
    lines += [
        "",
        f"Router CPU per request (user + system time of the router processes over a fixed number "
        f"of requests, {CPU_REPEATS} repeats; the non-streamed figure is the one to compare "
        "between router versions, the streamed one drops when other jobs delay the router):",
        "",
        "| requests | concurrent clients | requests per repeat | CPU per request, median / min "
        "(ms) | requests/s on one busy core | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in result["results"]["cpu_per_request"].items():
        median = row["cpu_ms_per_request_median"]
        lines.append(
            f"| {name} | {row['clients']} | {row['requests_per_repeat']} "
            f"| {median:.3f} / {row['cpu_ms_per_request_min']:.3f} "
            # A tiny run can use less CPU than one clock tick: no rate to give.
            f"| {f'{1000 / median:.0f}' if median > 0 else '-'} | {row['errors']} |"
        )
    h = result["results"]["router_histogram"]
    histogram = (
        f"Router's own added-latency histogram over all streamed requests: p50 <= "
        f"{h['p50_ms_at_most']:.2f} ms, p99 <= {h['p99_ms_at_most']:.2f} ms "
        f"({int(h['count'])} requests)."
        if h is not None
        else "Router's own added-latency histogram: not shown, as each of a router's workers "
        "keeps its own metrics and a scrape reaches one of them."
    )
    t = result["results"]["max_throughput_64_clients"]
    goal = result["goal_met"]
    busy = result["results"]["200"]
    share = busy["routed"]["req_per_s"] * busy["router_cpu_ms_per_request"] / 1000
    lines += [
        "",
        f"At 200 streams the router processes used {share:.0%} of one core in all (routed "
        "req/s x CPU per request). The 1-stream row is the added latency without any "
        "queueing (the router's work plus one more hop on loopback); what the busier rows add "
        "on top of it is time a request waited in the router's event loop behind other "
        "requests and chunks. "
        "(No CPU figure for 1 stream: at a few requests per second the router's scrape of the "
        "engine's metrics every second dominates its CPU time.)",
        "",
        histogram,
        "",
        f"Maximum rate, non-streamed, 64 clients: routed {t['routed']['req_per_s']:.0f} req/s, "
        f"direct {t['direct']['req_per_s']:.0f} req/s "
        f"({t['routed']['errors']} errors routed). The router used "
        f"{t['routed']['router_cpu_ms_per_request']:.2f} ms of CPU per request, i.e. about "
        f"{t['routed']['req_per_s_per_busy_core']:.0f} req/s per busy core.",
        "",
        f"Goal p99 added latency <= {GOAL_P99_MS} ms at 200 concurrent streams: "
        f"**{'met' if goal else 'not met'}** (client-measured added p99 "
        f"{result['results']['200']['added_p99_ms']:.2f} ms).",
        "",
        f"Reproduce: `.venv/bin/python bench/router_overhead.py{params['options']}`.",
    ]
    return "\n".join(lines)


@click.group(invoke_without_command=True)
@click.option("--duration-s", type=float, default=6.0, show_default=True)
@click.option("--chunks", type=int, default=16, show_default=True)
@click.option("--chunk-interval-ms", type=float, default=25.0, show_default=True)
@click.option(
    "--cpu-scale",
    type=click.FloatRange(0, 1, min_open=True),
    default=1.0,
    show_default=True,
    help="Fraction of the CPU-per-request workloads' request counts to send.",
)
@click.option(
    "--routers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Router processes on their own ports; client connections spread over them in turn.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Each router's --workers (processes sharing its port).",
)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
@click.option("--name", default="router-overhead", show_default=True, help="Results file name.")
@click.pass_context
def main(
    ctx: click.Context,
    duration_s: float,
    chunks: int,
    chunk_interval_ms: float,
    cpu_scale: float,
    routers: int,
    workers: int,
    out: Path,
    name: str,
) -> None:
    """Measure the router's added latency and its maximum request rate."""
    if ctx.invoked_subcommand is not None:
        return
    cores = Cores.plan(list(os.sched_getaffinity(0)), routers, workers)
    engine_port = free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    fake = [sys.executable, __file__, "engine", "--port", str(engine_port)]
    fake += ["--chunks", str(chunks), "--chunk-interval-ms", str(chunk_interval_ms)]
    bases = [f"http://127.0.0.1:{free_port()}" for _ in range(routers)]
    record = machine()
    with contextlib.ExitStack() as stack:
        fake_proc = stack.enter_context(process(fake, (cores.client,)))
        router_procs = []
        for base, router_cores in zip(bases, cores.routers, strict=True):
            command = [sys.executable, "-m", "prefixserving.cli", "router", "--host", "127.0.0.1"]
            command += ["--port", base.rsplit(":", 1)[1], "--backend", engine, "--model", "m"]
            command += ["--workers", str(workers)]
            router_procs.append(stack.enter_context(process(command, router_cores)))
        wait_http_ok(f"{engine}/health", fake_proc, "the fake engine", START_TIMEOUT_S)
        for base, proc in zip(bases, router_procs, strict=True):
            wait_http_ok(f"{base}/readyz", proc, f"the router at {base}", START_TIMEOUT_S)
        os.sched_setaffinity(0, {cores.client})
        stream_s = chunks * chunk_interval_ms / 1000
        pids = [proc.pid for proc in router_procs]
        results = uvloop.run(
            measure(engine, bases, pids, duration_s, stream_s, cpu_scale, histogram=workers == 1)
        )
    # The spreading options as given, for the reproduce line.
    options = "".join(
        f" --{flag} {ctx.params[flag]}"
        for flag in ("routers", "workers", "name")
        if ctx.get_parameter_source(flag) is not click.core.ParameterSource.DEFAULT
    )
    result = {
        "benchmark": "router-overhead",
        "machine": record,
        "load_average_end": load_average_1m(),
        "params": {
            "duration_s": duration_s,
            "chunks": chunks,
            "chunk_interval_ms": chunk_interval_ms,
            "cpu_scale": cpu_scale,
            "policy": "prefix-affinity",
            "routers": routers,
            "workers": workers,
            "router_cores": [list(c) for c in cores.routers],
            "client_core": cores.client,
            "options": options,
        },
        "results": results,
        "goal_met": results["200"]["added_p99_ms"] <= GOAL_P99_MS,  # type: ignore[index]
    }
    json_path, md_path = write_results(out, name, result, markdown(result))
    click.echo(md_path.read_text())
    click.echo(f"wrote {json_path} and {md_path}")


@main.command("engine")
@click.option("--port", type=int, required=True)
@click.option("--chunks", type=int, default=16)
@click.option("--chunk-interval-ms", type=float, default=25.0)
def engine_command(port: int, chunks: int, chunk_interval_ms: float) -> None:
    """Run the fast fake engine (started by the benchmark itself)."""
    FakeEngineProtocol.chunks = chunks
    FakeEngineProtocol.interval_s = chunk_interval_ms / 1000
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve_fake_engine(port))


if __name__ == "__main__":
    main()
