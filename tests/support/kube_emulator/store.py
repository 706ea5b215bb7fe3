"""The emulator's object store: Kubernetes object semantics without HTTP.

Per object it keeps the body and the field ownership (see ``patching``). Every change bumps
one global ``resourceVersion`` and is appended to a bounded per-resource history, so a watch
can resume from any recent version (older ones answer 410 Gone, as etcd compaction does).
A write that changes nothing keeps the version and emits no event, like the real server.
``metadata.generation`` moves on changes outside ``metadata`` and ``status``; resources with a
status subresource ignore ``status`` on the main endpoint and everything else on ``/status``.
Deletion honours finalizers (``deletionTimestamp`` first, removal when the last finalizer
goes) and then garbage-collects dependents whose ``ownerReferences`` name the deleted uid.
An object written with owner references that all name missing uids is collected right after
the write, as the real garbage collector collects a dependent whose owners are gone: a
controller's apply that lands just after its owner's deletion leaves nothing behind.

All methods are synchronous and must run on the emulator's event loop thread; watchers get
events through ``asyncio.Queue.put_nowait``. Costs: get O(1); list and GC O(objects).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import patching
from .selectors import equalities, parse_field_selector, parse_label_selector

HISTORY_LIMIT = 20_000

# (operation, resource type, candidate object) -> None to admit, or (HTTP status, message).
Admission = Callable[[str, "ResourceType", Mapping[str, Any]], tuple[int, str] | None]


@dataclass(frozen=True)
class ResourceType:
    """One served resource (group/version/plural) and how the server treats it."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status_subresource: bool = True
    scale_subresource: bool = False
    shortnames: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.group, self.version, self.plural)


class ApiError(Exception):
    """An API error rendered as a ``Status`` object."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


@dataclass
class Record:
    obj: dict[str, Any]
    owners: patching.Owners = field(default_factory=dict)
    # The labels the store's label index holds this record under.
    indexed_labels: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class Watcher:
    namespace: str | None
    matches: Callable[[Mapping[str, str]], bool]
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in obj.items() if key not in keys}


class Store:
    """Objects of all served resources, their history and their watchers."""

    def __init__(self, types: list[ResourceType]) -> None:
        self.types: dict[tuple[str, str, str], ResourceType] = {t.key: t for t in types}
        self.records: dict[tuple[tuple[str, str, str], str | None, str], Record] = {}
        # The same records per resource type, so a list never scans other kinds, and per label
        # (type, key, value), so a list by label selector only looks at the objects it names.
        self.by_type: dict[tuple[str, str, str], dict[tuple[str | None, str], Record]] = (
            collections.defaultdict(dict)
        )
        self.by_label: dict[tuple[tuple[str, str, str], str, str], set[tuple[str | None, str]]] = (
            collections.defaultdict(set)
        )
        self.resource_version = 0
        self.history: dict[tuple[str, str, str], collections.deque[tuple[int, dict[str, Any]]]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=HISTORY_LIMIT))
        )
        self.first_kept: dict[tuple[str, str, str], int] = collections.defaultdict(int)
        self.watchers: dict[tuple[str, str, str], set[Watcher]] = collections.defaultdict(set)
        self.admission: list[Admission] = []
        # The uids of every live object, for garbage collection.
        self.uids: set[str] = set()

    # ----------------------------------------------------------------- reading
    def render(self, rtype: ResourceType, record: Record) -> dict[str, Any]:
        obj = patching.copy_json(record.obj)
        if record.owners:
            obj["metadata"]["managedFields"] = patching.managed_fields(
                record.owners, rtype.api_version, obj["metadata"]["creationTimestamp"]
            )
        return obj

    def get(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        return self.render(rtype, self._record(rtype, namespace, name))

    def list(
        self,
        rtype: ResourceType,
        namespace: str | None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> dict[str, Any]:
        labels_match = parse_label_selector(label_selector)
        fields_match = parse_field_selector(field_selector)
        records = self.by_type[rtype.key]
        indexed = [
            self.by_label.get((rtype.key, k, v), set()) for k, v in equalities(label_selector)
        ]
        keys = min(indexed, key=len) if indexed else records.keys()
        # Filter, then sort what matched (a selector usually matches a few of many objects).
        matched = [
            (key, records[key])
            for key in keys
            if (namespace is None or key[0] == namespace)
            and labels_match(records[key].obj["metadata"].get("labels") or {})
            and fields_match(records[key].obj)
        ]
        items = [self.render(rtype, record) for _, record in sorted(matched, key=lambda m: m[0])]
        return {
            "apiVersion": rtype.api_version,
            "kind": f"{rtype.kind}List",
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }

    def events_since(
        self, rtype: ResourceType, resource_version: int
    ) -> list[dict[str, Any]] | None:
        """Events after ``resource_version``, or None when the history no longer reaches it."""
        if resource_version < self.first_kept[rtype.key]:
            return None
        return [event for rv, event in self.history[rtype.key] if rv > resource_version]

    # ----------------------------------------------------------------- writing
    def create(
        self,
        rtype: ResourceType,
        namespace: str | None,
        body: Mapping[str, Any],
        manager: str,
        applied: bool = False,
    ) -> dict[str, Any]:
        """Create an object; ``applied`` records ``manager`` as owning the body's fields through
        server-side apply (a create by apply) instead of an update."""
        obj = patching.copy_json(dict(body))
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name")
        if not name:
            raise ApiError(
                422, "Invalid", "metadata.name: Required value: name or generateName is required"
            )
        namespace = namespace or meta.get("namespace") if rtype.namespaced else None
        if rtype.namespaced and not namespace:
            raise ApiError(422, "Invalid", "metadata.namespace: Required value")
        if (rtype.key, namespace, name) in self.records:
            raise ApiError(
                409, "AlreadyExists", f'{rtype.plural}.{rtype.group} "{name}" already exists'
            )
        obj["apiVersion"] = rtype.api_version
        obj["kind"] = rtype.kind
        if rtype.status_subresource:
            obj.pop("status", None)
        if namespace:
            meta["namespace"] = namespace
        self._apply_defaults(rtype, obj)
        self._admit("CREATE", rtype, obj)
        meta.pop("managedFields", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("resourceVersion", None)
        record = Record(obj=obj)
        if applied:
            record.owners[(manager, "Apply")] = set(patching.leaves(dict(body)))
        else:
            patching.record_update(record.owners, {}, obj, manager)
        self.records[(rtype.key, namespace, name)] = record
        self.by_type[rtype.key][(namespace, name)] = record
        self.uids.add(meta["uid"])
        self._commit(rtype, record, "ADDED")
        created = self.render(rtype, record)
        self._collect_if_orphaned(rtype, record)
        return created

    def apply(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        config: Mapping[str, Any],
        manager: str,
        force: bool,
    ) -> dict[str, Any]:
        """Server-side apply; creates the object when it does not exist."""
        if not manager:
            raise ApiError(
                422, "Invalid", "fieldManager: Required value: is required for apply patch"
            )
        config_meta = config.get("metadata") or {}
        if config_meta.get("name") not in (None, name):
            raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
        key = (rtype.key, namespace if rtype.namespaced else None, name)
        if key not in self.records:
            return self.create(
                rtype, namespace, _without(config, "status"), manager=manager, applied=True
            )
        record = self.records[key]
        if rtype.status_subresource:
            config = _without(config, "status")
        try:
            candidate = patching.server_side_apply(
                record.owners, record.obj, config, manager, force
            )
        except patching.PatchConflict as exc:
            raise ApiError(409, "Conflict", str(exc)) from exc
        return self._update(rtype, record, candidate, subresource=None, manager=None)

    def patch(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        body: Any,
        manager: str,
        subresource: str | None,
    ) -> dict[str, Any]:
        record = self._record(rtype, namespace, name)
        current = self.render(rtype, record)
        current["metadata"].pop("managedFields", None)
        if content_type.startswith("application/json-patch+json"):
            try:
                candidate = patching.json_patch(current, body)
            except patching.PatchTestFailed as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request: {exc}") from exc
        elif content_type.startswith("application/merge-patch+json"):
            self._check_precondition(record, body)
            candidate = patching.merge_patch(current, body)
        elif content_type.startswith("application/strategic-merge-patch+json"):
            self._check_precondition(record, body)
            candidate = patching.strategic_merge_patch(current, body)
        else:
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of type {content_type} is not supported"
            )
        return self._update(rtype, record, candidate, subresource=subresource, manager=manager)

    def replace(
        self,
        rtype: ResourceType,
        namespace: str | None,
        name: str,
        body: Mapping[str, Any],
        manager: str,
        subresource: str | None,
    ) -> dict[str, Any]:
        record = self._record(rtype, namespace, name)
        self._check_precondition(record, body)
        candidate = patching.copy_json(dict(body))
        candidate.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "generation", "deletionTimestamp", "namespace"):
            if key in record.obj["metadata"]:
                candidate["metadata"][key] = record.obj["metadata"][key]
        return self._update(rtype, record, candidate, subresource=subresource, manager=manager)

    def delete(self, rtype: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        record = self._record(rtype, namespace, name)
        meta = record.obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = _now()
                self._commit(rtype, record, "MODIFIED")
            return self.render(rtype, record)
        return self._remove(rtype, record)

    # ----------------------------------------------------------------- helpers
    def _record(self, rtype: ResourceType, namespace: str | None, name: str) -> Record:
        record = self.records.get((rtype.key, namespace if rtype.namespaced else None, name))
        if record is None:
            group = f".{rtype.group}" if rtype.group else ""
            raise ApiError(404, "NotFound", f'{rtype.plural}{group} "{name}" not found')
        return record

    @staticmethod
    def _check_precondition(record: Record, body: Any) -> None:
        wanted = (
            ((body or {}).get("metadata") or {}).get("resourceVersion")
            if isinstance(body, Mapping)
            else None
        )
        actual = record.obj["metadata"].get("resourceVersion")
        if wanted and wanted != actual:
            raise ApiError(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; "
                "please apply your changes to the latest version and try again",
            )

    @staticmethod
    def _apply_defaults(rtype: ResourceType, obj: dict[str, Any]) -> None:
        """The few defaults the operator's tests can observe."""
        if rtype.kind == "Deployment":
            obj.setdefault("spec", {}).setdefault("replicas", 1)

    def _admit(self, operation: str, rtype: ResourceType, obj: Mapping[str, Any]) -> None:
        for rule in self.admission:
            verdict = rule(operation, rtype, obj)
            if verdict is not None:
                status, message = verdict
                reason = {403: "Forbidden", 400: "BadRequest"}.get(status, "Invalid")
                raise ApiError(status, reason, message)

    def _update(
        self,
        rtype: ResourceType,
        record: Record,
        candidate: dict[str, Any],
        subresource: str | None,
        manager: str | None,
    ) -> dict[str, Any]:
        old = record.obj
        new = patching.copy_json(candidate)
        new["apiVersion"], new["kind"] = rtype.api_version, rtype.kind
        meta = new.setdefault("metadata", {})
        meta.pop("managedFields", None)
        for key in (
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "name",
            "namespace",
        ):
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
        if old["metadata"].get("deletionTimestamp"):
            meta["deletionTimestamp"] = old["metadata"]["deletionTimestamp"]
        if subresource == "status":
            new = (
                {**old, "status": new.get("status")}
                if new.get("status") is not None
                else _without(old, "status")
            )
        elif subresource in (None, ""):
            if rtype.status_subresource:
                new = _without(new, "status")
                if "status" in old:
                    new["status"] = old["status"]
        else:
            raise ApiError(404, "NotFound", f"subresource {subresource} is not served")
        if new == old:
            return self.render(rtype, record)
        if subresource != "status":
            self._admit("UPDATE", rtype, new)
        if _without(new, "metadata", "status") != _without(old, "metadata", "status"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if manager is not None:
            patching.record_update(record.owners, old, new, manager)
        record.obj = new
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(rtype, record)
        self._commit(rtype, record, "MODIFIED")
        updated = self.render(rtype, record)
        self._collect_if_orphaned(rtype, record)
        return updated

    def _remove(self, rtype: ResourceType, record: Record) -> dict[str, Any]:
        meta = record.obj["metadata"]
        del self.records[(rtype.key, meta.get("namespace"), meta["name"])]
        del self.by_type[rtype.key][(meta.get("namespace"), meta["name"])]
        self.uids.remove(meta["uid"])
        self._commit(rtype, record, "DELETED")
        self._collect_dependents(meta["uid"])
        return self.render(rtype, record)

    def _collect_if_orphaned(self, rtype: ResourceType, record: Record) -> None:
        """Garbage collection of a write: delete the object when it names owners and none of
        them exists (the real collector does this in the background, soon after)."""
        owners = record.obj["metadata"].get("ownerReferences") or []
        if owners and not any(owner.get("uid") in self.uids for owner in owners):
            meta = record.obj["metadata"]
            self.delete(rtype, meta.get("namespace"), meta["name"])

    def _collect_dependents(self, uid: str) -> None:
        """Garbage collection: delete every object that names ``uid`` as an owner."""
        for (key, namespace, name), record in list(self.records.items()):
            owners = record.obj["metadata"].get("ownerReferences") or []
            if (
                any(owner.get("uid") == uid for owner in owners)
                and (key, namespace, name) in self.records
            ):
                self.delete(self.types[key], namespace, name)

    def _index_labels(self, rtype: ResourceType, record: Record, deleted: bool = False) -> None:
        """Keep ``by_label`` in step with the record's labels (none once it is deleted)."""
        meta = record.obj["metadata"]
        key = (meta.get("namespace"), meta["name"])
        labels = {} if deleted else dict(meta.get("labels") or {})
        for item in record.indexed_labels.items() - labels.items():
            self.by_label[(rtype.key, *item)].discard(key)
        for item in labels.items() - record.indexed_labels.items():
            self.by_label[(rtype.key, *item)].add(key)
        record.indexed_labels = labels

    def _commit(self, rtype: ResourceType, record: Record, event_type: str) -> None:
        self._index_labels(rtype, record, deleted=event_type == "DELETED")
        self.resource_version += 1
        record.obj["metadata"]["resourceVersion"] = str(self.resource_version)
        event = {"type": event_type, "object": self.render(rtype, record)}
        history = self.history[rtype.key]
        if len(history) == history.maxlen:
            self.first_kept[rtype.key] = history[0][0]
        history.append((self.resource_version, event))
        namespace = record.obj["metadata"].get("namespace")
        labels = record.obj["metadata"].get("labels") or {}
        for watcher in self.watchers[rtype.key]:
            if watcher.namespace in (None, namespace) and watcher.matches(labels):
                watcher.queue.put_nowait(event)
