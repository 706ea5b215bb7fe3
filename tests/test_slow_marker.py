"""The ``slow`` marker guard (tests/support/slow_marker.py) in a pytest run of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT

CONFTEST = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(ROOT / "tests")!r})
from support.slow_marker import SlowMarkerGuard

def pytest_configure(config):
    config.pluginmanager.register(SlowMarkerGuard((Path.cwd(),)), "guard")
"""

MIXED = """
import subprocess, sys
import pytest

def test_unmarked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.mark.slow
def test_marked_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_in_process():
    assert sum([1, 2]) == 3
"""

# Importing this module at all fails the run: the fast lane must not collect it.
ALL_SLOW = """
import pytest

pytestmark = pytest.mark.slow

raise RuntimeError("imported")
"""


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args, "."],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_mixed.py").write_text(textwrap.dedent(MIXED))
    return tmp_path


@pytest.mark.slow  # runs pytest (and python) in processes
def test_an_unmarked_test_that_starts_a_process_fails_and_names_it(suite: Path) -> None:
    done = run_pytest(suite)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 2 passed" in done.stdout
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert "test_unmarked_process" in failure
    assert "started a process (subprocess.Popen:" in done.stdout
    assert "is not marked slow" in done.stdout


@pytest.mark.slow  # runs pytest in a process
def test_the_fast_lane_does_not_import_a_module_marked_slow_as_a_whole(suite: Path) -> None:
    (suite / "test_all_slow.py").write_text(textwrap.dedent(ALL_SLOW))
    fast = run_pytest(suite, "-m", "not slow")
    assert "1 failed, 1 passed" in fast.stdout, fast.stdout
    everything = run_pytest(suite)
    assert "RuntimeError: imported" in everything.stdout


# A package whose engine submodule imports (a stand-in) vllm; the api submodule does not.
PACKAGE_FILES = {
    "vllm/__init__.py": "",
    "pkg/__init__.py": "",
    "pkg/api.py": "VALUE = 1\n",
    "pkg/engine.py": "import vllm\n",
    "pkg/lazy.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import vllm\n"
        "def later():\n    import vllm\n"
    ),
    # Collected first: after it, the package ``pkg`` has an ``engine`` attribute.
    "test_a_engine.py": "import pytest\nimport pkg.engine\npytestmark = pytest.mark.slow\n"
    "def test_engine():\n    assert pkg.engine\n",
    "test_b_api.py": "import pkg.api\nimport pkg.lazy\ndef test_api():\n    assert pkg.api.VALUE\n",
    "test_c_engine_unmarked.py": "from pkg import engine\ndef test_engine():\n    assert engine\n",
}


@pytest.mark.slow  # runs pytest in a process
def test_a_module_imports_vllm_by_its_source_not_by_what_earlier_tests_imported(
    suite: Path,
) -> None:
    (suite / "test_mixed.py").unlink()
    for name, text in PACKAGE_FILES.items():
        (suite / name).parent.mkdir(exist_ok=True)
        (suite / name).write_text(text)
    done = run_pytest(suite)
    assert "1 failed, 2 passed" in done.stdout, done.stdout
    (failure,) = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
    assert "test_c_engine_unmarked.py::test_engine" in failure
    assert "imports vllm when its module test_c_engine_unmarked is imported" in done.stdout
