"""Router pods drain on a real cluster: a router pod deleted while a client sends requests
through the router Service fails none of them.

Two router replicas in front of two stand-in engines (``stand_ins.py``; kind has no GPUs). A
client pod inside the cluster sends requests one after another, each on a new connection, so
the Service spreads them over both routers. Once requests flow, the test deletes one router
pod and waits for the client to finish: every request must have answered 200. What this
checks that the loopback measurement (``bench/router_fleet_real.py``) cannot: the rendered
``preStop`` delay and termination grace against a real kubelet, EndpointSlice controller and
kube-proxy, which drop the pod from the Service while it drains.

Skipped, with the reason, when no cluster answers (``e2e/conftest.py``).
"""

from __future__ import annotations

from functools import partial

from prefixserving import constants
from prefixserving.api import names
from prefixserving.controller.kube import KINDS, PREFIX_SERVING, Kube
from prefixserving_lab.testing import prefixserving_body, wait_for
from stand_ins import client_codes, kubectl, stand_in_engine, start_client_loop

wait_for = partial(wait_for, timeout_s=300.0, interval_s=1.0)
POD = KINDS[("v1", "Pod")]
REQUESTS = 400
# Requests answered before the pod is deleted: enough that both routers took traffic.
BEFORE_DELETE = 40


def test_deleting_a_router_pod_under_traffic_fails_no_request(kube: Kube, namespace: str) -> None:
    body = prefixserving_body("drain", namespace, replicas=0, router={"replicas": 2})
    kube.request("POST", PREFIX_SERVING.path(namespace), body=body)
    for index in range(2):
        kube.request("POST", POD.path(namespace), body=stand_in_engine(namespace, "drain", index))
    kubectl("-n", namespace, "wait", "--for=condition=Ready", "pod", "-l",
            f"{constants.LABEL_COMPONENT}={constants.COMPONENT_ENGINE}",
            "--timeout=300s")  # fmt: skip
    router = names.router_deployment("drain")
    ready = ("-n", namespace, "get", "deployment", router, "-o", "jsonpath={.status.readyReplicas}")
    wait_for(lambda: kubectl(*ready) == "2", what="both router pods Ready")
    host = names.service_host(names.router_service("drain"), namespace)
    url = f"http://{host}:{constants.ROUTER_PORT}/v1/chat/completions"
    request = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}]}
    start_client_loop(namespace, "client", url, request, count=REQUESTS)
    wait_for(
        lambda: len(client_codes(namespace, "client")) >= BEFORE_DELETE,
        what=f"{BEFORE_DELETE} requests answered",
    )
    selector = names.label_selector(names.router_selector("drain"))
    victim = kubectl("-n", namespace, "get", "pod", "-l", selector,
                     "-o", "jsonpath={.items[0].metadata.name}")  # fmt: skip
    kubectl("-n", namespace, "delete", "pod", victim, "--wait=false")
    kubectl("-n", namespace, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/client",
            "--timeout=600s")  # fmt: skip
    codes = client_codes(namespace, "client")
    assert len(codes) == REQUESTS, codes[-5:]
    failed = [code for code in codes if code != "200"]
    assert not failed, f"{len(failed)} of {REQUESTS} requests failed: {sorted(set(failed))}"
