"""The only module that talks to the Kubernetes API server.

A thin layer over the official ``kubernetes`` client's ``ApiClient`` (generic requests, no
generated per-kind classes): server-side apply with the operator's field manager, get, list by
label selector, merge patches (main resource and ``/status``), delete, Events, and API
discovery. Objects are plain dicts in and out. Errors become :class:`KubeError` carrying the
server's status code, reason and message, so callers can report exactly what was refused.

Each call is one HTTP request (discovery answers are cached per client), except
``update_status``: a read-modify-write, GET then PATCH, read again on a conflict. The client is
thread-safe, so kopf's sync handlers and the periodic jobs' threads share one instance.
"""

from __future__ import annotations

import copy
import datetime
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from prefixserving import constants
from prefixserving.controller.settings import MAX_WORKERS

# The kinds come from the one table (prefixserving.kinds); callers that talk to the API server
# name them through this module.
from prefixserving.kinds import (
    DEPLOYMENT,
    EVENT,
    KINDS,
    POD,
    PREFIX_SERVING,
    SCALING_POLICY,
    SERVICE,
    Kind,
    kind_of,
)

__all__ = [
    "DEPLOYMENT",
    "EVENT",
    "KINDS",
    "POD",
    "PREFIX_SERVING",
    "SCALING_POLICY",
    "SERVICE",
    "Kind",
    "Kube",
    "KubeError",
    "kind_of",
    "load_api_client",
]

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
# Threads that call the API server: kopf's handler executor and the periodic jobs' pool, plus
# the main thread (urllib3 discards, then reopens, connections beyond its pool size).
CONNECTIONS = 2 * MAX_WORKERS + 1
STATUS_ATTEMPTS = 5


class KubeError(Exception):
    """The API server refused a request."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @classmethod
    def from_exception(cls, exc: ApiException) -> KubeError:
        reason, message = exc.reason or "", str(exc.body or "")
        try:
            body = json.loads(exc.body or "{}")
            reason, message = body.get("reason", reason), body.get("message", message)
        except (TypeError, ValueError):
            pass
        return cls(int(exc.status or 0), str(reason), str(message))


def load_api_client() -> ApiClient:
    """In-cluster service-account credentials when running in a pod, else the kubeconfig
    (``$KUBECONFIG`` or ``~/.kube/config``). The connection pool keeps a connection for each
    thread that may call the API server (``CONNECTIONS``), so none is opened per request."""
    configuration = kubernetes.client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
        )
    configuration.connection_pool_maxsize = CONNECTIONS
    return ApiClient(configuration)


class Kube:
    """Requests to the API server, as the operator's field manager."""

    def __init__(self, api: ApiClient, field_manager: str = constants.FIELD_MANAGER) -> None:
        self.api = api
        self.field_manager = field_manager
        # Read once: the client's host property re-reads the proxy environment on every call.
        self._host = api.configuration.host
        self._discovery: dict[str, set[str] | None] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ transport
    def request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or :class:`KubeError`."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method_, url, headers_, body_, post = self.api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
            _host=self._host,
        )
        try:
            response = self.api.call_api(
                method_, url, headers_, body_, post, _request_timeout=REQUEST_TIMEOUT_S
            )
            response.read()
        except ApiException as exc:
            raise KubeError.from_exception(exc) from exc
        if not 200 <= response.status <= 299:
            raise KubeError.from_exception(ApiException(http_resp=response))
        return json.loads(response.data or b"{}")

    # ------------------------------------------------------------------ objects
    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` with force: the operator owns exactly the fields it sends."""
        kind = kind_of(obj)
        meta = obj["metadata"]
        return self.request(
            "PATCH",
            kind.path(meta.get("namespace"), meta["name"]),
            query=[("fieldManager", self.field_manager), ("force", "true")],
            body=dict(obj),
            content_type="application/apply-patch+yaml",
        )

    def get(self, kind: Kind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", kind.path(namespace, name))
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    def list(
        self, kind: Kind, namespace: str | None, label_selector: str = ""
    ) -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        return list(self.request("GET", kind.path(namespace), query=query).get("items") or [])

    def merge_patch(
        self,
        kind: Kind,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str = "",
    ) -> dict[str, Any]:
        return self.request(
            "PATCH",
            kind.path(namespace, name, subresource),
            query=[("fieldManager", self.field_manager)],
            body=dict(patch),
            content_type="application/merge-patch+json",
        )

    def update_status(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        mutate: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Read-modify-write of ``status`` with optimistic concurrency (the patch carries the
        resourceVersion it was computed from; a 409 re-reads and retries). ``mutate`` gets a
        copy of the current status and returns the new one. Returns (before, after), or None
        when the object is gone."""
        for _ in range(STATUS_ATTEMPTS):
            obj = self.get(kind, namespace, name)
            if obj is None:
                return None
            before = obj.get("status") or {}
            after = mutate(copy.deepcopy(before))
            if after == before:
                return before, after
            body = {key: None for key in before if key not in after} | after
            patch = {
                "metadata": {"resourceVersion": obj["metadata"]["resourceVersion"]},
                "status": body,
            }
            try:
                self.merge_patch(kind, namespace, name, patch, subresource="status")
            except KubeError as exc:
                if exc.status == 409:
                    continue
                raise
            return before, after
        raise KubeError(409, "Conflict", f"the status of {name} kept changing; will retry")

    def delete(self, kind: Kind, namespace: str | None, name: str) -> bool:
        """Delete with background propagation; False when it was already gone."""
        try:
            self.request(
                "DELETE",
                kind.path(namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
        except KubeError as exc:
            if exc.not_found:
                return False
            raise
        return True

    def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event on ``involved``; failures are logged, never raised."""
        meta = involved["metadata"]
        now = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", EVENT.path(meta["namespace"]), body=body)
        except KubeError as exc:
            logger.warning("could not record event %s on %s: %s", reason, meta["name"], exc)

    # ------------------------------------------------------------------ discovery
    def served(self, api_version: str, plural: str) -> bool:
        """Whether the server serves ``plural`` in ``api_version`` (a CRD or an aggregated API
        is installed). Positive answers are cached; negative ones are asked again next time,
        so installing KEDA later is noticed."""
        with self._lock:
            cached = self._discovery.get(api_version)
        if cached is not None:
            return plural in cached
        root = "/apis" if "/" in api_version else "/api"
        try:
            answer = self.request("GET", f"{root}/{api_version}")
        except KubeError as exc:
            if exc.status in (404, 503):
                return False
            raise
        names = {resource["name"].split("/")[0] for resource in answer.get("resources") or []}
        if plural in names:
            with self._lock:
                self._discovery[api_version] = names
        return plural in names
