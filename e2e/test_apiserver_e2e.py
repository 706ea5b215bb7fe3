"""What only a real API server shows (``bash e2e/run.sh`` on kind; skipped without a cluster):

- RBAC: the operator's ServiceAccount can do exactly what the kind table says
  (``kubectl auth can-i`` per row and verb), and a verb the table does not list is denied;
- deletion: with the operator scaled to 0, a PrefixServing is deleted at once (no finalizer)
  and Kubernetes garbage collection removes its children;
- CRD admission: the generated CRD is admitted (server-side dry-run apply), and a resource that
  breaks a CEL rule is refused with the rule's message.

The emulator tests in ``tests/`` cover the same logic without RBAC, a background garbage
collector or the server's CRD validation.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from prefixserving import constants, kinds
from prefixserving.api import crd, validation
from prefixserving.api import types as t
from prefixserving.controller.kube import Kube, KubeError
from prefixserving_lab.testing import prefixserving_body, wait_for

wait_for = partial(wait_for, timeout_s=120.0, interval_s=1.0)

ROOT = Path(__file__).resolve().parents[1]
OPERATOR_SELECTOR = (
    "app.kubernetes.io/name=prefixserving-operator,app.kubernetes.io/component=operator"
)
# Verbs checked on every row: those the row lists must be allowed, the others denied.
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
CRD_KIND = kinds.KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")]


def kubectl() -> str:
    found = shutil.which("kubectl") or str(ROOT / ".tools" / "bin" / "kubectl")
    if not Path(found).exists():
        pytest.fail("kubectl is not installed: run `bash scripts/setup.sh` (it fetches kubectl)")
    return found


@pytest.fixture(scope="module")
def operator_deployment(kube: Kube) -> dict[str, Any]:
    """The chart's operator Deployment (any namespace)."""
    found = kube.list(kinds.DEPLOYMENT, None, OPERATOR_SELECTOR)
    if len(found) != 1:
        pytest.skip(f"expected one operator Deployment ({OPERATOR_SELECTOR}), found {len(found)}")
    return found[0]


def can_i(verb: str, resource: str, service_account: str, namespace: str | None) -> bool:
    """``kubectl auth can-i`` as the ServiceAccount (``resource`` may be ``plural/sub``)."""
    plural, _, sub = resource.partition("/")
    args = [kubectl(), "auth", "can-i", verb, plural, f"--as={service_account}"]
    args += [f"--subresource={sub}"] if sub else []
    args += ["-n", namespace] if namespace else []
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode not in (0, 1):
        pytest.fail(f"{' '.join(args)} failed: {result.stderr}")
    return result.returncode == 0


def test_operator_service_account_can_do_exactly_what_the_kind_table_says(
    kube: Kube, operator_deployment: dict[str, Any], namespace: str
) -> None:
    pod_spec = operator_deployment["spec"]["template"]["spec"]
    args = pod_spec["containers"][0].get("args") or []
    if any(a.startswith("--namespace") for a in args):
        pytest.skip(
            "the chart is installed with watchNamespaces; this test needs a cluster-wide one"
        )
    account = (
        f"system:serviceaccount:{operator_deployment['metadata']['namespace']}:"
        f"{pod_spec['serviceAccountName']}"
    )
    expected = kinds.chart_rules(cluster_wide=True).cluster_role
    namespaced = {(k.group, k.plural) for k in kinds.KINDS.values() if k.namespaced}
    wrong = []
    for (group, resource), verbs in sorted(expected.items()):
        plural, _, sub = resource.partition("/")
        target = f"{plural}.{group}/{sub}" if sub else f"{plural}.{group}" if group else plural
        ns = namespace if (group, plural) in namespaced else None
        for verb in VERBS:
            allowed = can_i(verb, target, account, ns)
            if allowed != (verb in verbs):
                wrong.append(f"{verb} {target}: {'allowed' if allowed else 'denied'}")
    assert wrong == [], "RBAC differs from prefixserving.kinds (docs/reference/kinds.md)"
    assert not can_i("get", "secrets", account, namespace)


@pytest.fixture
def operator_scaled_to_zero(kube: Kube, operator_deployment: dict[str, Any]) -> Iterator[None]:
    """Scale the operator to 0 and wait for its pods to go; scale it back afterwards."""
    meta = operator_deployment["metadata"]
    replicas = operator_deployment["spec"].get("replicas", 1)

    def scale(count: int) -> None:
        kube.request(
            "PATCH",
            kinds.DEPLOYMENT.path(meta["namespace"], meta["name"], "scale"),
            query=[("fieldManager", "e2e-tests")],
            body={"spec": {"replicas": count}},
            content_type="application/merge-patch+json",
        )

    scale(0)
    try:
        wait_for(
            lambda: not kube.list(kinds.POD, meta["namespace"], OPERATOR_SELECTOR),
            what="operator pods gone",
        )
        yield
    finally:
        scale(replicas)
        wait_for(
            lambda: (
                (kube.get(kinds.DEPLOYMENT, meta["namespace"], meta["name"]) or {})
                .get("status", {})
                .get("availableReplicas", 0)
                >= replicas
            ),
            what="operator available again",
        )


def children(kube: Kube, namespace: str, name: str) -> list[str]:
    selector = f"{constants.LABEL_INSTANCE}={name},{constants.LABEL_NAME}={constants.PART_OF}"
    return [
        f"{kind.kind}/{obj['metadata']['name']}"
        for kind in kinds.CHILD_KINDS
        if kube.served(kind.api_version, kind.plural)
        for obj in kube.list(kind, namespace, selector)
    ]


def test_delete_while_the_operator_is_down(
    kube: Kube, namespace: str, operator_deployment: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    body = prefixserving_body("orphan", namespace, replicas=1)
    kube.request("POST", kinds.PREFIX_SERVING.path(namespace), body=body)
    wait_for(lambda: len(children(kube, namespace, "orphan")) >= 6, what="children")
    created = kube.get(kinds.PREFIX_SERVING, namespace, "orphan") or {}
    assert not created["metadata"].get("finalizers")

    request.getfixturevalue("operator_scaled_to_zero")
    kube.delete(kinds.PREFIX_SERVING, namespace, "orphan")
    # No finalizer: gone as soon as the API server processed the delete (no operator needed).
    wait_for(
        lambda: kube.get(kinds.PREFIX_SERVING, namespace, "orphan") is None,
        timeout_s=10.0,
        what="the PrefixServing gone without the operator",
    )
    wait_for(lambda: not children(kube, namespace, "orphan"), what="garbage collection")


def test_generated_crd_is_admitted_and_installed(kube: Kube) -> None:
    """The API server accepts what ``prefixserving crd`` generates (dry run: nothing changes),
    and the chart installed the same schema (both as the server stores them)."""
    for generated in crd.crds().values():
        name = generated["metadata"]["name"]
        admitted = kube.request(
            "PATCH",
            CRD_KIND.path(None, name),
            query=[("fieldManager", "e2e-tests"), ("force", "true"), ("dryRun", "All")],
            body=generated,
            content_type="application/apply-patch+yaml",
        )
        installed = kube.get(CRD_KIND, None, name) or {}
        assert installed["spec"]["versions"] == admitted["spec"]["versions"], (
            f"{name} in the cluster differs from `prefixserving crd`: reinstall the chart"
        )


def _message(model: type, field: str) -> str:
    (rule,) = [r for r in validation.rules_for(model) if r.field == field and r.cel]
    return rule.message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"replicas": 2, "autoscaling": {"enabled": True}},
            _message(t.PrefixServingSpec, "replicas"),
        ),
        (
            {
                "model": {
                    "servedName": "base",
                    "source": {"huggingFace": {"repo": "example/base"}},
                    "adapters": [
                        {"name": "a", "source": {"huggingFace": {"repo": "example/a"}}},
                        {"name": "a", "source": {"huggingFace": {"repo": "example/b"}}},
                    ],
                }
            },
            _message(t.ModelSpec, "adapters"),
        ),
    ],
    ids=["replicas-with-autoscaling", "duplicate-adapters"],
)
def test_cel_rule_refuses_with_its_message(
    kube: Kube, namespace: str, spec: dict[str, Any], message: str
) -> None:
    body = prefixserving_body("refused", namespace)
    body["spec"].update(spec)
    with pytest.raises(KubeError) as refused:
        kube.request("POST", kinds.PREFIX_SERVING.path(namespace), body=body)
    assert refused.value.status == 422
    assert message in refused.value.message
    assert kube.get(kinds.PREFIX_SERVING, namespace, "refused") is None
