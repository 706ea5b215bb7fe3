"""``prefixserving router``: flags, usage errors, and a real process answering on its port."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from prefixserving.cli import main
from prefixserving.router.cli import _JsonFormatter, log_config
from prefixserving_lab.runners.fake_engine import FakeEngine
from prefixserving_lab.runners.stack.processes import free_port
from router_support import engine_in_thread, router_settings
from support.processes import wait_for_answer

FLAGS = (
    "--host", "--port", "--backend", "--dns", "--policy", "--load-bound", "--prefix-blocks",
    "--block-chars", "--model", "--max-body-bytes", "--scrape-interval-s", "--log-format",
    "--workers", "--identity-port",
)  # fmt: skip


def test_help_lists_every_flag() -> None:
    result = CliRunner().invoke(main, ["router", "--help"])
    assert result.exit_code == 0
    for flag in FLAGS:
        assert flag in result.output
    for policy in ("prefix-affinity", "two-choice", "round-robin", "least-loaded"):
        assert policy in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "either as --backend"),
        (["--backend", "http://a:1", "--dns", "x:1"], "either as --backend"),
        (["--dns", "engines"], "NAME:PORT"),
        (["--backend", "https://a:1"], "http://HOST:PORT"),
        (["--backend", "http://a:1", "--load-bound", "0.5"], "load_bound"),
        (["--backend", "http://a:1", "--policy", "random"], "random"),
        (["--backend", "http://a:1", "--identity-port", "0"], "--identity-port"),
    ],
)
def test_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["router", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_json_log_lines() -> None:
    assert log_config("json")["formatters"]["default"] == {"()": _JsonFormatter}
    import logging

    record = logging.LogRecord("prefixserving", logging.WARNING, "f", 1, "ejected %s", ("x",), None)
    line = json.loads(_JsonFormatter().format(record))
    assert line["level"] == "warning" and line["msg"] == "ejected x"


@pytest.mark.slow
def test_router_process_serves_health_and_readiness() -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefixserving.cli",
            "router",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend",
            "http://127.0.0.1:1",
            "--log-format",
            "json",
            "--scrape-interval-s",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_answer(process, f"{base}/healthz", 200)
        # The only backend refuses connections: the scrape loop ejects it, and only then is
        # the router not ready (no healthy backend).
        ready = wait_for_answer(process, f"{base}/readyz", 503)
        assert ready.json() == {"healthy_backends": 0, "backends": 1, "held": 0}
    finally:
        process.terminate()
        output = process.communicate(timeout=10)[0].decode()
    # uvicorn shuts down gracefully, then re-raises SIGTERM for the exit status.
    assert process.returncode in (0, -15)
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    messages = [line["msg"] for line in lines]
    assert any("ejected backend http://127.0.0.1:1" in m for m in messages)
    assert "Application shutdown complete." in messages


def _worker_pids(parent: int) -> list[int]:
    """Worker processes uvicorn spawned under ``parent``."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            cmdline = (status.parent / "cmdline").read_bytes()
            if int(fields.get("PPid", "0")) == parent and b"spawn_main" in cmdline:
                pids.append(int(status.parent.name))
    return pids


@pytest.mark.slow
def test_workers_share_the_port_and_stop_together() -> None:
    engine = FakeEngine(name="e0")
    port = free_port()
    with engine_in_thread(engine) as url:
        command = [sys.executable, "-m", "prefixserving.cli", "router", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--backend", url, "--workers", "2"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for_answer(process, f"http://127.0.0.1:{port}/readyz", 200)
            workers = _worker_pids(process.pid)
            assert len(workers) == 2
            for i in range(12):  # a new connection each: the kernel spreads them over workers
                body = {"model": "fake-model", "prompt": f"p{i}", "max_tokens": 1}
                answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body)
                assert answer.status_code == 200 and answer.json()["backend"] == "e0"
            assert len(engine.received) == 12
        finally:
            process.terminate()
            process.communicate(timeout=20)
        assert process.returncode in (0, -15)
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)


def test_prefix_blocks_also_sets_the_policys_key_depth() -> None:
    """A deeper ``--prefix-blocks`` reaches the prefix-affinity key choice, not only the key."""
    from prefixserving.router.cli import RouterSettings, build_router_app

    app = build_router_app(
        RouterSettings(backends=("http://127.0.0.1:1",), prefix_blocks=48, block_chars=128)
    )
    policy = app.router.policy
    assert policy.selector.params.max_depth_blocks == 48
    assert app.router.key_config.prefix_blocks == 48


@pytest.mark.parametrize(("args", "port"), [([], None), (["--identity-port", "8090"], 8090)])
def test_identity_port_reaches_the_pool(args: list[str], port: int | None) -> None:
    """``--identity-port`` makes the pool ask the engines' warm-up sidecars on that port."""
    from prefixserving.router.cli import build_router

    settings = router_settings(["--backend", "http://127.0.0.1:1", *args])
    assert settings.identity_port == port
    assert build_router(settings).pool.config.identity_port == port
