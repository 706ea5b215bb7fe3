"""Waiting for a server the test started as a process (router, warm-up sidecar, operator)."""

from __future__ import annotations

import contextlib
import subprocess

import httpx

from prefixserving_lab.testing import wait_for


def wait_for_answer(
    process: subprocess.Popen[bytes], url: str, status: int = 200, timeout_s: float = 60.0
) -> httpx.Response:
    """Poll GET ``url`` until it answers ``status`` and return that answer; fail at once, with
    the process's output, if ``process`` exits first (its stdout must be a pipe or None)."""

    def answered() -> httpx.Response | None:
        if process.poll() is not None:
            output = process.stdout.read().decode(errors="replace") if process.stdout else ""
            raise AssertionError(f"{process.args!r} exited with {process.returncode}:\n{output}")
        with contextlib.suppress(httpx.TransportError):
            answer = httpx.get(url, timeout=5)
            if answer.status_code == status:
                return answer
        return None

    return wait_for(answered, timeout_s=timeout_s, what=f"{status} from {url}", interval_s=0.2)
