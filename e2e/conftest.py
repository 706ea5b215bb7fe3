"""Fixtures of the end-to-end suite: a real cluster (kind) with the chart installed.

Every test skips with a clear message when no cluster answers at the current kubeconfig;
``e2e/run.sh`` creates the kind cluster, loads the images and installs the chart first.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from prefixserving import constants
from prefixserving.controller.kube import Kube, KubeError, load_api_client

SKIP_MESSAGE = (
    "no Kubernetes cluster reachable at the current kubeconfig; create one with the chart "
    "installed: bash e2e/run.sh (needs docker and kind)"
)


@pytest.fixture(scope="session")
def kube() -> Kube:
    try:
        client = Kube(load_api_client(), field_manager="e2e-tests")
        client.request("GET", "/version")
    except Exception as exc:  # any failure to reach a cluster means: skip the suite
        pytest.skip(f"{SKIP_MESSAGE} ({type(exc).__name__})")
    if not client.served(constants.API_VERSION, constants.PLURAL):
        pytest.skip(f"the PrefixServing CRD is not installed; {SKIP_MESSAGE}")
    return client


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = f"pfx-e2e-{uuid.uuid4().hex[:6]}"
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    yield name
    with contextlib.suppress(KubeError):
        kube.request("DELETE", f"/api/v1/namespaces/{name}")
