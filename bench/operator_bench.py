"""Operator benchmark: time from applying N PrefixServings until every one has all its children
and a current ``status.observedGeneration``, and the operator's peak memory, for N = 1, 10, 100.

Set-up: the Kubernetes API emulator (``tests/support/kube_emulator``) runs in this process on
loopback; the operator runs as a separate process, exactly as deployed (``prefixserving
operator --all-namespaces``, default timer periods, no Prometheus), started fresh for each N so
its peak RSS (``VmHWM`` from ``/proc``) belongs to that N. Resources are created back to back in
a new namespace; the clock stops when the last one is complete (polled every 0.25 s).
The emulator shares the machine with the operator, so absolute times include its work too.

Run: ``.venv/bin/python bench/operator_bench.py`` -> ``bench/results/operator.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from prefixserving.api.validation import parse_resource  # noqa: E402
from prefixserving.controller.kube import KINDS, PREFIX_SERVING, Kube, load_api_client  # noqa: E402
from prefixserving.render import render_children  # noqa: E402
from prefixserving_lab.machine import cpu_model  # noqa: E402
from support.kube_emulator import EmulatorThread  # noqa: E402
from support.operator_harness import resource  # noqa: E402

SIZES = (1, 10, 100)
TIMEOUT_S = 600.0
POLL_S = 0.25
CHILD_KINDS = [
    KINDS[k]
    for k in (("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"))
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def expected_children_per_resource() -> int:
    body = resource("probe", "bench")
    body["metadata"]["uid"] = "probe"
    rendered = render_children(parse_resource(body))
    return sum(1 for c in rendered if any(c["kind"] == k.kind for k in CHILD_KINDS))


def start_operator(kubeconfig: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = os.environ | {"KUBECONFIG": str(kubeconfig)}
    process = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "prefixserving"),
            "operator",
            "--all-namespaces",
            "--health-port",
            str(port),
        ],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"operator exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                return process, port
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("operator did not become live")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def complete(kube: Kube, namespace: str, n: int, per_resource: int) -> bool:
    items = kube.list(PREFIX_SERVING, namespace)
    if len(items) < n:
        return False
    if any(
        (i.get("status") or {}).get("observedGeneration") != i["metadata"]["generation"]
        for i in items
    ):
        return False
    return sum(len(kube.list(kind, namespace)) for kind in CHILD_KINDS) >= n * per_resource


def run_size(
    emulator: EmulatorThread, kubeconfig: Path, kube: Kube, n: int, workdir: Path
) -> dict[str, Any]:
    per_resource = expected_children_per_resource()
    process, _ = start_operator(kubeconfig, workdir / f"operator-{n}.log")
    try:
        namespace = f"bench-n{n}"
        cpu_before_s = cpu_s(process.pid)
        emulator_before_s = cpu_s(os.getpid())
        started = time.monotonic()
        for index in range(n):
            body = resource(f"m{index}", namespace)
            kube.request("POST", PREFIX_SERVING.path(namespace), body=body)
        applied_s = time.monotonic() - started
        while not complete(kube, namespace, n, per_resource):
            if time.monotonic() - started > TIMEOUT_S:
                raise TimeoutError(f"N={n}: not complete after {TIMEOUT_S:.0f}s")
            time.sleep(POLL_S)
        elapsed_s = time.monotonic() - started
        return {
            "n": n,
            "apply_s": round(applied_s, 3),
            "all_ready_s": round(elapsed_s, 3),
            "per_resource_ms": round(elapsed_s / n * 1000, 1),
            "children_per_resource": per_resource,
            "operator_peak_rss_mib": round(peak_rss_mib(process.pid), 1),
            "operator_cpu_s": round(cpu_s(process.pid) - cpu_before_s, 2),
            "emulator_cpu_s": round(cpu_s(os.getpid()) - emulator_before_s, 2),
            "load_average_1m": round(os.getloadavg()[0], 1),
        }
    finally:
        process.terminate()
        process.wait(timeout=30)


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        "load_average_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
    }


def write_markdown(path: Path, result: dict[str, Any]) -> None:
    m = result["machine"]
    lines = [
        "# Operator: time to converge and peak memory (Kubernetes API emulator)",
        "",
        f"Machine: {m['cores']} cores, {m['cpu']}; 1-minute load average "
        f"{m['load_average_1m_at_start']:.1f} at start (other jobs were running on the "
        "machine). Emulator and operator share the cores.",
        "",
        "| N resources | children each | all complete (s) | per resource (ms) "
        "| operator CPU (s) | emulator CPU (s) | operator peak RSS (MiB) | load avg 1m at end |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["runs"]:
        lines.append(
            f"| {row['n']} | {row['children_per_resource']} | {row['all_ready_s']:.2f} | "
            f"{row['per_resource_ms']:.0f} | {row['operator_cpu_s']:.1f} | "
            f"{row['emulator_cpu_s']:.1f} | "
            f"{row['operator_peak_rss_mib']:.0f} | {row['load_average_1m']:.1f} |"
        )
    lines += [
        "",
        "Complete = every resource has its Deployments, Services and PodDisruptionBudgets and "
        "`status.observedGeneration == metadata.generation`. CPU columns are user+system time "
        "during the run of the operator process and of the benchmark process (emulator plus "
        "polling); wall time above their sum is waiting (for the machine's other jobs, and "
        "kopf's batching windows between the steps of a resource). "
        "Reproduce: "
        "`.venv/bin/python bench/operator_bench.py`.",
    ]
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "operator")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="operator-bench-"))
    result: dict[str, Any] = {"machine": machine(), "runs": []}
    with EmulatorThread() as emulator:
        kubeconfig = emulator.write_kubeconfig(workdir)
        os.environ["KUBECONFIG"] = str(kubeconfig)
        kube = Kube(load_api_client(), field_manager="bench")
        for n in args.sizes:
            row = run_size(emulator, kubeconfig, kube, n, workdir)
            print(json.dumps(row), flush=True)
            result["runs"].append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(args.out.with_suffix(".md"), result)
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
