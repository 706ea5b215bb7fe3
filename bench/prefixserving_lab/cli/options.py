"""Options the bench commands share: the conversation trace and its time compression with
burst windows and the warm-up curve's length and interval (``bench scaling``, ``bench
rollout``), the policy names and the command line as run (``bench cluster``, ``bench
faults``)."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from prefixserving.router.policies.registry import POLICY_NAMES
from prefixserving_lab.models.fleet import PodLifecycle
from prefixserving_lab.models.peer_routers import (
    make_sim_policy,
    sim_policy_key,
    sim_policy_names,
)
from prefixserving_lab.runners.curves import DEFAULT_BUCKET_S, DEFAULT_SPAN_S, CurveSpec
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


# Options that several bench commands take as they are; pod defaults from the fleet model.
_POD = PodLifecycle()
out_dir_option = click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench/results"),
    show_default=True,
    help="Directory the results files are written to.",
)
load_s_option = click.option(
    "--load-s",
    type=click.FloatRange(0),
    default=_POD.load_s,
    show_default=True,
    help="Pod start to engine up (scheduling, image pull, model load).",
)
hot_prefixes_option = click.option(
    "--hot-prefixes",
    type=click.IntRange(0),
    default=_POD.hot_prefixes,
    show_default=True,
    help="Hot prefixes a new pod warms before it is Ready.",
)


def curve_options(command: click.Command) -> click.Command:
    """``--curve-minutes`` and ``--curve-bucket-s``: the warm-up curve's length and interval
    (read them with :func:`curve_spec`)."""
    positive = click.FloatRange(min=0, min_open=True)
    command = click.option(
        "--curve-bucket-s",
        type=positive,
        default=DEFAULT_BUCKET_S,
        show_default=True,
        help="Interval of the warm-up curve, in seconds.",
    )(command)
    return click.option(
        "--curve-minutes",
        type=positive,
        default=DEFAULT_SPAN_S / 60,
        show_default=True,
        help="Length of the warm-up curve after the event, in minutes.",
    )(command)


def curve_spec(minutes: float, bucket_s: float) -> CurveSpec:
    """The curve of ``--curve-minutes`` and ``--curve-bucket-s``, or a usage error naming both."""
    if bucket_s > minutes * 60:
        raise click.UsageError(
            f"--curve-bucket-s {bucket_s:g} is longer than --curve-minutes {minutes:g}: "
            "give an interval of at most the curve's length"
        )
    return CurveSpec(span_s=minutes * 60, bucket_s=bucket_s)


def command_line(ctx: click.Context) -> str:
    """The ``prefixserving bench`` command as run, from the options given on the command line."""
    words = ["prefixserving", "bench", ctx.info_name or ""]
    for param in ctx.command.params:
        name = param.name or ""
        if ctx.get_parameter_source(name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params[name]
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, bool):
                words.append(param.opts[0] if item else param.secondary_opts[0])
            else:
                words += [param.opts[0], str(item)]
    return shlex.join(words)


def policy_names(values: Sequence[str], default: Sequence[str]) -> list[str]:
    """Canonical names of the ``--policy`` values (``default`` when none), or a usage error
    listing the known ones."""
    names = []
    for value in values or default:
        try:
            make_sim_policy(value)
        except ValueError as error:
            choices = ", ".join(n.replace("_", "-") for n in sim_policy_names(POLICY_NAMES))
            raise click.BadParameter(f"{error}; the benchmark also knows: {choices}") from error
        names.append(sim_policy_key(value))
    return names
