"""Cluster-side helpers shared by the e2e scenarios that need serving: ``kubectl``, stand-in
engine pods (kind has no GPUs) and a client inside the cluster.

A stand-in engine is ``hashicorp/http-echo`` (``E2E_ECHO_IMAGE``): it answers every path,
``/health`` included, with 200 and ``engine-<index>``, so the router and the endpoint picker
see a healthy engine and a request's answer names the pod that served it. It has no
``/metrics``: routing falls back to the router's own in-flight counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from typing import Any

from prefixserving import constants
from prefixserving.api import names

ECHO_IMAGE = os.environ.get("E2E_ECHO_IMAGE", "hashicorp/http-echo:1.0")
CURL_IMAGE = os.environ.get("E2E_CURL_IMAGE", "curlimages/curl:8.11.1")


def kubectl(*args: str, stdin: str | None = None) -> str:
    """Run ``kubectl``; its stdout (``CalledProcessError`` on failure)."""
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def stand_in_engine(namespace: str, name: str, index: int, labelled: bool = True) -> dict[str, Any]:
    """A stand-in engine pod of the PrefixServing ``name``. ``labelled=False`` leaves out the
    engine labels, so no Service or InferencePool selects it until the test adds them
    (:func:`label_as_engine`): a pod that is already running joins at a moment the test
    chooses."""
    labels = names.engine_selector(name) if labelled else {"e2e-stand-in": name}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{name}-stand-in-{index}", "namespace": namespace, "labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": ECHO_IMAGE,
                    "args": [f"-listen=:{constants.ENGINE_PORT}", f"-text=engine-{index}"],
                    "ports": [{"name": "http", "containerPort": constants.ENGINE_PORT}],
                    "readinessProbe": {
                        "httpGet": {"path": "/health", "port": constants.ENGINE_PORT}
                    },
                }
            ]
        },
    }


def label_as_engine(namespace: str, pod: str, name: str) -> None:
    """Give ``pod`` the engine labels of the PrefixServing ``name``."""
    pairs = [f"{key}={value}" for key, value in names.engine_selector(name).items()]
    kubectl("-n", namespace, "label", "pod", pod, "--overwrite", *pairs)


def curl_args(url: str, body: dict[str, Any]) -> list[str]:
    """curl's arguments for one JSON POST that prints the answer's status code last."""
    return [
        "-s", "-H", "Content-Type: application/json", "-d", json.dumps(body),
        "-w", "\\n%{http_code}", url,
    ]  # fmt: skip


def ask(
    namespace: str, url: str, body: dict[str, Any], extra: tuple[str, ...] | list[str] = ()
) -> tuple[str, int]:
    """POST ``body`` to ``url`` from a pod inside the cluster: what curl printed before the
    status (the answer, or with ``extra`` ``-D - -o /dev/null`` its headers) and the status."""
    out = kubectl(
        "-n", namespace, "run", f"ask-{uuid.uuid4().hex[:8]}", "--rm", "-i",
        "--restart=Never", "--quiet", f"--image={CURL_IMAGE}", "--",
        "--max-time", "120", *extra, *curl_args(url, body),
    )  # fmt: skip
    text, _, code = out.strip().rpartition("\n")
    return text.strip(), int(code or 0)


def start_client_loop(
    namespace: str, pod: str, url: str, body: dict[str, Any], count: int, max_time_s: int = 30
) -> None:
    """Start a client pod that sends ``count`` requests to ``url`` one after another, each on
    a new connection (so a Service spreads them over its pods) and each given up after
    ``max_time_s``, and prints each status code on a line of its log."""
    payload = json.dumps(body).replace("'", "'\\''")
    script = (
        f"i=0; while [ $i -lt {count} ]; do "
        f"curl -s -o /dev/null --max-time {max_time_s} -w '%{{http_code}}\\n' "
        f"-H 'Content-Type: application/json' -d '{payload}' {url}; "
        "i=$((i+1)); done"
    )
    kubectl(
        "-n", namespace, "run", pod, "--restart=Never", f"--image={CURL_IMAGE}",
        "--command", "--", "sh", "-c", script,
    )  # fmt: skip


def client_codes(namespace: str, pod: str) -> list[str]:
    """The status codes the client pod has printed so far."""
    return kubectl("-n", namespace, "logs", pod).split()
