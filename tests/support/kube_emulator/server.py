"""HTTP front of the emulator, on kmock's Kubernetes scaffold.

kmock (``KubernetesScaffold``) parses requests into resource/namespace/name/subresource,
serves discovery (``/api``, ``/api/v1``, ``/apis``, ``/apis/<group>/<version>``) from the
declared resources and renders errors as ``Status`` objects. Everything that reads or writes
objects is answered here from :class:`~.store.Store`, which fixes what kmock's own emulator
lacks: resourceVersion on every object and list, watches that resume from a resourceVersion
(410 Gone when too old), 422 on a failed JSON-patch ``test``, server-side apply, strategic and
merge patches, PUT, label and field selectors, the status and scale subresources, finalizers and
garbage collection through owner references, and admission rules that refuse objects.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml

from . import resources
from .selectors import parse_label_selector
from .store import ApiError, ResourceType, Store, Watcher

WATCH_POLL_S = 1.0
_NAMESPACES_PATH = re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$")


def _status_body(exc: ApiError) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": exc.message,
        "reason": exc.reason,
        "code": exc.status,
    }


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesScaffold):
    """A Kubernetes API server emulator; serve it with ``kmock.Server(emulator)``."""

    extra_types: list[ResourceType] = attrs.field(factory=list)
    store: Store = attrs.field(init=False)
    # Requests matching a predicate wait until its event is set (to hold an operator mid-step).
    gates: list[tuple[Callable[[kmock.Request], bool], asyncio.Event]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = Store([])
        for rtype in [*resources.CORE, *self.extra_types]:
            self.install(rtype)

    def install(self, rtype: ResourceType) -> None:
        """Serve ``rtype`` from now on (as installing a CRD or an aggregated API does)."""
        self.store.types[rtype.key] = rtype
        subresources = {"status"} if rtype.status_subresource else set()
        if rtype.scale_subresource:
            subresources.add("scale")
        self.resources[kmock.resource(rtype.group, rtype.version, rtype.plural)] = (
            kmock.ResourceInfo(
                kind=rtype.kind,
                namespaced=rtype.namespaced,
                singular=rtype.kind.lower(),
                shortnames=set(rtype.shortnames),
                verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
                subresources=subresources,
            )
        )

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock reads ``/api/v1/namespaces[/NAME]`` as a namespace prefix and fails; serve the
        cluster-scoped Namespace resource (kopf lists it when told which namespaces to watch)."""
        match = _NAMESPACES_PATH.match(raw.path)
        if match is None:
            return await super().__call__(raw)
        body = await raw.read()
        text = body.decode() if body else ""
        request = kmock.Request(
            method=raw.method,
            url=raw.url,
            params=dict(raw.query),
            headers=dict(raw.headers),
            body=body,
            text=text,
            data=json.loads(text) if text.strip().startswith(("{", "[")) else None,
            resource=kmock.resource("", "v1", "namespaces"),
            name=match.group(1),
            raw_request=raw,
        )
        return await self._handle(request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or resource.plural is None:
            return await self._discover(request)
        rtype = self.store.types.get(
            (resource.group or "", resource.version or "", resource.plural)
        )
        for matches, gate in list(self.gates):
            if matches(request) and not gate.is_set():
                await gate.wait()
        try:
            if rtype is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if request.method.value == "GET" and request.params.get("watch") in ("true", "1"):
                return await self._watch(request, rtype)
            return aiohttp.web.json_response(self._serve(request, rtype))
        except ApiError as exc:
            return aiohttp.web.json_response(_status_body(exc), status=exc.status)

    async def _discover(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """Discovery, with or without the trailing slash the official client sends."""
        path = request.url.path.rstrip("/") or "/"
        depth = path.count("/")
        serve = None
        if path == "/api":
            serve = self._serve_api
        elif path == "/apis":
            serve = self._serve_apis
        elif path == "/version":
            serve = self._serve_server_version
        elif depth == (2 if path.startswith("/api/") else 3 if path.startswith("/apis/") else 0):
            serve = self._serve_version
        elif path.startswith("/apis/") and depth == 2:
            serve = self._serve_group
        if serve is None or request.method.value != "GET":
            return await super()._handle(request)
        try:
            return aiohttp.web.json_response(await serve(request))
        except kmock.KubernetesError as exc:
            body = _status_body(ApiError(exc.status, exc.reason or "NotFound", exc.message or ""))
            return aiohttp.web.json_response(body, status=exc.status)

    def _serve(self, request: kmock.Request, rtype: ResourceType) -> dict[str, Any]:
        method = request.method.value
        params = request.params
        namespace = request.namespace
        name = request.name
        manager = params.get("fieldManager") or _manager_from_agent(request.headers)
        store = self.store
        if name is None:
            if method == "GET":
                return store.list(
                    rtype, namespace, params.get("labelSelector"), params.get("fieldSelector")
                )
            if method == "POST":
                return store.create(rtype, namespace, _body(request), manager)
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection is not supported")
        subresource = request.subresource
        if subresource == "scale" and rtype.scale_subresource:
            return self._scale(request, rtype, manager)
        if method == "GET":
            return store.get(rtype, namespace, name)
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "")
            if content_type.startswith("application/apply-patch"):
                force = params.get("force") in ("true", "1")
                return store.apply(rtype, namespace, name, _body(request), manager, force)
            return store.patch(
                rtype, namespace, name, content_type, _body(request), manager, subresource
            )
        if method == "PUT":
            return store.replace(rtype, namespace, name, _body(request), manager, subresource)
        if method == "DELETE":
            return store.delete(rtype, namespace, name)
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported")

    def _scale(self, request: kmock.Request, rtype: ResourceType, manager: str) -> dict[str, Any]:
        """The ``/scale`` subresource of Deployments (what HPA and KEDA write)."""
        namespace, name = request.namespace, request.name
        assert name is not None
        if request.method.value in ("PATCH", "PUT"):
            replicas = (_body(request).get("spec") or {}).get("replicas")
            patch = {"spec": {"replicas": replicas}}
            self.store.patch(
                rtype, namespace, name, "application/merge-patch+json", patch, manager, None
            )
        obj = self.store.get(rtype, namespace, name)
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: v
                for k, v in obj["metadata"].items()
                if k in ("name", "namespace", "uid", "resourceVersion")
            },
            "spec": {"replicas": obj.get("spec", {}).get("replicas", 0)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0)},
        }

    async def _watch(
        self, request: kmock.Request, rtype: ResourceType
    ) -> aiohttp.web.StreamResponse:
        raw = request._raw_request
        assert raw is not None
        params = request.params
        timeout_s = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout_s if timeout_s else None
        since = params.get("resourceVersion") or "0"
        label_match = parse_label_selector(params.get("labelSelector"))

        # Register the watcher and take the backlog in one loop tick: nothing is lost or doubled.
        watcher = Watcher(namespace=request.namespace, matches=label_match)
        if since == "0":
            listing = self.store.list(rtype, request.namespace, params.get("labelSelector"))
            backlog: list[dict[str, Any]] | None = [
                {"type": "ADDED", "object": o} for o in listing["items"]
            ]
        else:
            backlog = self.store.events_since(rtype, int(since))
            backlog = (
                None
                if backlog is None
                else [
                    event
                    for event in backlog
                    if request.namespace in (None, event["object"]["metadata"].get("namespace"))
                    and label_match(event["object"]["metadata"].get("labels") or {})
                ]
            )
        self.store.watchers[rtype.key].add(watcher)
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await response.prepare(raw)
            if backlog is None:
                gone = ApiError(410, "Expired", f"too old resource version: {since}")
                await _write(response, {"type": "ERROR", "object": _status_body(gone)})
                return response
            for event in backlog:
                await _write(response, event)
            while deadline is None or time.monotonic() < deadline:
                wait_s = (
                    WATCH_POLL_S
                    if deadline is None
                    else min(WATCH_POLL_S, deadline - time.monotonic())
                )
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=max(wait_s, 0.01))
                except TimeoutError:
                    if raw.transport is None or raw.transport.is_closing():
                        break
                    continue
                await _write(response, event)
        except ConnectionError:
            pass  # the client went away
        finally:
            self.store.watchers[rtype.key].discard(watcher)
        return response


async def _write(response: aiohttp.web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(json.dumps(event).encode() + b"\n")


def _body(request: kmock.Request) -> Any:
    if isinstance(request.data, (dict, list)):
        return request.data
    text = request.text or "{}"
    try:
        return json.loads(text)
    except ValueError:
        return yaml.safe_load(text) or {}


def _manager_from_agent(headers: dict[str, str]) -> str:
    """The API server derives the default field manager from the User-Agent's program name."""
    agent = headers.get("User-Agent", "unknown")
    return agent.split("/", 1)[0] or "unknown"
