"""Operator benchmark: time from applying N PrefixServings until every one has all its children
and a current ``status.observedGeneration``, and the operator's peak memory, for N = 1, 10,
100 and 1,000.

Set-up: the Kubernetes API emulator (``tests/support/kube_emulator``) runs in this process on
loopback; the operator runs as a separate process, exactly as deployed (``prefixserving
operator --all-namespaces``, default timer periods, no Prometheus), started fresh for each N so
its peak RSS (``VmHWM`` from ``/proc``) belongs to that N. Resources are created back to back in
a new namespace; the clock stops when the last one is complete (polled every 0.25 s: the
resources' statuses, then, once all are current, their children).
The emulator shares the machine with the operator, so absolute times include its work too.

Run: ``.venv/bin/python bench/operator_bench.py`` -> ``operator.{json,md}`` in ``--out-dir``
(``bench/results``); ``--sizes 1 10`` runs fewer sizes.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from prefixserving.api.validation import parse_resource  # noqa: E402
from prefixserving.controller.kube import Kube, load_api_client  # noqa: E402
from prefixserving.kinds import KINDS, PREFIX_SERVING  # noqa: E402
from prefixserving.render import render_children  # noqa: E402
from prefixserving_lab.machine import load_average_1m, machine, machine_line  # noqa: E402
from prefixserving_lab.reports.files import write_results  # noqa: E402
from prefixserving_lab.runners.stack.processes import (  # noqa: E402
    cpu_seconds,
    free_port,
    peak_rss_mib,
    stop_process,
    wait_http_ok,
)
from prefixserving_lab.testing import prefixserving_body  # noqa: E402
from support.kube_emulator import EmulatorThread  # noqa: E402

SIZES = (1, 10, 100, 1000)
TIMEOUT_S = 900.0
START_TIMEOUT_S = 120.0
POLL_S = 0.25
CHILD_KINDS = [
    KINDS[k]
    for k in (("apps/v1", "Deployment"), ("v1", "Service"), ("policy/v1", "PodDisruptionBudget"))
]


def expected_children_per_resource() -> int:
    body = prefixserving_body("probe", "bench")
    body["metadata"]["uid"] = "probe"
    rendered = render_children(parse_resource(body))
    return sum(1 for c in rendered if any(c["kind"] == k.kind for k in CHILD_KINDS))


def start_operator(kubeconfig: Path, log: Path) -> subprocess.Popen[bytes]:
    """``prefixserving operator --all-namespaces`` against ``kubeconfig``, once it is live."""
    port = free_port()
    env = os.environ | {"KUBECONFIG": str(kubeconfig)}
    command = [sys.executable, "-m", "prefixserving.cli", "operator", "--all-namespaces"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--health-port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/healthz", process, "the operator", START_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as error:
        stop_process(process)
        raise RuntimeError(f"{error}: {log.read_text()[-2000:]}") from error
    return process


def complete(kube: Kube, namespace: str, n: int, per_resource: int) -> bool:
    """Every resource reconciled (current ``observedGeneration``) and all children there. The
    children are listed only once the statuses are current: each poll costs the emulator a copy
    of every object it lists, and the benchmark shares the machine with it."""
    items = kube.list(PREFIX_SERVING, namespace)
    if len(items) < n:
        return False
    if any(
        (i.get("status") or {}).get("observedGeneration") != i["metadata"]["generation"]
        for i in items
    ):
        return False
    return sum(len(kube.list(kind, namespace)) for kind in CHILD_KINDS) >= n * per_resource


def run_size(kubeconfig: Path, kube: Kube, n: int, workdir: Path) -> dict[str, Any]:
    per_resource = expected_children_per_resource()
    process = start_operator(kubeconfig, workdir / f"operator-{n}.log")
    try:
        namespace = f"bench-n{n}"
        cpu_before_s = cpu_seconds(process.pid)
        emulator_before_s = cpu_seconds(os.getpid())
        started = time.monotonic()
        for index in range(n):
            body = prefixserving_body(f"m{index}", namespace)
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
            "operator_cpu_s": round(cpu_seconds(process.pid) - cpu_before_s, 2),
            "emulator_cpu_s": round(cpu_seconds(os.getpid()) - emulator_before_s, 2),
            "load_average_1m": load_average_1m(),
        }
    finally:
        stop_process(process, grace_s=30.0)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Operator: time to converge and peak memory (Kubernetes API emulator)",
        "",
        f"Machine: {machine_line(result['machine'])} at the start. Emulator and operator share "
        "the cores.",
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
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="operator-bench-"))
    result: dict[str, Any] = {"benchmark": "operator", "machine": machine(), "runs": []}
    with EmulatorThread() as emulator:
        kubeconfig = emulator.write_kubeconfig(workdir)
        os.environ["KUBECONFIG"] = str(kubeconfig)
        kube = Kube(load_api_client(), field_manager="bench")
        for n in args.sizes:
            row = run_size(kubeconfig, kube, n, workdir)
            print(row, flush=True)
            result["runs"].append(row)
    json_path, md_path = write_results(args.out_dir, "operator", result, markdown(result))
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
