"""Active-passive HA of the chart on a real cluster (``bash e2e/run.sh`` on kind; skipped
without a cluster): ``helm upgrade --set replicas=2`` on the installed release, the two pods'
keep-alives in the ClusterKopfPeering, deletion of the active pod (the entry with the highest
priority), and a PrefixServing created right after it still reconciles. The release goes
back to its replica count afterwards.

``tests/test_operator_peering.py`` runs the same handover with two operators on the API
emulator; this suite checks it with the chart's pods, a real watch and pod termination.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prefixserving import kinds
from prefixserving.controller.kube import Kube
from prefixserving_lab.testing import prefixserving_body, wait_for

wait_for = partial(wait_for, timeout_s=180.0, interval_s=1.0)

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "prefixserving-operator"
OPERATOR_SELECTOR = (
    "app.kubernetes.io/name=prefixserving-operator,app.kubernetes.io/component=operator"
)
CLUSTER_PEERING = kinds.KINDS[("kopf.dev/v1", "ClusterKopfPeering")]


def helm_upgrade(release: str, namespace: str, replicas: int) -> None:
    helm = shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    if not Path(helm).exists():
        pytest.fail("helm is not installed: run `bash scripts/setup.sh` (it fetches helm)")
    result = subprocess.run(
        [
            helm, "upgrade", release, str(CHART), "--namespace", namespace, "--reuse-values",
            "--set", f"replicas={replicas}", "--wait", "--timeout", "5m",
        ],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def two_replicas(kube: Kube) -> Iterator[dict[str, Any]]:
    """The chart's operator Deployment upgraded to 2 replicas; the old count afterwards."""
    found = kube.list(kinds.DEPLOYMENT, None, OPERATOR_SELECTOR)
    if len(found) != 1:
        pytest.skip(f"expected one operator Deployment ({OPERATOR_SELECTOR}), found {len(found)}")
    meta = found[0]["metadata"]
    args = found[0]["spec"]["template"]["spec"]["containers"][0].get("args") or []
    if not any(a == "--all-namespaces" for a in args):
        pytest.skip("the HA scenario expects a cluster-wide install (no watchNamespaces)")
    release = meta["labels"]["app.kubernetes.io/instance"]
    replicas = found[0]["spec"].get("replicas", 1)
    helm_upgrade(release, meta["namespace"], 2)
    try:
        yield kube.get(kinds.DEPLOYMENT, meta["namespace"], meta["name"]) or {}
    finally:
        helm_upgrade(release, meta["namespace"], replicas)


def peering_name(deployment: dict[str, Any]) -> str:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (name,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--peering=")]
    return name


def live_keep_alives(kube: Kube, name: str, pods: set[str]) -> dict[str, int]:
    """Pod name -> priority, for the entries of running operator pods (kopf's identity is the
    pod name: the chart sets POD_ID)."""
    status = (kube.get(CLUSTER_PEERING, None, name) or {}).get("status") or {}
    return {pod: int(entry["priority"]) for pod, entry in status.items() if pod in pods}


def test_deleting_the_active_pod_hands_over(
    kube: Kube, namespace: str, two_replicas: dict[str, Any]
) -> None:
    peering = peering_name(two_replicas)
    pod_namespace = two_replicas["metadata"]["namespace"]

    def running_pods() -> set[str]:
        pods = kube.list(kinds.POD, pod_namespace, OPERATOR_SELECTOR)
        return {
            p["metadata"]["name"]
            for p in pods
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        }

    entries = wait_for(
        lambda: len(e := live_keep_alives(kube, peering, running_pods())) == 2 and e,
        what="keep-alives of both operator pods",
    )
    assert len(set(entries.values())) == 2, f"the replicas share a priority: {entries}"
    active = max(entries, key=entries.__getitem__)
    kube.delete(kinds.POD, pod_namespace, active)
    wait_for(
        lambda: active not in live_keep_alives(kube, peering, {active}),
        what="the deleted pod's keep-alive removed on its clean exit",
    )

    kube.request(
        "POST",
        kinds.PREFIX_SERVING.path(namespace),
        body=prefixserving_body("after-failover", namespace, replicas=1),
    )

    def reconciled() -> bool:
        body = kube.get(kinds.PREFIX_SERVING, namespace, "after-failover") or {}
        status = body.get("status") or {}
        return status.get("observedGeneration") == 1 and status.get("replicas") is not None

    wait_for(reconciled, what="the PrefixServing reconciled, status included, after failover")
