"""Run the operator in-process (kopf's ``KopfRunner``) against the Kubernetes emulator.

:class:`Harness` owns one emulator, a kubeconfig pointing at it, a :class:`Kube` client for
the test's own requests, and at most one running operator. The operator's settings come from
``PREFIXSERVING_*`` variables set here before the operator starts (its periodic jobs read
their periods at start-up, so every test module gets the same short ones).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kopf.testing import KopfRunner

from prefixserving.api import names
from prefixserving.controller.kube import Kube, load_api_client
from prefixserving.kinds import CHILD_KINDS, KINDS, PREFIX_SERVING, Kind

from .kube_emulator import EmulatorThread, ResourceType

# Short periods of the operator's periodic jobs for tests; read at operator start-up.
TEST_ENV = {
    "PREFIXSERVING_STATUS_INTERVAL_S": "1",
    "PREFIXSERVING_METRICS_INTERVAL_S": "1",
    "PREFIXSERVING_RESYNC_INTERVAL_S": "3600",
    "PREFIXSERVING_PROMETHEUS_TIMEOUT_S": "2",
}


class Harness:
    """An emulator, a kubeconfig, a client, and the operator on demand."""

    def __init__(
        self,
        workdir: Path,
        extra_types: Iterable[ResourceType] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.emulator = EmulatorThread(extra_types=list(extra_types)).start()
        self.kubeconfig = self.emulator.write_kubeconfig(workdir)
        self._saved_env = {
            key: os.environ.get(key) for key in [*TEST_ENV, "KUBECONFIG", *(env or {})]
        }
        os.environ.update(TEST_ENV | {"KUBECONFIG": str(self.kubeconfig)} | (env or {}))
        self.kube = Kube(load_api_client(), field_manager="test-client")
        self.runner: KopfRunner | None = None

    # ----------------------------------------------------------------- operator
    def start_operator(self, *scope: str) -> None:
        """Start kopf over the handlers; ``scope`` is kopf's namespace flags (default: all)."""
        assert self.runner is None, "the operator is already running"
        args = [
            "run",
            "--standalone",
            *(scope or ("--all-namespaces",)),
            "-m",
            "prefixserving.controller.main",
        ]
        self.runner = KopfRunner(args, timeout=60)
        self.runner.__enter__()

    def stop_operator(self) -> None:
        if self.runner is not None:
            runner, self.runner = self.runner, None
            runner.__exit__(None, None, None)
            assert runner.exception is None, runner.exception

    def close(self) -> None:
        self.stop_operator()
        self.emulator.stop()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    # ----------------------------------------------------------------- API helpers
    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        kind = KINDS[(body["apiVersion"], body["kind"])]
        return self.kube.request("POST", kind.path(body["metadata"]["namespace"]), body=body)

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(kind, namespace, name)

    def prefixserving(self, namespace: str, name: str) -> dict[str, Any]:
        body = self.kube.get(PREFIX_SERVING, namespace, name)
        assert body is not None, f"{namespace}/{name} is gone"
        return body

    def patch_spec(self, namespace: str, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
        return self.kube.merge_patch(PREFIX_SERVING, namespace, name, {"spec": spec_patch})

    def children(self, namespace: str, name: str) -> dict[str, dict[str, Any]]:
        """``Kind/name`` -> object for every object labelled as this resource's child."""
        selector = ",".join(f"{k}={v}" for k, v in names.instance_selector(name).items())
        found: dict[str, dict[str, Any]] = {}
        for kind in CHILD_KINDS:
            if not self.kube.served(kind.api_version, kind.plural):
                continue
            for obj in self.kube.list(kind, namespace, selector):
                found[f"{kind.kind}/{obj['metadata']['name']}"] = obj
        return found

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        status = self.prefixserving(namespace, name).get("status") or {}
        return next((c for c in status.get("conditions") or [] if c["type"] == type_), None)

    def events(self, namespace: str, involved: str) -> list[dict[str, Any]]:
        items = self.kube.list(KINDS[("v1", "Event")], namespace)
        return [e for e in items if e.get("involvedObject", {}).get("name") == involved]
