"""pytest plugin loaded into vLLM's own scheduler tests: ``pytest -p vllm_contract.plugin``.

**Scheduler swap.** vLLM's tests build their schedulers from module globals of their own tree:
``create_scheduler`` in ``tests/v1/core/utils.py`` picks ``AsyncScheduler if async_scheduling
else Scheduler``, the KV-connector helpers do the same, and some tests name ``Scheduler`` or
``AsyncScheduler`` directly. With ``--contract-scheduler=peek``, once collection has imported
the test modules, every global of a ``tests.*`` module that *is* vLLM's ``Scheduler`` or
``AsyncScheduler`` is rebound to :class:`~prefixserving.engine.vllm.PeekScheduler` or
:class:`~prefixserving.engine.vllm.PeekAsyncScheduler`. vLLM's own modules and the test files
are left as they are. A class captured at import time (a ``parametrize`` value, a default
argument) would escape the rebinding, so the plugin refuses to run when it finds one.

**Modules the swap cannot reach** run on stock only. A test module reaches PEEK only through a
name: a rebound global, or a function or class of the test tree whose code uses such a name
(``create_scheduler``, ...). :func:`names_reaching` collects those names from the source of the
test tree, to a fixpoint; a collected module whose code uses none of them (vLLM 0.32 and 0.33:
``test_kv_cache_utils.py``, KV cache sizing and layout) would give stock's outcomes by
construction, so PEEK runs deselect it and the report lists its tests as ``not_reaching``.

**Hold timer.** PEEK times sibling holds (``maxSiblingWaitMs``) with ``PeekScheduler.clock``.
vLLM's tests take microseconds per step on an idle machine and far longer on a busy one, so with
the wall clock whether a hold times out would depend on the machine. The plugin sets that clock
to :class:`StepClock`, which advances :data:`STEP_CLOCK_S` per scheduler step.

Options:

``--contract-scheduler {stock,peek}``
    which schedulers the tests run on (required);
``--contract-report PATH``
    write a JSON report: vLLM version, scheduler, rebound names, PEEK settings, the deselected,
    checked and not-reaching ids, and one outcome per test id (``passed``, ``failed``,
    ``error``, ``skipped``, ``xfailed``, ``xpassed``) with the one-line failure message;
``--contract-check-deselected``
    run the first collected test of each ``deselected.toml`` group that has ``fails_with``
    instead of deselecting it, to check the group's reason still holds (``deselect_checks`` in
    the report).

It also provides ``caplog_vllm``, a fixture of vLLM's top-level conftest (which the contract
run leaves out with ``--noconftest``: it imports vLLM's heavy test dependencies).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest
import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_contract.lists import deselected

# The module whose globals must be rebound for the swap to reach create_scheduler().
CREATE_SCHEDULER_MODULE = "tests.v1.core.utils"
# Simulated duration of one scheduler step for PEEK's hold timer: a short GPU decode step, so
# the default 500 ms sibling wait lasts 50 steps.
STEP_CLOCK_S = 0.010
# Markers of vLLM's own pytest configuration that its scheduler tests use.
VLLM_MARKERS = (
    "cpu_test: a test that needs no GPU",
    "skip_global_cleanup: a test that skips vLLM's distributed clean-up",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("vllm-contract", "vLLM scheduler tests against PEEK")
    group.addoption(
        "--contract-scheduler",
        choices=("stock", "peek"),
        help="run vLLM's tests on its own schedulers (stock) or on PeekScheduler (peek)",
    )
    group.addoption("--contract-report", help="write outcomes per test id to this JSON file")
    group.addoption(
        "--contract-check-deselected",
        action="store_true",
        help="run one test of each deselected.toml group to check its reason",
    )


def pytest_configure(config: pytest.Config) -> None:
    scheduler = config.getoption("--contract-scheduler")
    if scheduler is None:
        raise pytest.UsageError("vllm_contract.plugin needs --contract-scheduler=stock|peek")
    for marker in VLLM_MARKERS:
        config.addinivalue_line("markers", marker)
    config.pluginmanager.register(ContractRun(config, scheduler), "vllm-contract-run")


class StepClock:
    """Seconds that advance by ``step_s`` at each call (PeekScheduler reads its clock once per
    ``schedule()``)."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.now_s = 0.0

    def __call__(self) -> float:
        self.now_s += self.step_s
        return self.now_s


def _vllm_test_modules() -> Iterator[tuple[str, ModuleType]]:
    for name, module in sorted(sys.modules.items()):
        if (name == "tests" or name.startswith("tests.")) and module is not None:
            yield name, module


def rebind(replacements: dict[type, type]) -> list[str]:
    """Point every global of vLLM's test modules that is a key of ``replacements`` at its value;
    return the rebound names (``module.name``)."""
    rebound = []
    for module_name, module in _vllm_test_modules():
        for attr, value in list(vars(module).items()):
            if isinstance(value, type) and value in replacements:
                setattr(module, attr, replacements[value])
                rebound.append(f"{module_name}.{attr}")
    return rebound


def _holds(value: object, classes: tuple[type, ...]) -> bool:
    if isinstance(value, (tuple, list, set, frozenset)):
        return any(_holds(v, classes) for v in value)
    return isinstance(value, type) and value in classes


def captured_classes(items: Iterable[pytest.Item], classes: tuple[type, ...]) -> list[str]:
    """Where vLLM's tests hold one of ``classes`` from import time, out of the rebinding's
    reach: parametrize values of the collected items and default arguments of module-level
    functions."""
    found = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None:
            found += [
                f"{item.nodeid}: parameter {name}"
                for name, value in callspec.params.items()
                if _holds(value, classes)
            ]
    for module_name, module in _vllm_test_modules():
        for attr, value in vars(module).items():
            if not isinstance(value, FunctionType):
                continue
            defaults = (*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values())
            if _holds(defaults, classes):
                found.append(f"{module_name}.{attr}: default argument")
    return found


def _used_names(node: ast.AST) -> set[str]:
    """Identifiers that code under ``node`` reads: names and attribute names (imports, which
    only bind, are left out)."""
    used = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            used.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            used.add(sub.attr)
    return used


def _module_tree(module: ModuleType) -> ast.Module | None:
    path = getattr(module, "__file__", None)
    return None if path is None else ast.parse(Path(path).read_text(), filename=path)


def names_reaching(seeds: set[str], trees: Iterable[ast.Module]) -> set[str]:
    """``seeds`` plus, to a fixpoint, the name of every top-level function or class in
    ``trees`` whose code uses a name already in the set. O(fixpoint rounds x definitions)."""
    definitions = [
        (node.name, _used_names(node))
        for tree in trees
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    reaching = set(seeds)
    grew = True
    while grew:
        grew = False
        for name, used in definitions:
            if name not in reaching and used & reaching:
                reaching.add(name)
                grew = True
    return reaching


class ContractRun:
    """One run's deselection, scheduler swap and outcome report (registered as a plugin by
    :func:`pytest_configure`)."""

    def __init__(self, config: pytest.Config, scheduler: str) -> None:
        self.config = config
        self.report: dict[str, Any] = {
            "vllm_version": vllm.__version__,
            "vllm_file": vllm.__file__,
            "scheduler": scheduler,
            "rebound": [],
            "peek_settings": None,
            "deselected": [],
            "deselect_checks": [],
            "not_reaching": [],
        }
        self.outcomes: dict[str, dict[str, str]] = {}

    def _deselect(self, items: list[pytest.Item], drop: set[str]) -> list[str]:
        dropped = [item for item in items if item.nodeid in drop]
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if item.nodeid not in drop]
        return sorted(item.nodeid for item in dropped)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        listed = deselected(vllm.__version__)
        checks: dict[int, str] = {}
        if self.config.getoption("--contract-check-deselected"):
            for item in items:
                if item.nodeid in listed and listed[item.nodeid].fails_with is not None:
                    checks.setdefault(listed[item.nodeid].group, item.nodeid)
        self.report["deselect_checks"] = sorted(checks.values())
        self.report["deselected"] = self._deselect(items, set(listed) - set(checks.values()))
        if self.report["scheduler"] == "peek":
            self._swap_in_peek(items)

    def _swap_in_peek(self, items: list[pytest.Item]) -> None:
        from prefixserving.engine.vllm import PeekAsyncScheduler, PeekScheduler
        from prefixserving.peek.settings import PeekSettings

        replacements = {Scheduler: PeekScheduler, AsyncScheduler: PeekAsyncScheduler}
        captured = captured_classes(items, tuple(replacements))
        if captured:
            raise pytest.UsageError(
                "vLLM's tests hold Scheduler/AsyncScheduler from import time, where rebinding "
                "cannot reach; run those tests on PEEK another way or deselect them:\n  "
                + "\n  ".join(captured)
            )
        rebound = rebind(replacements)
        needed = {
            f"{CREATE_SCHEDULER_MODULE}.Scheduler",
            f"{CREATE_SCHEDULER_MODULE}.AsyncScheduler",
        }
        if CREATE_SCHEDULER_MODULE in sys.modules and not needed <= set(rebound):
            raise pytest.UsageError(
                f"{CREATE_SCHEDULER_MODULE} no longer names Scheduler and AsyncScheduler as "
                "globals, so create_scheduler() would not build PEEK: update "
                "tests/vllm_contract/plugin.py"
            )
        if "clock" not in vars(PeekScheduler):
            raise pytest.UsageError(
                "PeekScheduler no longer times holds with its `clock` attribute: update "
                "tests/vllm_contract/plugin.py so hold timeouts stay independent of machine speed"
            )
        PeekScheduler.clock = staticmethod(StepClock(STEP_CLOCK_S))
        self.report["rebound"] = rebound
        self.report["peek_settings"] = dataclasses.asdict(PeekSettings.from_env())
        self.report["not_reaching"] = self._deselect(items, self._not_reaching(items, rebound))

    @staticmethod
    def _not_reaching(items: list[pytest.Item], rebound: list[str]) -> set[str]:
        trees = {name: tree for name, m in _vllm_test_modules() if (tree := _module_tree(m))}
        reaching = names_reaching({name.rsplit(".", 1)[-1] for name in rebound}, trees.values())
        cold = set()
        for item in items:
            module = getattr(item, "module", None)
            tree = None if module is None else trees.get(module.__name__)
            if tree is not None and not _used_names(tree) & reaching:
                cold.add(item.nodeid)
        return cold

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        xfail = hasattr(report, "wasxfail")
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                outcome = "xpassed" if xfail else "passed"
            elif report.skipped:
                outcome = "xfailed" if xfail else "skipped"
            else:
                outcome = "failed" if report.when == "call" else "error"
            self.outcomes[report.nodeid] = {"outcome": outcome, "message": _message(report)}
        elif report.when == "teardown" and report.failed:
            entry = self.outcomes.get(report.nodeid, {"outcome": "passed"})
            if entry["outcome"] == "passed":
                self.outcomes[report.nodeid] = {"outcome": "error", "message": _message(report)}

    def pytest_sessionfinish(self) -> None:
        path = self.config.getoption("--contract-report")
        if path:
            report = {**self.report, "outcomes": dict(sorted(self.outcomes.items()))}
            Path(path).write_text(json.dumps(report, indent=1) + "\n")


def _message(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return f"{crash.path}:{crash.lineno}: {crash.message}"
    return str(longrepr).strip().splitlines()[-1] if longrepr else ""


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` with the ``vllm`` logger's records at INFO and above: that logger does not
    propagate to the root logger, where ``caplog`` listens, unless told to for the test."""
    vllm_logger = logging.getLogger("vllm")
    propagate = vllm_logger.propagate
    vllm_logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        vllm_logger.propagate = propagate
