"""Keeps the ``slow`` marker honest (``pyproject.toml`` says what it means): a test that is not
marked ``slow`` fails when it starts a process or imports vLLM, naming what it did, so the
fast lane (``make test-fast``) stays free of both.

How: an audit hook (:func:`sys.addaudithook`, PEP 578) sees every process start
(``subprocess.Popen``, ``os.posix_spawn``, ``os.exec``, ``os.fork``, ``os.system``) and the
first import of ``vllm`` while a test's fixtures are set up and while it runs. A test module
that imports vLLM when it is imported (itself, or through the first-party modules it imports
at their top level, parent packages included) counts as importing it in every test it holds.
That is read from the source, not from ``sys.modules``, so the answer does not depend on what
earlier tests imported (a package gains a submodule attribute when anyone imports it).

The fast lane (``-m "not slow"``) does not even import a module that marks all its tests slow
(``pytestmark = pytest.mark.slow`` at the top level): collecting the vLLM tests would import
vLLM, which takes seconds and would hide a fast test that imports it.

Cost: one set lookup per audit event while a test runs; at collection, one read of each test
file in the fast lane and one parse of each first-party module the test modules reach
(memoised).
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

import pytest

PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system"}
)
SEEN = pytest.StashKey[list[str]]()
FAST_LANE = "not slow"  # the -m expression of `make test-fast`
ALL_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.MULTILINE)


class SlowMarkerGuard:
    """The pytest plugin; ``first_party``: the folders whose modules are walked for imports."""

    def __init__(self, first_party: tuple[Path, ...]) -> None:
        self.first_party = tuple(str(path.resolve()) + "/" for path in first_party)
        self._seen: list[str] | None = None  # what the running test did; None between tests
        self._imports_vllm: dict[str, bool] = {}
        sys.addaudithook(self._audit)

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        seen = self._seen
        if seen is None:
            return
        if event in PROCESS_EVENTS:
            seen.append(f"started a process ({event}: {_command(args)})")
        elif event == "import" and args[0] == "vllm":
            seen.append("imported vllm")

    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> bool | None:
        fast_lane = " ".join(str(config.getoption("markexpr")).split()) == FAST_LANE
        if fast_lane and collection_path.suffix == ".py" and collection_path.is_file():
            return bool(ALL_SLOW.search(collection_path.read_text())) or None
        return None

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            module = getattr(item, "module", None)
            path = getattr(module, "__file__", None)
            if (
                module is not None
                and path
                and self._module_imports_vllm(module.__name__, Path(path))
            ):
                item.stash.setdefault(SEEN, []).append(
                    f"imports vllm when its module {module.__name__} is imported"
                )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, object, object]:
        self._seen = item.stash.setdefault(SEEN, [])
        try:
            return (yield)
        finally:
            self._seen = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        seen = self._seen = item.stash.setdefault(SEEN, [])
        try:
            result = yield
        finally:
            self._seen = None
        if seen and item.get_closest_marker("slow") is None:
            done = "; ".join(dict.fromkeys(seen))
            pytest.fail(
                f"{item.nodeid} {done} but is not marked slow: add @pytest.mark.slow "
                "(or pytestmark = pytest.mark.slow for the module); `make test-fast` "
                "runs without processes and without vLLM",
                pytrace=False,
            )
        return result

    def _module_imports_vllm(self, name: str, path: Path | None = None) -> bool:
        """Whether importing module ``name`` (source at ``path``, else found under the
        first-party folders) imports vLLM: it, a parent package, or a first-party module it
        imports at its top level names vllm (depth first, each module once)."""
        known = self._imports_vllm.get(name)
        if known is not None:
            return known
        self._imports_vllm[name] = False  # a cycle back here adds nothing
        path = path or self._source(name)
        found = False
        if path is not None:
            parts = name.split(".")
            parents = [".".join(parts[:i]) for i in range(1, len(parts))]
            package = name if path.name == "__init__.py" else ".".join(parts[:-1])
            tree = ast.parse(path.read_text(), str(path))
            for target in [*parents, *_top_level_imports(tree.body, package)]:
                if (
                    target == "vllm"
                    or target.startswith("vllm.")
                    or (target != name and self._module_imports_vllm(target))
                ):
                    found = True
                    break
        self._imports_vllm[name] = found
        return found

    def _source(self, name: str) -> Path | None:
        """The source file of first-party module ``name``, found without importing anything."""
        relative = name.replace(".", "/")
        for root in self.first_party:
            for candidate in (Path(root, relative + ".py"), Path(root, relative, "__init__.py")):
                if candidate.is_file():
                    return candidate
        return None


def _top_level_imports(body: Sequence[ast.AST], package: str) -> Generator[str, None, None]:
    """The modules a module body imports when it runs: its import statements outside function
    bodies and ``if TYPE_CHECKING:`` blocks; ``from m import n`` yields ``m`` and ``m.n`` (``n``
    may be a submodule); relative imports are resolved against ``package``."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base == "__future__":
                continue
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _top_level_imports(node.orelse, package)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _top_level_imports(inner, package)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _command(args: tuple[Any, ...]) -> str:
    """The command line of an audited process start, as far as the event tells: the argument
    list of ``subprocess.Popen`` / ``os.posix_spawn`` / ``os.exec``, or ``os.system``'s string."""
    argv = args[1] if len(args) > 1 else None
    if isinstance(argv, list | tuple) and argv:
        return " ".join(str(a) for a in argv[:4])
    if isinstance(argv, str):
        return argv
    return str(args[0]) if args else "fork"
