"""A real inference gateway in front of the endpoint picker (``spec.router.mode:
endpointPicker``), on a kind cluster prepared as e2e/README.md says (the InferencePool CRD, the
Gateway API CRDs, a gateway with its inference extension on; Istio by default).

kind has no GPUs, so the engine pods are stand-ins: the PrefixServing runs 0 engine replicas
and the test starts two small HTTP servers labelled as its engine pods (the headless engine
Service and the InferencePool select by those labels), each answering with its pod's name.
What this checks that the in-process tests cannot: the gateway opens the ext_proc stream to
the picker Service (TLS as rendered), applies the picked endpoint, and requests sharing a
prefix land on one engine; the picker's metrics count the gateway's requests.

Skipped, with the reason, when no cluster answers or the cluster lacks the CRDs or the
GatewayClass (``E2E_GATEWAY_CLASS``, default ``istio``).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prefixserving import constants
from prefixserving.api import lifecycle, names
from prefixserving.controller.kube import KINDS, PREFIX_SERVING, Kube
from prefixserving_lab.testing import prefixserving_body, wait_for

wait_for = partial(wait_for, timeout_s=300.0, interval_s=2.0)
ROOT = Path(__file__).resolve().parents[1]
GATEWAY_CLASS = os.environ.get("E2E_GATEWAY_CLASS", "istio")
# A tiny HTTP server for the stand-in engines (any path: 200 and the text).
ECHO_IMAGE = os.environ.get("E2E_ECHO_IMAGE", "hashicorp/http-echo:1.0")
POD = KINDS[("v1", "Pod")]
POOL = ("inference.networking.k8s.io/v1", "inferencepools")


@pytest.fixture
def gateway_cluster(kube: Kube) -> Kube:
    if not kube.served(*POOL):
        pytest.skip(
            "the InferencePool CRD is not installed: kubectl apply -f https://github.com/"
            "kubernetes-sigs/gateway-api-inference-extension/releases/download/v1.6.0/"
            "manifests.yaml (see e2e/README.md, Gateway scenario)"
        )
    if not kube.served("gateway.networking.k8s.io/v1", "gateways"):
        pytest.skip("the Gateway API CRDs are not installed (see e2e/README.md)")
    classes = kube.request("GET", "/apis/gateway.networking.k8s.io/v1/gatewayclasses")
    if GATEWAY_CLASS not in {c["metadata"]["name"] for c in classes.get("items", [])}:
        pytest.skip(f"no GatewayClass {GATEWAY_CLASS!r}: install the gateway (e2e/README.md)")
    return kube


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["kubectl", *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def stand_in_engine(namespace: str, name: str, index: int) -> dict[str, Any]:
    labels = names.engine_selector(name)
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


def gateway_documents(namespace: str) -> str:
    docs = yaml.safe_load_all((ROOT / "examples" / "gateway" / f"{GATEWAY_CLASS}.yaml").read_text())
    out = []
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "Gateway" and GATEWAY_CLASS == "istio":
            # kind has no load balancer: a ClusterIP Service still gets the Gateway programmed
            doc["metadata"]["annotations"] = {"networking.istio.io/service-type": "ClusterIP"}
        if doc["kind"] == "DestinationRule":
            doc["spec"]["host"] = names.service_host(names.router_service("chat"), namespace)
        out.append(doc)
    return yaml.safe_dump_all(out)


def ask(namespace: str, url: str, body: dict[str, Any]) -> str:
    """POST ``body`` to ``url`` from inside the cluster; the answer's text."""
    return kubectl(
        "-n", namespace, "run", f"ask-{uuid.uuid4().hex[:8]}", "--rm", "-i",
        "--restart=Never", "--quiet", "--image=curlimages/curl:8.11.1", "--",
        "-s", "-H", "Content-Type: application/json", "-d", json.dumps(body), url,
    ).strip()  # fmt: skip


def test_a_gateway_routes_through_the_picker_by_prefix(
    gateway_cluster: Kube, namespace: str
) -> None:
    kube = gateway_cluster
    body = prefixserving_body("chat", namespace, replicas=0, router={"mode": "endpointPicker"})
    kube.request("POST", PREFIX_SERVING.path(namespace), body=body)
    for index in range(2):
        kube.request("POST", POD.path(namespace), body=stand_in_engine(namespace, "chat", index))
    kubectl("apply", "-f", "-", stdin=gateway_documents(namespace))

    def degraded() -> dict[str, Any]:
        found = kube.get(PREFIX_SERVING, namespace, "chat") or {}
        conditions = (found.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == lifecycle.COND_DEGRADED), {})

    wait_for(lambda: degraded().get("status") == "False", what="every child applied")
    status = (kube.get(PREFIX_SERVING, namespace, "chat") or {})["status"]
    assert status.get("routerEndpoint") is None
    kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment/chat-router",
            "--timeout=300s")  # fmt: skip
    engines = f"{constants.LABEL_COMPONENT}={constants.COMPONENT_ENGINE}"
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod", "-l", engines,
            "--timeout=300s")  # fmt: skip
    kubectl("-n", namespace, "wait", "--for=condition=Programmed", "gateway/inference-gateway",
            "--timeout=300s")  # fmt: skip
    address = kubectl(
        "-n", namespace, "get", "gateway", "inference-gateway",
        "-o", "jsonpath={.status.addresses[0].value}",
    )  # fmt: skip
    url = f"http://{address}/v1/chat/completions"
    system = "You answer questions about the attached contract. " * 40
    served: dict[int, set[str]] = {}
    for i in range(12):
        request = {
            "model": "chat",
            "messages": [
                {"role": "system", "content": f"{i % 3} {system}"},
                {"role": "user", "content": f"question {i}"},
            ],
        }
        answer = wait_for(lambda request=request: ask(namespace, url, request), what="an answer")
        assert answer.startswith("engine-"), answer
        served.setdefault(i % 3, set()).add(answer)
    # each system prompt stayed on one engine (idle engines: no spill)
    assert all(len(engines) == 1 for engines in served.values()), served
    proxy = f"/api/v1/namespaces/{namespace}/services/chat-router:8080/proxy/metrics"
    metrics = kubectl("-n", namespace, "get", "--raw", proxy)
    decisions = sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "prefixserving_router_decisions_total"
    )
    assert decisions >= 12  # every request was picked (retries of `ask` may add some)
