"""The import rules of the ``prefixserving`` package (docs/architecture.md), checked from source.

:func:`violations` parses every module under a package folder with ``ast`` (nothing is
imported or run) and lists each import that breaks a rule of :data:`RULES`, plus every kopf
handler registered outside ``controller/main.py``.

What counts as an import of module ``m``:

- ``import m`` and ``from m import x`` anywhere in the file (also inside functions and
  ``if TYPE_CHECKING:`` blocks: a type-only import still ties the layers); relative imports
  are resolved against the importing module's package;
- a lazy import the linter cannot see: ``importlib.import_module("m")`` with a literal name,
  and a literal ``"package.module:attribute"`` entry point (the ``prefixserving`` command
  table names its subcommands so).

A kopf handler is registered by ``kopf.on.*``, ``kopf.index``, ``kopf.timer`` or
``kopf.daemon`` (as a decorator or called), whatever name kopf was imported under.

Cost: one parse per module, linear in the size of the package.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "prefixserving"
# The lab harness (benchmarks, simulators, the local stack) is moved out of the product into
# bench/prefixserving_lab/, import name prefixserving_lab.
LAB_PACKAGE = "prefixserving_lab"
KOPF_MAIN = "prefixserving.controller.main"
# "package.module:attribute"; a dotted module, so that metric names ("vllm:num_requests_waiting")
# are not taken for one.
_ENTRY_POINT = re.compile(r"^([A-Za-z_]\w*(?:\.\w+)+):[A-Za-z_]\w*$")
_REGISTRATIONS = {"on", "index", "timer", "daemon"}


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@dataclass(frozen=True)
class Rule:
    """``importer`` modules must not import ``target`` modules (``allowed`` importers are
    exempt); ``why`` is the reason, shown with every violation."""

    name: str
    importer: Callable[[str], bool]
    target: Callable[[str], bool]
    why: str
    allowed: frozenset[str] = frozenset()

    def broken_by(self, importer: str, target: str) -> bool:
        return importer not in self.allowed and self.importer(importer) and self.target(target)


def _in(*packages: str) -> Callable[[str], bool]:
    return lambda module: any(_within(module, f"{PACKAGE}.{p}") for p in packages)


def _anywhere(module: str) -> bool:
    return True


def _kubernetes_client(module: str) -> bool:
    """The kubernetes package, except ``kubernetes.utils`` (quantity parsing, no API calls)."""
    return _within(module, "kubernetes") and not _within(module, "kubernetes.utils")


RULES: tuple[Rule, ...] = (
    Rule(
        "no-lab",
        _anywhere,
        lambda m: _within(m, LAB_PACKAGE),
        "the product never depends on the benchmark and simulation harness",
    ),
    Rule(
        "vllm-only-in-engine",
        lambda m: not _in("engine")(m),
        lambda m: _within(m, "vllm"),
        "only engine/ runs inside vLLM; the operator, router and warm-up images ship without it",
    ),
    Rule(
        "api-server-only-in-kube",
        _anywhere,
        _kubernetes_client,
        "controller/kube.py is the one client of the API server (the warm-up sidecar, with the "
        "verbs its Role grants: warmup/events.py posts its own timeout Event, warmup/handover.py "
        "lists the engine pods and annotates the one it replaces)",
        frozenset(
            {
                "prefixserving.controller.kube",
                "prefixserving.warmup.events",
                "prefixserving.warmup.handover",
            }
        ),
    ),
    Rule(
        "kopf-only-in-controller",
        lambda m: not _in("controller")(m),
        lambda m: _within(m, "kopf"),
        "kopf is the operator's framework; the router, engine, warm-up and API never need it",
    ),
    Rule(
        "peek-is-plain-python",
        _in("peek"),
        lambda m: _within(m, "kopf") or _within(m, "vllm"),
        "peek/ is PEEK's core, tested without vLLM and reused by engine/",
    ),
    Rule(
        "api-is-the-bottom-layer",
        _in("api"),
        _in("controller", "router", "render"),
        "the API (models, defaults, validation, conditions) is what the others build on",
    ),
)


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def module_name(root: Path, path: Path) -> str:
    """Dotted name of the module at ``path`` in the package folder ``root``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module of a ``from ... import`` (relative ones against ``importer``)."""
    if not node.level:
        return node.module or ""
    package = importer.split(".") if is_package else importer.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(tree: ast.Module, importer: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import of the module ``importer`` (see above)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, is_package, node)
            yield node.lineno, module
            for alias in node.names:  # ``from pkg import submodule``
                yield node.lineno, f"{module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = _ENTRY_POINT.match(node.value)
            if found:
                yield node.lineno, found.group(1)


def kopf_registrations(tree: ast.Module) -> Iterator[int]:
    """Lines that register a kopf handler (``kopf.on.create``, ``kopf.index``, ...)."""
    modules: set[str] = set()  # names bound to the kopf module
    direct: set[str] = set()  # names bound to kopf.on, kopf.index, ...
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == "kopf"}
        elif isinstance(node, ast.ImportFrom) and node.module == "kopf":
            direct |= {a.asname or a.name for a in node.names if a.name in _REGISTRATIONS}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr in _REGISTRATIONS
        ) or (isinstance(node, ast.Name) and node.id in direct):
            yield node.lineno


def violations(root: Path) -> list[Violation]:
    """Every broken rule in the package folder ``root`` (e.g. ``operator/prefixserving``)."""
    found: list[Violation] = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(root, path)
        tree = ast.parse(path.read_text(), filename=str(path))
        seen: set[tuple[int, str]] = set()
        for line, target in imports_of(tree, importer, path.name == "__init__.py"):
            for rule in RULES:
                if (line, rule.name) not in seen and rule.broken_by(importer, target):
                    seen.add((line, rule.name))
                    found.append(Violation(path, line, f"{rule.name}: {target} ({rule.why})"))
        if importer != KOPF_MAIN:
            for line in sorted(set(kopf_registrations(tree))):
                found.append(
                    Violation(
                        path,
                        line,
                        "kopf handler outside controller/main.py (every "
                        "decorator lives there; handlers delegate to controller/handlers/)",
                    )
                )
    return found
