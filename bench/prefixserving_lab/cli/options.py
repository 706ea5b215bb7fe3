"""The workload options ``bench scaling`` and ``bench rollout`` share: the conversation trace
and its time compression, with burst windows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from prefixserving_lab.workloads.conversations import DEFAULT_TRACE


def parse_window(text: str) -> tuple[float, float]:
    """``START:END`` in seconds, e.g. ``480:840``."""
    try:
        start, end = (float(part) for part in text.split(":"))
    except ValueError as exc:
        raise click.BadParameter(
            f"{text!r}: write a burst as START:END seconds, e.g. 480:840"
        ) from exc
    if not 0 <= start < end:
        raise click.BadParameter(f"{text!r}: need 0 <= START < END")
    return start, end


def schedule_options(
    base_scale: float, burst_scale: float, bursts: tuple[str, ...]
) -> Callable[[click.Command], click.Command]:
    """The workload flags shared by ``bench scaling`` and ``bench rollout``, with defaults."""
    options = [
        click.option(
            "--trace",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=DEFAULT_TRACE,
            show_default=True,
            help="Azure-format CSV (TIMESTAMP,ContextTokens,GeneratedTokens).",
        ),
        click.option("--duration-s", type=float, default=1800.0, show_default=True),
        click.option(
            "--base-scale",
            type=float,
            default=base_scale,
            show_default=True,
            help="Time compression outside bursts.",
        ),
        click.option(
            "--burst-scale",
            type=float,
            default=burst_scale,
            show_default=True,
            help="Time compression inside bursts.",
        ),
        click.option(
            "--burst",
            "bursts",
            multiple=True,
            default=bursts,
            show_default=True,
            help="Burst window START:END in simulated seconds (repeatable).",
        ),
        click.option("--seed", type=int, default=0, show_default=True),
    ]

    def apply(command: click.Command) -> click.Command:
        for option in reversed(options):
            command = option(command)
        return command

    return apply
