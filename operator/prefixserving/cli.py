"""The ``prefixserving`` command.

Each subcommand lives next to the component it drives and is imported only when it runs, so
``prefixserving --help`` stays fast and never imports vLLM or kopf.
"""

from __future__ import annotations

import importlib

import click

# name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "crd": "prefixserving.api.cli:crd",
    "validate": "prefixserving.api.cli:validate",
    "render": "prefixserving.render.cli:render",
    "operator": "prefixserving.controller.cli:operator",
    "router": "prefixserving.router.cli:router",
    "warmup": "prefixserving.warmup.cli:warmup",
    "stack": "prefixserving.stack.cli:stack",
    "demo": "prefixserving.stack.cli:demo",
    "bench": "prefixserving.cli:bench",
}

BENCH_COMMANDS: dict[str, str] = {
    "replay": "prefixserving.sim.replay_cli:replay",
    "cluster": "prefixserving.sim.cluster_cli:cluster",
    "scaling": "prefixserving.sim.scaling_cli:scaling",
    "rollout": "prefixserving.sim.rollout_cli:rollout",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.lazy)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self.lazy.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="prefixserving")
def main() -> None:
    """Serve LLMs with vLLM on Kubernetes and make the prefix cache pay off."""


@click.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks: each runs the competitors side by side and writes JSON plus a markdown table."""
