"""A Kubernetes Event on the engine pod when warm-up times out (best effort).

Runs only inside a pod: ``KUBERNETES_SERVICE_HOST`` (set by the kubelet) and the Downward API
variables ``POD_NAME`` and ``POD_NAMESPACE`` (``POD_UID`` optional) must be present; the pod's
service account needs ``create`` on ``events``. Anything missing or refused is logged and
ignored: an Event is never worth failing warm-up for.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from prefixserving import constants

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger("prefixserving.warmup")

COMPONENT = "prefixserving-warmup"


def pod_identity(env: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """(name, namespace, uid) of the pod this runs in, or None outside a cluster."""
    name = env.get(constants.ENV_POD_NAME)
    namespace = env.get(constants.ENV_POD_NAMESPACE)
    if not (env.get("KUBERNETES_SERVICE_HOST") and name and namespace):
        return None
    return name, namespace, env.get(constants.ENV_POD_UID) or None


def build_event(name: str, namespace: str, uid: str | None, message: str) -> dict:
    """A core/v1 Event about pod ``name``, reason ``WarmupTimedOut``, type Warning."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace}
    if uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.warmup-", "namespace": namespace},
        "involvedObject": involved,
        "reason": constants.REASON_WARMUP_TIMED_OUT,
        "message": message[:1024],
        "type": "Warning",
        "source": {"component": COMPONENT},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


class EventsApi(Protocol):
    """The one call used from ``kubernetes.client.CoreV1Api``."""

    def create_namespaced_event(self, namespace: str, body: dict) -> object: ...


def in_cluster_api() -> CoreV1Api:
    """A ``CoreV1Api`` with this pod's service account (the in-cluster configuration, in a
    client of its own: the global default configuration is left alone). The warm-up sidecar's
    one client builder: its timeout Event here, its handover (``warmup/handover.py``)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.CoreV1Api(client.ApiClient(configuration))


def emit_timeout_event(
    message: str,
    env: Mapping[str, str] | None = None,
    api: Callable[[], EventsApi] = in_cluster_api,
) -> bool:
    """Create the Event; return whether it was created. ``api`` builds the client (the
    in-cluster configuration by default)."""
    identity = pod_identity(os.environ if env is None else env)
    if identity is None:
        log.info("not in a pod (no POD_NAME/POD_NAMESPACE): no Kubernetes Event")
        return False
    try:
        api().create_namespaced_event(identity[1], build_event(*identity, message))
    except Exception as exc:  # best effort: a missing RBAC rule must not matter
        log.warning("could not create the warm-up timeout Event: %s", exc)
        return False
    return True
