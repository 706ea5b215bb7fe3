"""Run the operator in-process (kopf's ``KopfRunner``) against the Kubernetes emulator.

:class:`Harness` owns one emulator, a kubeconfig pointing at it, a :class:`Kube` client for
the test's own requests, and at most one running operator. The operator's settings come from
``PREFIXSERVING_*`` variables set here before the operator starts (its periodic jobs read
their periods at start-up, so every test module gets the same short ones).

Several operators can run at once (the peering tests): each one started with a ``token`` gets
its own kubeconfig with that token, so the emulator's request log tells their requests apart
(:meth:`Harness.requests_of`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kmock
from kopf.testing import KopfRunner

from prefixserving.api import names
from prefixserving.controller.kube import Kube, load_api_client
from prefixserving.kinds import CHILD_KINDS, KINDS, PREFIX_SERVING, Kind
from prefixserving_lab.testing import wait_for

from .kube_emulator import EmulatorThread, ResourceType

# The name of the operator started without a token (it uses the harness's kubeconfig).
DEFAULT_OPERATOR = "emulator"

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
        self.runners: dict[str, KopfRunner] = {}  # token -> running operator, in start order

    # ----------------------------------------------------------------- operator
    def start_operator(self, *scope: str, token: str | None = None) -> None:
        """Start kopf over the handlers; ``scope`` is kopf's namespace flags (default: all).

        With a ``token``, the operator gets a kubeconfig of its own carrying it, and this call
        returns once the emulator has seen a kopf request with that token: the operator reads
        ``$KUBECONFIG`` and the settings at start-up (before kopf's first request), so the
        next operator may then be started with other variables."""
        name = token or DEFAULT_OPERATOR
        assert name not in self.runners, f"the operator {name!r} is already running"
        args = [
            "run",
            "--standalone",
            *(scope or ("--all-namespaces",)),
            "-m",
            "prefixserving.controller.main",
        ]
        runner = KopfRunner(args, timeout=60)
        if token is None:
            runner.__enter__()
            self.runners[name] = runner
            return
        (self.workdir / token).mkdir(exist_ok=True)
        os.environ["KUBECONFIG"] = str(
            self.emulator.write_kubeconfig(self.workdir / token, token=token)
        )
        try:
            runner.__enter__()
            self.runners[name] = runner
            wait_for(
                lambda: any(
                    r.headers.get("User-Agent", "").startswith("kopf/")
                    for r in self.requests_of(token)
                ),
                what=f"the first request of the operator {token!r}",
            )
        finally:
            os.environ["KUBECONFIG"] = str(self.kubeconfig)

    def stop_operator(self, token: str | None = None) -> None:
        runner = self.runners.pop(token or DEFAULT_OPERATOR, None)
        if runner is not None:
            runner.__exit__(None, None, None)
            assert runner.exception is None, runner.exception

    def close(self) -> None:
        # Newest first: each KopfRunner swaps sys.stdout in and restores the one it found.
        for name in reversed(list(self.runners)):
            self.stop_operator(name)
        self.emulator.stop()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def requests(self) -> list[kmock.Request]:
        """Every request the emulator has received, in arrival order."""
        return self.emulator.call(lambda: list(self.emulator.server))

    def requests_of(self, token: str) -> list[kmock.Request]:
        """The requests made with the kubeconfig of the operator started with ``token``."""
        bearer = f"Bearer {token}"
        return [r for r in self.requests() if _authorization(r) == bearer]

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
        selector = names.label_selector(names.instance_selector(name))
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


def _authorization(request: kmock.Request) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
