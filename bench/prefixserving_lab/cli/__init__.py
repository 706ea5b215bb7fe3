"""The lab's commands: ``bench replay|cluster|scaling|rollout|faults``, ``demo``, ``stack``.

The lab registers ``bench``, ``demo`` and ``stack`` in the entry-point group
``prefixserving.lab_commands`` (``bench/pyproject.toml``); ``prefixserving`` loads them from
there when they run, so the product never names a lab module."""

from __future__ import annotations

import click

from prefixserving.cli import LazyGroup

# name -> ("module:attribute" of a click command, one-line help).
BENCH_COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("prefixserving_lab.cli.replay:replay", "Schedulers on vLLM's real scheduler."),
    "cluster": ("prefixserving_lab.cli.cluster:cluster", "Routing policies in the cluster sim."),
    "scaling": (
        "prefixserving_lab.cli.scaling:scaling",
        "Autoscaling signals in the cluster sim.",
    ),
    "rollout": (
        "prefixserving_lab.cli.rollout:rollout",
        "Rolling updates with and without warm-up.",
    ),
    "faults": (
        "prefixserving_lab.cli.faults:faults",
        "Router restart, engines out, rolling update over time.",
    ),
}


@click.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks: each runs the competitors side by side and writes JSON plus a markdown table."""
