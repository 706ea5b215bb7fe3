"""Every kopf decorator of the operator; each handler is a one-line delegate.

``prefixserving operator`` sets the settings' environment from its flags before kopf imports
this module. The API client, the settings and the periodic scheduler reach the handlers through
``memo`` (kopf.Memo), never module state. Handler ids come from ``prefixserving.constants`` and
are never renamed: kopf stores progress under them.

No handler makes kopf put a finalizer on a PrefixServing: there is no deletion handler (owner
references let garbage collection delete the children) and no timer (kopf adds a finalizer
for timers, so the periodic status, metrics and resync jobs run from ``controller.periodic``
over the ``prefixserving_bodies`` index). ``kubectl delete`` therefore never waits for the
operator. The finalizer name stays configured (``settings.FINALIZER``) so that kopf removes
it from resources an older operator version finalized.
"""

from __future__ import annotations

from typing import Any

import kopf

from prefixserving import constants as c
from prefixserving.controller import periodic
from prefixserving.controller import settings as operator_settings
from prefixserving.controller.handlers import reconcile
from prefixserving.controller.kube import Kube, load_api_client
from prefixserving.kinds import CHILD_KINDS, PREFIX_SERVING, SCALING_POLICY

RESOURCE = (PREFIX_SERVING.group, PREFIX_SERVING.version, PREFIX_SERVING.plural)
POLICY = (SCALING_POLICY.group, SCALING_POLICY.version, SCALING_POLICY.plural)
OWNED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


@kopf.on.startup()
async def operator_startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, prefixserving_bodies: kopf.Index, **_: Any
) -> None:
    memo.settings = operator_settings.load()  # fresh: the environment may have changed
    operator_settings.configure_kopf(settings, memo.settings)
    memo.kube = Kube(load_api_client())
    memo.periodic = periodic.Scheduler.start(prefixserving_bodies, memo.kube, memo.settings)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.periodic.stop()


@kopf.on.login()
def operator_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index(*RESOURCE)
def prefixserving_bodies(uid: str, body: kopf.Body, **_: Any) -> dict:
    return {uid: dict(body)}


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


def child_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    reconcile.repair(memo.kube, type or "LISTED", body)


for _kind in CHILD_KINDS:
    child_event = kopf.on.event(
        _kind.group,
        _kind.version,
        _kind.plural,
        id=c.HANDLER_DRIFT,
        labels=OWNED,
        # A new child is the operator's own apply (reconcile.repair skips it): not even a call.
        when=lambda type, body, **_: type != "ADDED" and reconcile.is_child_of_ours(body),
    )(child_event)


@kopf.on.event(*POLICY, id=c.HANDLER_POLICY, when=lambda type, **_: type is not None)
def scalingpolicy_event(
    namespace: str, name: str, prefixserving_policy_refs: kopf.Index, memo: kopf.Memo, **_: Any
) -> None:
    reconcile.propagate_policy(
        memo.kube, namespace, prefixserving_policy_refs.get((namespace, name), [])
    )
