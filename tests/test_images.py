"""The images: Dockerfiles pass hadolint, and the wheel installs and runs the way they use it.

No Docker engine runs here, so the wheel test repeats the Dockerfiles' steps in a fresh
virtual environment: build the wheel (``pip wheel --no-deps``), install it with its
dependencies (router and operator images) or with ``--no-deps`` on top of an environment
that has vLLM (engine image), then run each entry point.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from prefixserving import constants

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))


def test_every_image_has_a_dockerfile() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"engine", "router", "operator"}


@pytest.mark.slow
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(dockerfile)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(dockerfile: Path) -> None:
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM ") and "${" not in line:
            image = line.split()[1]
            assert re.search(r":\d", image), f"{dockerfile}: {image} is not pinned by version"


def test_engine_image_pins_the_supported_vllm() -> None:
    text = (ROOT / "images/engine/Dockerfile").read_text()
    assert "ARG VLLM_VERSION=v0.33." in text
    assert "vllm/vllm-openai:${VLLM_VERSION}" in text


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--wheel-dir",
            str(out),
            str(ROOT),
        ],
        check=True,
    )
    (built,) = out.glob("prefixserving-*.whl")
    assert constants.PROJECT_VERSION in built.name
    return built


@pytest.mark.slow
def test_router_and_operator_images_entry_points(wheel: Path, tmp_path: Path) -> None:
    """As images/router and images/operator: a fresh venv, `pip install` with dependencies."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    pip = [str(env_dir / "bin/python"), "-m", "pip", "install", "-q", "--no-cache-dir"]
    subprocess.run([*pip, str(wheel)], check=True)
    cli = str(env_dir / "bin/prefixserving")
    for command in ("operator", "router", "warmup"):
        result = subprocess.run([cli, command, "--help"], capture_output=True, text=True)
        assert result.returncode == 0, f"prefixserving {command} --help: {result.stderr}"
        assert "Usage:" in result.stdout
    # The operator renders from the templates packaged in the wheel.
    rendered = subprocess.run(
        [cli, "render", "-f", str(ROOT / "examples/minimal.yaml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: Deployment" in rendered.stdout
    # vLLM is not a dependency of the router and operator images.
    check = subprocess.run([str(env_dir / "bin/python"), "-c", "import vllm"], capture_output=True)
    assert check.returncode != 0


@pytest.mark.slow
def test_engine_image_scheduler_class(wheel: Path, tmp_path: Path) -> None:
    """As images/engine: the wheel with --no-deps on top of an environment that has vLLM."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    module, cls = constants.PEEK_SCHEDULER_CLS.rsplit(".", 1)
    code = (
        "import importlib, prefixserving; "
        f"m = importlib.import_module({module!r}); "
        f"from vllm.v1.core.sched.scheduler import Scheduler; "
        f"assert issubclass(m.{cls}, Scheduler); print(prefixserving.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith(str(target))
