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

import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from prefixserving.api import lifecycle, names
from prefixserving.controller.kube import KINDS, PREFIX_SERVING, Kube
from prefixserving_lab.testing import prefixserving_body, wait_for
from stand_ins import (
    ask,
    client_codes,
    kubectl,
    label_as_engine,
    stand_in_engine,
    start_client_loop,
)

wait_for = partial(wait_for, timeout_s=300.0, interval_s=2.0)
ROOT = Path(__file__).resolve().parents[1]
GATEWAY_CLASS = os.environ.get("E2E_GATEWAY_CLASS", "istio")
POD = KINDS[("v1", "Pod")]
# The picker's hold in the scale-from-zero scenario: longer than a labelled pod takes to
# reach the picker through its EndpointSlice.
HOLD_S = 60
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


def serve_through_gateway(
    kube: Kube, namespace: str, router: dict[str, Any], engines: list[dict[str, Any]]
) -> str:
    """Create the PrefixServing ``chat`` (0 engine replicas, ``router`` as its router block),
    the stand-in ``engines`` and the gateway; wait until every child is applied, the picker
    and the stand-ins are Ready and the gateway is Programmed. The chat completions URL."""
    body = prefixserving_body("chat", namespace, replicas=0, router=router)
    kube.request("POST", PREFIX_SERVING.path(namespace), body=body)
    for engine in engines:
        kube.request("POST", POD.path(namespace), body=engine)
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
    for engine in engines:
        kubectl("-n", namespace, "wait", "--for=condition=Ready",
                f"pod/{engine['metadata']['name']}", "--timeout=300s")  # fmt: skip
    kubectl("-n", namespace, "wait", "--for=condition=Programmed", "gateway/inference-gateway",
            "--timeout=300s")  # fmt: skip
    address = kubectl(
        "-n", namespace, "get", "gateway", "inference-gateway",
        "-o", "jsonpath={.status.addresses[0].value}",
    )  # fmt: skip
    return f"http://{address}/v1/chat/completions"


def picker_metric(namespace: str, name: str) -> float:
    """The sum of the picker's samples named ``name``, read through the API server's proxy."""
    proxy = f"/api/v1/namespaces/{namespace}/services/chat-router:8080/proxy/metrics"
    metrics = kubectl("-n", namespace, "get", "--raw", proxy)
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name
    )


def test_a_gateway_routes_through_the_picker_by_prefix(
    gateway_cluster: Kube, namespace: str
) -> None:
    engines = [stand_in_engine(namespace, "chat", index) for index in range(2)]
    url = serve_through_gateway(gateway_cluster, namespace, {"mode": "endpointPicker"}, engines)
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
        answer, _ = wait_for(
            lambda request=request: (reply := ask(namespace, url, request))[1] == 200 and reply,
            what="an answer",
        )
        assert answer.startswith("engine-"), answer
        served.setdefault(i % 3, set()).add(answer)
    # each system prompt stayed on one engine (idle engines: no spill)
    assert all(len(engines) == 1 for engines in served.values()), served
    decisions = picker_metric(namespace, "prefixserving_router_decisions_total")
    assert decisions >= 12  # every request was picked (retries of `ask` may add some)


def test_a_held_pick_is_served_when_an_engine_joins(gateway_cluster: Kube, namespace: str) -> None:
    """Scale from zero through the gateway: with no engine, the picker holds the gateway's
    request; an engine pod that joins then serves it. The stand-in runs from the start but
    carries the engine labels only once the request is held, so the test, not the image
    pull, decides when the engine appears. Needs the gateway's ext_proc message timeout above
    the hold (docs/autoscaling.md, scale from zero)."""
    engine = stand_in_engine(namespace, "chat", 0, labelled=False)
    router = {"mode": "endpointPicker", "noEngineHoldSeconds": HOLD_S}
    url = serve_through_gateway(gateway_cluster, namespace, router, [engine])
    request = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
    start_client_loop(namespace, "held-client", url, request, count=1, max_time_s=2 * HOLD_S)
    held = "prefixserving_router_held_requests"
    wait_for(lambda: picker_metric(namespace, held) >= 1, what="the picker holding the request")
    label_as_engine(namespace, engine["metadata"]["name"], "chat")
    kubectl("-n", namespace, "wait", "--for=jsonpath={.status.phase}=Succeeded",
            "pod/held-client", f"--timeout={2 * HOLD_S}s")  # fmt: skip
    assert client_codes(namespace, "held-client") == ["200"]
    assert picker_metric(namespace, held) == 0


def test_a_held_pick_gets_503_with_retry_after_when_no_engine_comes(
    gateway_cluster: Kube, namespace: str
) -> None:
    router = {"mode": "endpointPicker", "noEngineHoldSeconds": 5}
    url = serve_through_gateway(gateway_cluster, namespace, router, [])
    request = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
    headers, code = ask(namespace, url, request, extra=["-D", "-", "-o", "/dev/null"])
    assert code == 503, headers
    assert "retry-after:" in headers.lower(), headers
