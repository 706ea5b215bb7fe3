"""Stopping the local processes the stack starts (engines, router, warm-up, Prometheus)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``. A process that leads its own process group
    (started with ``start_new_session=True``) is signalled with its whole group, so the
    children it forked (vLLM's engine core) stop with it."""
    if process.poll() is not None:
        return
    try:
        leads_group = os.getpgid(process.pid) == process.pid
    except ProcessLookupError:
        return

    def send(signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            if leads_group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)

    send(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        send(signal.SIGKILL)
        process.wait()
