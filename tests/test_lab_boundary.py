"""The product ships only the product: ``prefixserving`` never imports the lab
(``prefixserving_lab``, ``bench/``); the lab registers its commands in an entry-point group
that the CLI loads, and where the lab is missing the CLI says how to install it.
``test_images.py`` checks that no image holds it."""

from __future__ import annotations

import ast
import importlib.abc
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import prefixserving
from prefixserving.cli import LAB_COMMANDS, LAB_INSTALL, LAB_PACKAGE, LabMissing, main

PACKAGE = Path(prefixserving.__file__).parent
MINIMAL = Path(__file__).resolve().parents[1] / "examples" / "minimal.yaml"
# Every command line of the lab, each with arguments it would refuse or run for long.
LAB_COMMAND_LINES = [
    ["bench", "replay", "--scale", "1"],
    ["bench", "cluster", "--replicas", "4"],
    ["bench", "scaling", "--help"],
    ["bench", "rollout"],
    ["bench", "faults"],
    ["demo", "--groups", "2"],
    ["stack", "up"],
]


def test_no_product_module_imports_the_lab() -> None:
    importing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(name.split(".")[0] == LAB_PACKAGE for name in names):
                importing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert importing == []


def test_only_the_cli_names_the_lab_package() -> None:
    naming = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if LAB_PACKAGE in path.read_text()
    ]
    assert naming == ["cli.py"]


def test_every_lab_command_loads_from_its_entry_point_in_a_dev_install() -> None:
    from prefixserving_lab.cli import BENCH_COMMANDS, bench

    loaded = [
        name
        for name in LAB_COMMANDS
        if not isinstance(main.get_command(click.Context(main), name), LabMissing)
    ]
    assert loaded == list(LAB_COMMANDS)
    for name in BENCH_COMMANDS:
        assert isinstance(bench.get_command(click.Context(bench), name), click.Command)


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Finds ``prefixserving_lab`` nowhere, as where it is not installed."""

    def find_spec(self, fullname: str, *_: object) -> None:
        if fullname == LAB_PACKAGE:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


@pytest.fixture
def without_the_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as in an image: ``prefixserving_lab`` cannot be imported."""
    for module in list(sys.modules):
        if module == LAB_PACKAGE or module.startswith(f"{LAB_PACKAGE}."):
            monkeypatch.delitem(sys.modules, module)
    monkeypatch.setattr(sys, "meta_path", [_NotInstalled(), *sys.meta_path])


@pytest.mark.usefixtures("without_the_lab")
@pytest.mark.parametrize("argv", LAB_COMMAND_LINES, ids=" ".join)
def test_a_lab_command_without_the_lab_says_how_to_install_it(argv: list[str]) -> None:
    result = CliRunner().invoke(main, argv, prog_name="prefixserving")
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"prefixserving {argv[0]}") and line.endswith(LAB_INSTALL)
    assert "Traceback" not in result.output


@pytest.mark.usefixtures("without_the_lab")
def test_the_product_commands_and_help_work_without_the_lab() -> None:
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0 and "bench" in listed.output and "demo" in listed.output
    bench = CliRunner().invoke(main, ["bench", "--help"])
    assert bench.exit_code == 2 and LAB_INSTALL in " ".join(bench.output.split())
    rendered = CliRunner().invoke(main, ["render", "-f", str(MINIMAL)])
    assert rendered.exit_code == 0, rendered.output
