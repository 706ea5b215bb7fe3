"""Pick latency of the endpoint picker (issue 16): ``prefixserving router --mode
endpoint-picker`` on one core, driven as a gateway drives it.

Setup, all on loopback:

- the picker (the real command, TLS on as rendered by the operator, policy
  ``prefix-affinity``, four engines), pinned to one core with ``taskset``;
- four fake engines (``prefixserving_lab.runners.fake_engine``), in this process, whose
  ``/metrics`` and ``/health`` the picker scrapes for load;
- a load generator, this process on the other core: ``C`` concurrent request slots over one
  HTTP/2 connection (as Envoy multiplexes its ext_proc streams), each a loop of: open a
  ``Process`` stream, send the request headers and a chat body in 32 KiB chunks (the last
  with ``end_of_stream``), read the pick, read the echoed chunks, then play the response:
  response headers with the served endpoint, ``--response-chunks`` body chunks
  ``--chunk-interval-ms`` apart on average (exponential gaps; each echoed back), end of
  stream. Slots start at random points of one response's length, so that they do not send
  their bodies in lockstep (which would measure the burst, not the picker). With one stream
  the response is left out: one request after the other, the path with no queueing. Bodies
  share one of 16 system prompts and differ after it; the prompt size is the body size.

**Pick latency**: from the first message of the stream (request headers) to the answer that
names the endpoint, as the load generator sees it; it includes sending the body to the
picker. The picker's own ``prefixserving_router_added_latency_seconds`` (from the body's last
chunk to the answer) is reported beside it. Each cell runs ``--seconds`` (and until it holds
``MIN_PICKS`` answers) after a warm-up;
p50/p99 are ``prefixserving_lab.stats.quantile`` (linear between closest ranks). The picker's CPU
share (``/proc/PID/stat``) and the rate of picks say how loaded it was; the load
generator's CPU share says when it, not the picker, was the limit (near 100%: its own
queueing is in the figures).

Also measured: the body reader's time for each size against parsing the whole body with
``json.loads`` (what a picker that buffers and parses does), in this process.

Run: ``.venv/bin/python bench/picker_latency.py`` (about 4 minutes). Writes
``picker-latency.json`` and ``.md`` to ``--out-dir`` (``bench/results``); ``--seconds``,
``--response-chunks`` and ``--chunk-interval-ms`` shorten every cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import grpc
import httpx
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from prefixserving.router import prefix_hashing
from prefixserving.router.picker import protocol
from prefixserving.router.streamed_body import StreamedBody
from prefixserving_lab.machine import load_average_1m, machine, machine_line
from prefixserving_lab.reports.files import write_results
from prefixserving_lab.runners.fake_engine import FakeEngine, fake_engine_config, serving
from prefixserving_lab.runners.gateway import (
    chunks,
    request_body,
    request_headers,
    response_body,
    response_headers,
    trusting_credentials,
)
from prefixserving_lab.runners.stack.processes import (
    cpu_seconds,
    free_port,
    stop_process,
    wait_http_ok,
)
from prefixserving_lab.stats import quantile

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "picker-latency"
MODEL = "bench-model"
PICKER_CORE = 0
CLIENT_CORE = 1
CONCURRENCY = (1, 50, 200)
PROMPT_BYTES = (2_000, 20_000, 200_000)
CHUNK_BYTES = 32 * 1024
ENGINES = 4
GOAL = {"streams": 50, "p50_ms": 1.0, "p99_ms": 5.0}
# Answers every cell holds at least, and how long a cell may wait for them.
MIN_PICKS = 20
CELL_DEADLINE_S = 300
ANCHOR = "llm-d EPP: 1.8 ms p50, 30 ms p95 (llm-d-router#1348)"


def chat_body(index: int, size: int) -> bytes:
    """A chat body of about ``size`` bytes: one of 16 system prompts, then its own question."""
    system = f"You are assistant {index % 16}, answering from the attached documents. " * 8
    words = " ".join(f"fact-{index}-{i}" for i in range(size // 11 + 1))
    body = {
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": words[: max(size - len(system) - 120, 10)]},
        ],
        "model": MODEL,
        "stream": True,
        "max_tokens": 64,
    }
    return json.dumps(body).encode()


class BaselineProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    """The same ext_proc exchange with no picking: hold the body, answer a fixed endpoint at
    its end, echo everything. What gRPC in Python costs, whatever the picker does."""

    async def Process(self, request_iterator, context):  # type: ignore[no-untyped-def]
        held: list[bytes] = []
        async for request in request_iterator:
            kind = request.WhichOneof("request")
            if kind == "request_body":
                held.append(request.request_body.body)
                if request.request_body.end_of_stream:
                    await context.write(protocol.pick_in_headers("127.0.0.1:1"))
                    for number, chunk in enumerate(held, start=1):
                        await context.write(protocol.echo_request_body(chunk, number == len(held)))
            elif kind == "response_headers":
                await context.write(protocol.continue_response_headers())
            elif kind == "response_body":
                body = request.response_body
                await context.write(protocol.echo_response_body(body.body, body.end_of_stream))


async def run_baseline_server(port: int) -> None:
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(BaselineProcessor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextlib.contextmanager
def baseline_process(grpc_port: int) -> Iterator[int]:
    command = ["taskset", "-c", str(PICKER_CORE), sys.executable, __file__, "--serve-baseline"]
    process = subprocess.Popen([*command, str(grpc_port)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", grpc_port)) == 0:
                    break
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the baseline server did not start"
            time.sleep(0.1)
        yield process.pid
    finally:
        process.kill()
        process.wait()


@dataclass
class Cell:
    streams: int
    prompt_bytes: int
    requests: int
    seconds: float
    pick_ms: list[float]
    picker_cpu: float
    client_cpu: float
    picker_p50_ms: float
    picker_p99_ms: float
    errors: int

    def row(self) -> dict[str, object]:
        return {
            "streams": self.streams,
            "prompt_bytes": self.prompt_bytes,
            "requests": self.requests,
            "picks_per_s": round(self.requests / self.seconds, 1),
            "pick_p50_ms": round(quantile(self.pick_ms, 0.50), 3),
            "pick_p99_ms": round(quantile(self.pick_ms, 0.99), 3),
            "pick_max_ms": round(max(self.pick_ms), 3) if self.pick_ms else None,
            "picker_added_p50_ms": round(self.picker_p50_ms, 3),
            "picker_added_p99_ms": round(self.picker_p99_ms, 3),
            "picker_cpu_share": round(self.picker_cpu, 3),
            "load_generator_cpu_share": round(self.client_cpu, 3),
            "errors": self.errors,
        }


class Generator:
    """The gateway side: slots of request loops over one channel."""

    def __init__(self, channel: grpc.aio.Channel, response_chunks: int, interval_s: float):
        self.stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)
        self.random = random.Random(16)
        self.response_chunks = response_chunks
        self.interval_s = interval_s
        self.recording = False
        self.pick_ms: list[float] = []
        self.requests = 0
        self.errors = 0
        self.counter = 0

    async def one(self, size: int) -> None:
        self.counter += 1
        raw = chat_body(self.counter, size)
        parts = chunks(raw, CHUNK_BYTES)
        call = self.stub.Process()
        started = time.perf_counter()
        await call.write(request_headers())
        for number, part in enumerate(parts, start=1):
            await call.write(request_body(part, end_of_stream=number == len(parts)))
        answer = await call.read()
        if self.recording:
            self.pick_ms.append((time.perf_counter() - started) * 1000)
            self.requests += 1
        if answer.WhichOneof("response") != "request_headers":
            self.errors += 1
            call.cancel()
            return
        endpoints = answer.request_headers.response.header_mutation.set_headers[0]
        served = endpoints.header.raw_value.decode().split(",")[0]
        for _ in parts:
            await call.read()
        await call.write(response_headers(served=served))
        await call.read()
        for number in range(1, self.response_chunks + 1):
            await asyncio.sleep(self.random.expovariate(1 / self.interval_s))
            chunk = b'data: {"choices": [{"delta": {"content": "token"}}]}\n\n'
            await call.write(response_body(chunk, end_of_stream=number == self.response_chunks))
            await call.read()
        await call.done_writing()
        await call.read()

    async def slot(self, size: int, stop: asyncio.Event) -> None:
        # Slots start spread over one response's length, so they do not run in lockstep.
        await asyncio.sleep(self.random.uniform(0, self.response_chunks * self.interval_s))
        while not stop.is_set():
            try:
                await self.one(size)
            except grpc.aio.AioRpcError:
                self.errors += 1


def histogram_quantiles(before: str, after: str) -> tuple[float, float]:
    """p50 and p99 (ms, bucket upper bounds) of the picker's added latency between scrapes."""

    def buckets(text: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name == "prefixserving_router_added_latency_seconds":
                for sample in family.samples:
                    if sample.name.endswith("_bucket"):
                        out[float(sample.labels["le"])] = sample.value
        return out

    first, second = buckets(before), buckets(after)
    counts = sorted((le, second[le] - first.get(le, 0.0)) for le in second)
    total = counts[-1][1] if counts else 0.0

    def at(q: float) -> float:
        for le, cumulative in counts:
            if total and cumulative >= q * total:
                return le * 1000
        return float("nan")

    return at(0.5), at(0.99)


@contextlib.asynccontextmanager
async def picker_process(
    backends: list[str], grpc_port: int, http_port: int, tls: bool
) -> AsyncIterator[int]:
    """The picker command pinned to ``PICKER_CORE``; its pid once ready. The wait runs in a
    thread: the fake engines it scrapes answer in this event loop."""
    command = [
        "taskset",
        "-c",
        str(PICKER_CORE),
        sys.executable,
        "-m",
        "prefixserving.cli",
        "router",
        "--mode",
        "endpoint-picker",
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        "--model",
        MODEL,
        "--prefix-blocks",
        "8",
        *(["--secure-serving"] if tls else ["--no-secure-serving"]),
        *(part for url in backends for part in ("--backend", url)),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{http_port}/readyz"
        await asyncio.to_thread(wait_http_ok, url, process, "the picker", 60.0)
        yield process.pid
    finally:
        stop_process(process)


async def channel_to(grpc_port: int, tls: bool) -> grpc.aio.Channel:
    target = f"127.0.0.1:{grpc_port}"
    if not tls:
        return grpc.aio.insecure_channel(target)
    credentials, options = trusting_credentials("127.0.0.1", grpc_port)
    return grpc.aio.secure_channel(target, credentials, options=options)


async def run_cell(
    generator: Generator, pid: int, http_port: int | None, streams: int, size: int, seconds: float
) -> Cell:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(generator.slot(size, stop)) for _ in range(streams)]
    # warm-up: every slot started (they start spread over one response) and caches warm
    await asyncio.sleep(generator.response_chunks * generator.interval_s + 1.0)
    metrics = f"http://127.0.0.1:{http_port}/metrics" if http_port else None
    async with httpx.AsyncClient() as client:
        before = (await client.get(metrics)).text if metrics else ""
        generator.pick_ms, generator.requests, generator.errors = [], 0, 0
        generator.recording = True
        cpu_before, started = cpu_seconds(pid), time.perf_counter()
        client_before = cpu_seconds(os.getpid())
        await asyncio.sleep(seconds)
        # However slow the machine, a cell holds MIN_PICKS answers (a short run on busy cores
        # may have none after --seconds); a picker that stops answering fails the run.
        deadline = time.perf_counter() + CELL_DEADLINE_S
        while generator.requests < MIN_PICKS:
            if time.perf_counter() > deadline:
                raise RuntimeError(
                    f"{streams} streams of {size} bytes: {generator.requests} picks in "
                    f"{CELL_DEADLINE_S} s"
                )
            await asyncio.sleep(0.05)
        generator.recording = False
        elapsed = time.perf_counter() - started
        cpu = (cpu_seconds(pid) - cpu_before) / elapsed
        client_cpu = (cpu_seconds(os.getpid()) - client_before) / elapsed
        after = (await client.get(metrics)).text if metrics else ""
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    p50, p99 = histogram_quantiles(before, after) if metrics else (float("nan"),) * 2
    return Cell(
        streams, size, generator.requests, elapsed, generator.pick_ms, cpu, client_cpu, p50, p99,
        generator.errors,
    )  # fmt: skip


def decode_costs() -> list[dict[str, object]]:
    """The body reader against a whole-body parse, per prompt size (this process)."""
    config = prefix_hashing.KeyConfig(prefix_blocks=8, base_model=MODEL)
    rows = []
    for size in PROMPT_BYTES:
        raw = chat_body(7, size)
        parts = chunks(raw, CHUNK_BYTES)
        repeats = max(20, 2_000_000 // len(raw))
        started = time.perf_counter()
        for _ in range(repeats):
            body = StreamedBody(config, 1 << 24)
            for part in parts:
                body.feed(part)
            prefix_hashing.chat_key(body.finish(), config)
        streamed = (time.perf_counter() - started) / repeats
        started = time.perf_counter()
        for _ in range(repeats):
            prefix_hashing.chat_key(prefix_hashing.parse_body(b"".join(parts)), config)
        whole = (time.perf_counter() - started) / repeats
        rows.append(
            {
                "prompt_bytes": size,
                "body_bytes": len(raw),
                "body_reader_us": round(streamed * 1e6, 1),
                "whole_parse_us": round(whole * 1e6, 1),
            }
        )
    return rows


async def measure(
    seconds: float, response_chunks: int, interval_ms: float
) -> tuple[list[dict[str, object]], list[dict[str, object]], list[dict[str, object]]]:
    grid: list[dict[str, object]] = []
    extra: list[dict[str, object]] = []
    baseline: list[dict[str, object]] = []
    async with contextlib.AsyncExitStack() as engines:
        backends = [
            await engines.enter_async_context(
                serving(fake_engine_config(FakeEngine(name=f"e{i}", model=MODEL)))
            )
            for i in range(ENGINES)
        ]
        grpc_port = free_port()
        with baseline_process(grpc_port) as pid:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
            generator = Generator(channel, response_chunks, interval_ms / 1000)
            for size in PROMPT_BYTES:
                cell = await run_cell(generator, pid, None, GOAL["streams"], size, seconds)
                baseline.append({"tls": False, **cell.row()})
                print(json.dumps(baseline[-1]), flush=True)
            await channel.close()
        for tls in (True, False):
            grpc_port, http_port = free_port(), free_port()
            async with picker_process(backends, grpc_port, http_port, tls) as pid:
                channel = await channel_to(grpc_port, tls)
                generators = {
                    # one stream at a time, no response: the path with no queueing at all,
                    # and enough samples for its p99
                    1: Generator(channel, 0, interval_ms / 1000),
                    0: Generator(channel, response_chunks, interval_ms / 1000),
                }
                cells = (
                    [(c, s) for c in CONCURRENCY for s in PROMPT_BYTES]
                    if tls
                    else [(GOAL["streams"], s) for s in PROMPT_BYTES]
                )
                for streams, size in cells:
                    generator = generators.get(streams, generators[0])
                    cell = await run_cell(generator, pid, http_port, streams, size, seconds)
                    row = {"tls": tls, **cell.row()}
                    (grid if tls else extra).append(row)
                    print(json.dumps(row), flush=True)
                await channel.close()
    return grid, extra, baseline


def goal_met(grid: list[dict[str, object]]) -> bool:
    """p50 and p99 within the goal in every TLS cell at the goal's number of streams."""
    rows = [r for r in grid if r["streams"] == GOAL["streams"]]
    return bool(rows) and all(
        float(r["pick_p50_ms"]) <= GOAL["p50_ms"] and float(r["pick_p99_ms"]) <= GOAL["p99_ms"]  # type: ignore[arg-type]
        for r in rows
    )


def markdown(report: dict) -> str:
    lines = [
        "# Endpoint picker: pick latency",
        "",
        "Reproduce: `.venv/bin/python bench/picker_latency.py` (how it measures: the script's "
        "docstring).",
        "",
        f"Machine: {machine_line(report['machine'])} at the start, load average "
        f"{report['load_average_end']} at the end (other jobs shared the machine). Picker "
        "pinned to core "
        f"{PICKER_CORE}, load generator and fake engines on core {CLIENT_CORE}.",
        "",
        f"Workload: chat bodies in {CHUNK_BYTES // 1024} KiB chunks, 16 shared system prompts; "
        f"each response {report['response_chunks']} chunks {report['chunk_interval_ms']} ms "
        f"apart on average, each echoed (full duplex), so a slot holds its stream about "
        f"{report['response_chunks'] * report['chunk_interval_ms'] / 1000:g} s (1 stream: "
        "requests only, one after the other). Policy "
        f"prefix-affinity, {ENGINES} engines. {report['seconds']:g} s per cell.",
        "",
        f"Goal: p50 <= {GOAL['p50_ms']} ms and p99 <= {GOAL['p99_ms']} ms at "
        f"{GOAL['streams']} streams, 200 KB prompts included. Anchor: {ANCHOR}.",
        "",
        "## Pick latency, TLS on (as the operator renders the picker)",
        "",
        "Client: stream open to the answer naming the endpoint (includes sending the body). "
        "Picker: its own added-latency histogram (last body chunk to answer; bucket bounds).",
        "",
        "| streams | prompt | picks/s | p50 ms | p99 ms | max ms | picker p50 ms | "
        "picker p99 ms | picker CPU | load generator CPU | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["grid"]:
        lines.append(
            f"| {row['streams']} | {row['prompt_bytes'] // 1000} KB | {row['picks_per_s']} "
            f"| {row['pick_p50_ms']} | {row['pick_p99_ms']} | {row['pick_max_ms']} "
            f"| {row['picker_added_p50_ms']} | {row['picker_added_p99_ms']} "
            f"| {row['picker_cpu_share']:.0%} | {row['load_generator_cpu_share']:.0%} "
            f"| {row['errors']} |"
        )
    lines += [
        "",
        f"## Plaintext, {GOAL['streams']} streams, against the same exchange with no picking",
        "",
        "Baseline: a gRPC server that holds the body and answers a fixed endpoint at its end, "
        "echoing every chunk (the same messages, in Python gRPC, with no key, policy or body "
        "reader), on the same core. The difference is what picking costs.",
        "",
        "| prompt | picker p50 ms | picker p99 ms | picker CPU | baseline p50 ms | "
        "baseline p99 ms | baseline CPU |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, base in zip(report["plaintext"], report["baseline"], strict=True):
        lines.append(
            f"| {row['prompt_bytes'] // 1000} KB | {row['pick_p50_ms']} | {row['pick_p99_ms']} "
            f"| {row['picker_cpu_share']:.0%} | {base['pick_p50_ms']} | {base['pick_p99_ms']} "
            f"| {base['picker_cpu_share']:.0%} |"
        )
    lines += [
        "",
        "## Body decoding: the picker's reader against a whole-body parse",
        "",
        "| prompt | body bytes | body reader us | json.loads of the whole body us |",
        "|---:|---:|---:|---:|",
    ]
    for row in report["decode"]:
        lines.append(
            f"| {row['prompt_bytes'] // 1000} KB | {row['body_bytes']} | {row['body_reader_us']} "
            f"| {row['whole_parse_us']} |"
        )
    met = "met" if report["goal_met"] else "missed"
    lines += ["", f"Goal at {GOAL['streams']} streams: {met}.", ""]
    return "\n".join(lines)


@click.command()
@click.option("--seconds", default=8.0, show_default=True, help="Measured seconds per cell.")
@click.option("--serve-baseline", type=int, hidden=True, help="Run the baseline server.")
@click.option("--response-chunks", default=32, show_default=True)
@click.option("--chunk-interval-ms", default=50.0, show_default=True)
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=RESULTS,
    show_default=True,
    help="Where picker-latency.json and .md are written.",
)
def main(
    seconds: float,
    serve_baseline: int | None,
    response_chunks: int,
    chunk_interval_ms: float,
    out_dir: Path,
) -> None:
    """Measure the endpoint picker's pick latency; write picker-latency.json and .md."""
    if serve_baseline is not None:
        uvloop.run(run_baseline_server(serve_baseline))
        return
    os.sched_setaffinity(0, {CLIENT_CORE})
    state = machine()
    decode = decode_costs()
    grid, plaintext, baseline = uvloop.run(measure(seconds, response_chunks, chunk_interval_ms))
    report = {
        "machine": state,
        "benchmark": NAME,
        "load_average_end": load_average_1m(),
        "seconds": seconds,
        "response_chunks": response_chunks,
        "chunk_interval_ms": chunk_interval_ms,
        "chunk_bytes": CHUNK_BYTES,
        "goal": GOAL,
        "anchor": ANCHOR,
        "grid": grid,
        "goal_met": goal_met(grid),
        "plaintext": plaintext,
        "baseline": baseline,
        "decode": decode,
    }
    write_results(out_dir, NAME, report, markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
