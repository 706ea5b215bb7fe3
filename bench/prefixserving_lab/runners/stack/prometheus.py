"""Start a real Prometheus server (Debian package ``prometheus``) on loopback.

Used by tests and the local stack to run the exact PromQL that the operator, the KEDA
ScaledObject and the prometheus-adapter rules contain against live targets::

    with running_prometheus(["127.0.0.1:8001", "127.0.0.1:8002"]) as prom:
        prom.query("sum(vllm:num_requests_waiting)")

Targets are scraped every ``scrape_interval_s`` under job ``vllm``; each target's
``instance`` label is its address, and ``extra_labels`` are attached to all of them (the
labels Kubernetes service discovery would add, e.g. ``namespace`` and ``pod``);
``target_labels`` adds labels to single targets (a distinct ``pod`` per engine, say).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from prefixserving_lab.runners.stack.processes import free_port, stop_process


class PrometheusNotInstalled(RuntimeError):
    pass


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; returns the ``result`` vector (raises on a PromQL error)."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise ValueError(f"query failed: {promql}: {body.get('error')}")
        return list(body["data"]["result"])

    def targets_up(self) -> int:
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()
        return sum(1 for t in body["data"]["activeTargets"] if t["health"] == "up")

    def stop(self) -> None:
        stop_process(self.process, grace_s=15)


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusNotInstalled(
            "prometheus is not installed: apt-get install -y prometheus (or run scripts/setup.sh)"
        )
    return path


def write_config(
    directory: Path,
    targets: Sequence[str],
    *,
    scrape_interval_s: float,
    extra_labels: Mapping[str, str],
    rule_files: Sequence[Path] = (),
    target_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Path:
    per_target = target_labels or {}
    static_configs = [
        {"targets": [target], "labels": {**extra_labels, **per_target.get(target, {})}}
        for target in targets
    ]
    config = {
        "global": {
            "scrape_interval": _duration(scrape_interval_s),
            "evaluation_interval": _duration(scrape_interval_s),
        },
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": static_configs,
            }
        ],
    }
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    return path


@contextlib.contextmanager
def running_prometheus(
    targets: Sequence[str],
    *,
    scrape_interval_s: float = 1.0,
    extra_labels: Mapping[str, str] | None = None,
    rule_files: Sequence[Path] = (),
    timeout_s: float = 60.0,
    target_labels: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[Prometheus]:
    """Start Prometheus scraping ``targets`` (``host:port``); wait until every target is up."""
    binary = prometheus_binary()
    root = Path(tempfile.mkdtemp(prefix="prefixserving-prometheus-"))
    config = write_config(
        root,
        targets,
        scrape_interval_s=scrape_interval_s,
        extra_labels=extra_labels or {},
        rule_files=rule_files,
        target_labels=target_labels,
    )
    port = free_port()
    log_path = root / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    prom = Prometheus(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited:\n{log_path.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                if prom.targets_up() >= len(targets):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus targets not up after {timeout_s:.0f} s")
            time.sleep(0.5)
        yield prom
    finally:
        prom.stop()
        shutil.rmtree(root, ignore_errors=True)


def _duration(seconds: float) -> str:
    """A Prometheus duration string (Prometheus rejects fractional units such as ``1.5s``)."""
    return f"{round(seconds * 1000)}ms"
