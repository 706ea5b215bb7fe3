"""Every kopf decorator of the operator; each handler is a one-line delegate.

Settings are read once at import (the timers' intervals are decorator arguments);
``prefixserving operator`` sets them from its flags before kopf imports this module. The API
client and the settings reach the handlers through ``memo`` (kopf.Memo), never module state.
Handler ids come from ``prefixserving.constants`` and are never renamed: kopf stores progress
under them.
"""

from __future__ import annotations

from typing import Any

import kopf

from prefixserving import constants as c
from prefixserving.controller import settings as operator_settings
from prefixserving.controller.handlers import reconcile, status
from prefixserving.controller.kube import Kube, load_api_client

SETTINGS = operator_settings.load()
RESOURCE = (c.GROUP, c.VERSION, c.PLURAL)
POLICY = (c.GROUP, c.VERSION, c.POLICY_PLURAL)
OWNED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}
# The children the drift handler watches (group, version, plural).
CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("keda.sh", "v1alpha1", "scaledobjects"),
)


@kopf.on.startup()
def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    memo.settings = operator_settings.load()  # fresh: the environment may have changed
    operator_settings.configure_kopf(settings, memo.settings)
    memo.kube = Kube(load_api_client())


@kopf.on.login()
def operator_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index(*RESOURCE)
def prefixserving_policy_refs(namespace: str, name: str, spec: kopf.Spec, **_: Any) -> dict:
    return reconcile.policy_references(namespace, name, spec)


@kopf.on.create(*RESOURCE, id=c.HANDLER_RECONCILE)
def prefixserving_create(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.on_change(memo.kube, body)


@kopf.on.update(*RESOURCE, id=c.HANDLER_RECONCILE, field="spec")
def prefixserving_update(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.on_change(memo.kube, body)


@kopf.on.resume(*RESOURCE, id=c.HANDLER_RECONCILE)
def prefixserving_resume(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.on_change(memo.kube, body)


@kopf.on.delete(*RESOURCE, id=c.HANDLER_DELETE)
def prefixserving_delete(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.delete_children(memo.kube, body)


@kopf.timer(*RESOURCE, id=c.HANDLER_STATUS, interval=SETTINGS.status_interval_s)
def prefixserving_status(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    status.refresh(memo.kube, body)


@kopf.timer(*RESOURCE, id=c.HANDLER_METRICS, interval=SETTINGS.metrics_interval_s)
def prefixserving_metrics(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    status.refresh_metrics(
        memo.kube, body, memo.settings.prometheus_url, memo.settings.prometheus_timeout_s
    )


@kopf.timer(
    *RESOURCE,
    id=c.HANDLER_RESYNC,
    interval=SETTINGS.resync_interval_s,
    idle=min(operator_settings.RESYNC_IDLE_S, SETTINGS.metrics_interval_s / 2),
    initial_delay=SETTINGS.resync_interval_s,
)
def prefixserving_resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.resync(memo.kube, body)


def child_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.repair(memo.kube, type or "LISTED", body)


for _group, _version, _plural in CHILD_RESOURCES:
    child_event = kopf.on.event(
        _group,
        _version,
        _plural,
        id=c.HANDLER_DRIFT,
        labels=OWNED,
        when=lambda body, **_: reconcile.is_child_of_ours(body),
    )(child_event)


@kopf.on.event(*POLICY, id=c.HANDLER_POLICY, when=lambda type, **_: type is not None)
def scalingpolicy_event(
    namespace: str, name: str, prefixserving_policy_refs: kopf.Index, memo: kopf.Memo, **_: Any
) -> None:
    reconcile.propagate_policy(
        memo.kube, namespace, prefixserving_policy_refs.get((namespace, name), [])
    )
