"""One run of vLLM's scheduler tests against a scheduler mode: command line and environment.

By hand (from the repository root, after ``make setup``)::

    PYTHONPATH=tests .venv/bin/python -m vllm_contract.runner 0.33.0 peek-on -- -k preempt

runs the release's tests in a subprocess and prints pytest's output; ``--report FILE`` keeps
the JSON outcome report. ``tests/test_vllm_contract.py`` calls :func:`run` for every release and
mode. One run is a fresh Python process: pytest inside the release's folder with
``--noconftest`` (vLLM's top-level conftest imports its heavy test dependencies) and
``-p vllm_contract.plugin``, ``PYTHONPATH`` = the release's wheel code (if any), this
repository's ``operator/`` (the ``prefixserving`` under test) and ``tests/`` (the plugin), and a
Hugging Face home built from ``hf_configs/`` with ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixserving.constants import ENV_LANES, ENV_MAX_SIBLING_WAIT_MS
from vllm_contract.fetch import HARNESS, ROOT, Release, is_ready, release_dir, releases, site_dir

HF_CONFIGS = HARNESS / "hf_configs"
PYTEST_INI = HARNESS / "pytest.ini"
# The scheduler and KV cache manager tests of vLLM's tests/v1/core/.
TEST_FILES = (
    "tests/v1/core/test_scheduler.py",
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_kv_cache_utils.py",
    "tests/v1/core/test_async_scheduler.py",
)
# The Hugging Face cache names a snapshot by commit; the configs come from no commit.
FAKE_REVISION = "0" * 40
# Variables of this project that a run must not inherit from the caller's shell.
OWN_ENV_PREFIX = "PREFIXSERVING_"
RUN_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Mode:
    """Which scheduler vLLM's tests run on, and the PEEK settings (environment) it reads."""

    scheduler: str
    env: Mapping[str, str] = field(default_factory=dict)


MODES = {
    "stock": Mode("stock"),
    # PeekScheduler with holding and lanes off: must behave exactly like vLLM's own.
    "peek-off": Mode("peek", {ENV_LANES: "false", ENV_MAX_SIBLING_WAIT_MS: "0"}),
    # PeekScheduler with its defaults.
    "peek-on": Mode("peek"),
}


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished run: pytest's exit code, the plugin's JSON report and the output file."""

    returncode: int
    report: dict[str, Any]
    log: Path | None
    wall_s: float

    @property
    def outcomes(self) -> dict[str, dict[str, str]]:
        return self.report["outcomes"]


def release(version: str) -> Release:
    """The release of ``releases.toml`` with this version."""
    for candidate in releases():
        if candidate.version == version:
            return candidate
    known = ", ".join(r.version for r in releases())
    raise ValueError(f"vLLM {version} is not in tests/vllm_contract/releases.toml ({known})")


def missing(rel: Release) -> str | None:
    """Why the release cannot run here (with the command that fixes it), or None."""
    if not is_ready(rel):
        return (
            f"vLLM {rel.version}'s scheduler tests are not unpacked in {release_dir(rel)}: "
            "run `make setup` (or `bash scripts/setup.sh`)"
        )
    if rel.installed is not None:
        try:
            installed = importlib.metadata.version(rel.installed)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != rel.version:
            return (
                f"the venv has {rel.installed} {installed or '(none)'}, the contract runs "
                f"{rel.version}: run `make setup`"
            )
    return None


def build_hf_home(dest: Path) -> Path:
    """A Hugging Face home whose hub cache holds ``hf_configs/ORG/NAME/config.json`` as the
    only file of each model's snapshot; return ``dest``."""
    for config in sorted(HF_CONFIGS.glob("*/*/config.json")):
        org, name = config.parent.parent.name, config.parent.name
        model = dest / "hub" / f"models--{org}--{name}"
        snapshot = model / "snapshots" / FAKE_REVISION
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_bytes(config.read_bytes())
        (model / "refs").mkdir(exist_ok=True)
        (model / "refs" / "main").write_text(FAKE_REVISION)
    return dest


def environment(rel: Release, mode: Mode, hf_home: Path) -> dict[str, str]:
    """The run's environment: the caller's, without this project's variables, plus the mode's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN_ENV_PREFIX)}
    paths = [str(ROOT / "operator"), str(HARNESS.parent)]
    site = site_dir(rel)
    if site is not None:
        paths.insert(0, str(site))
        # The GPU build infers its platform from CUDA unless told.
        env["VLLM_TARGET_DEVICE"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HF_HOME"] = str(hf_home)
    env["HF_HUB_OFFLINE"] = "1"
    env.update(mode.env)
    return env


def command(
    mode: Mode,
    report: Path,
    *,
    check_deselected: bool = False,
    extra: Sequence[str] = (),
    targets: Sequence[str] = TEST_FILES,
) -> list[str]:
    """pytest's command line for one run of ``targets`` (run in the release's folder)."""
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(PYTEST_INI),
        "--rootdir",
        ".",
        "--noconftest",
        "-p",
        "vllm_contract.plugin",
        f"--contract-scheduler={mode.scheduler}",
        f"--contract-report={report}",
    ]
    if check_deselected:
        argv.append("--contract-check-deselected")
    return [*argv, *targets, *extra]


def run(
    rel: Release,
    mode_name: str,
    workdir: Path,
    *,
    check_deselected: bool = False,
    extra: Sequence[str] = (),
    stream: bool = False,
) -> RunResult:
    """Run the release's tests in ``mode_name`` (a key of :data:`MODES`). pytest's output goes
    to ``workdir/<version>-<mode>.log``, or to this process's stdout with ``stream``. Raises
    RuntimeError when pytest did not get to run the tests (usage error, crash, timeout)."""
    mode = MODES[mode_name]
    stem = f"{rel.version}-{mode_name}"
    report = workdir / f"{stem}.json"
    log = None if stream else workdir / f"{stem}.log"
    hf_home = build_hf_home(workdir / f"{stem}-hf-home")  # its own: runs may go in parallel
    argv = command(mode, report, check_deselected=check_deselected, extra=extra)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        out = None if log is None else stack.enter_context(log.open("wb"))
        try:
            proc = subprocess.run(
                argv,
                cwd=release_dir(rel),
                env=environment(rel, mode, hf_home),
                stdout=out,
                stderr=None if out is None else subprocess.STDOUT,
                timeout=RUN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{stem}: no result after {RUN_TIMEOUT_S} s") from exc
    wall_s = time.monotonic() - started
    # 0: all passed, 1: some failed; anything else means the tests did not run as a whole.
    if proc.returncode not in (0, 1) or not report.exists():
        tail = "" if log is None else "\n" + log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"{stem}: pytest exited with {proc.returncode}{tail}")
    return RunResult(proc.returncode, json.loads(report.read_text()), log, wall_s)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own_args = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m vllm_contract.runner",
        description="Run vLLM's scheduler tests of one release against one scheduler mode.",
        epilog="Arguments after -- go to pytest, e.g. -- -k preempt -x",
    )
    parser.add_argument("version", help="a release of tests/vllm_contract/releases.toml")
    parser.add_argument("mode", choices=sorted(MODES), help="scheduler and PEEK settings")
    parser.add_argument("--report", type=Path, help="keep the JSON outcome report here")
    parser.add_argument(
        "--check-deselected",
        action="store_true",
        help="run one test of each deselected.toml group to check its reason",
    )
    args = parser.parse_args(own_args)
    try:
        rel = release(args.version)
    except ValueError as exc:
        parser.error(str(exc))
    if (why := missing(rel)) is not None:
        parser.error(why)
    with tempfile.TemporaryDirectory(prefix="vllm-contract-") as tmp:
        try:
            result = run(
                rel,
                args.mode,
                Path(tmp),
                check_deselected=args.check_deselected,
                extra=pytest_args,
                stream=True,
            )
        except RuntimeError as exc:
            print(exc, file=sys.stderr)
            return 2
        if args.report:
            args.report.write_text(json.dumps(result.report, indent=1) + "\n")
        return result.returncode


if __name__ == "__main__":
    sys.exit(main())
