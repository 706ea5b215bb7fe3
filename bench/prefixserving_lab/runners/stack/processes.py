"""Waiting for and stopping the local processes the stack and the benchmarks start (engines,
routers, warm-up, Prometheus)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

# Listening ports are picked below the kernel's ephemeral range, which it hands out to every
# bind to port 0 and every outgoing connection: a port picked from that range and bound later
# by an engine (its HTTP server, its KV event publisher) can be taken meanwhile by another
# process's connection or internal socket (seen: vLLM's ZMQ publisher, "Address already in
# use"). Below the range, only another explicit bind can take it.
_LISTEN_PORTS = range(15000, 30000)
_handed_out: set[int] = set()


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago, below the kernel's ephemeral range
    (see above) and not handed out before by this process. Processes start their search at
    different places (by process id), so two of them rarely try the same ports. Cost: one
    bind per port tried."""
    low = _LISTEN_PORTS.start
    size = min(_LISTEN_PORTS.stop, _ephemeral_low()) - low
    first = (os.getpid() * 7919) % size
    for step in range(size):
        port = low + (first + step) % size
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free TCP port in {low}-{low + size - 1} on 127.0.0.1")


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


def wait_http_ok(url: str, process: subprocess.Popen[bytes], what: str, timeout_s: float) -> None:
    """Poll ``url`` until it answers 200; raise if ``process`` (``what``) exits first or
    ``timeout_s`` passes. Cost: one GET every 0.3 s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not answer 200 at {url} within {timeout_s:.0f} s")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of running process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """:func:`cpu_seconds` of running process ``pid`` plus its running descendants (a server
    with worker processes), read from ``/proc/PID/task/TID/children``. A descendant that exits
    between the reads is skipped. Cost: one read per process and thread."""
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += cpu_seconds(current)
            for task in Path(f"/proc/{current}/task").iterdir():
                stack += [int(child) for child in (task / "children").read_text().split()]
    return total


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of running process ``pid`` in MiB (``VmHWM``); NaN if unknown."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")
