"""Keeps the ``slow`` marker honest (``pyproject.toml`` says what it means): a test that is not
marked ``slow`` fails when it starts a process or imports vLLM, naming what it did, so the
fast lane (``make test-fast``) stays free of both.

How: an audit hook (:func:`sys.addaudithook`, PEP 578) sees every process start
(``subprocess.Popen``, ``os.posix_spawn``, ``os.exec``, ``os.fork``, ``os.system``) and the
first import of ``vllm`` while a test's fixtures are set up and while it runs. A test module
that imports vLLM when it is collected (itself, or through the first-party modules it imports)
counts as importing it in every test it holds.

The fast lane (``-m "not slow"``) does not even import a module that marks all its tests slow
(``pytestmark = pytest.mark.slow`` at the top level): collecting the vLLM tests would import
vLLM, which takes seconds and would hide a fast test that imports it.

Cost: one set lookup per audit event while a test runs; at collection, one read of each test
file in the fast lane and one walk over the globals of the first-party modules each test module
imports (memoised).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Generator
from pathlib import Path
from types import ModuleType
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
            if module is not None and self._module_imports_vllm(module):
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

    def _module_imports_vllm(self, module: ModuleType) -> bool:
        """Whether ``module``'s globals reach vLLM: a vllm module or object, or a first-party
        module whose globals do (depth first, each module once)."""
        name = module.__name__
        known = self._imports_vllm.get(name)
        if known is not None:
            return known
        self._imports_vllm[name] = False  # a cycle back here adds nothing
        found = False
        for value in list(vars(module).values()):
            target = _module_name(value)
            if target is None:
                continue
            if target == "vllm" or target.startswith("vllm."):
                found = True
                break
            dependency = sys.modules.get(target)
            if (
                dependency is not None
                and dependency is not module
                and str(getattr(dependency, "__file__", None) or "").startswith(self.first_party)
                and self._module_imports_vllm(dependency)
            ):
                found = True
                break
        self._imports_vllm[name] = found
        return found


def _module_name(value: object) -> str | None:
    """The module ``value`` is, or the one it was defined in."""
    if isinstance(value, ModuleType):
        return value.__name__
    try:
        name = getattr(value, "__module__", None)
    except Exception:  # a lazy proxy may raise anything
        return None
    return name if isinstance(name, str) else None


def _command(args: tuple[Any, ...]) -> str:
    """The command line of an audited process start, as far as the event tells: the argument
    list of ``subprocess.Popen`` / ``os.posix_spawn`` / ``os.exec``, or ``os.system``'s string."""
    argv = args[1] if len(args) > 1 else None
    if isinstance(argv, list | tuple) and argv:
        return " ".join(str(a) for a in argv[:4])
    if isinstance(argv, str):
        return argv
    return str(args[0]) if args else "fork"
