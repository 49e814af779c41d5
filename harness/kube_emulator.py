"""An in-process Kubernetes API for tests: kmock's KubernetesEmulator on a real TCP port, plus fixes.

What kmock 0.8 gives: discovery, stateful objects, list/watch, merge & JSON patches, finalizers.
What this module adds on top (in :class:`AtlasKubeEmulator`, a subclass):

* ``metadata.uid``, ``resourceVersion`` (bumped on every write), ``generation`` (bumped when
  ``spec`` changes), ``creationTimestamp``, ``namespace`` (from the URL), ``generateName``;
* HTTP 404 on any request to an undeclared resource (plain kmock silently stores a POST to it);
* a ``status`` subresource that behaves like a real one: ``PATCH .../status`` changes only
  ``status``; a patch of the main endpoint leaves ``status`` alone (only where declared);
* ``PUT`` (replace), with a 409 on a stale ``metadata.resourceVersion``;
* 422 (not 500) for a failing JSON-patch ``test`` op, as kopf expects;
* a fix for kmock's crash on ``/api/v1/namespaces[/name]`` (patched into kmock's path parser);
* fault injection (:meth:`AtlasKubeEmulator.fail_next`) that fails BEFORE any state change;
* ``labelSelector`` on lists and watches (equality- and set-based, as ``kubectl get -l`` sends them; 400 when
  malformed);
* a request log as plain records (:meth:`AtlasKubeEmulator.calls`, ``writes``, ``verbs``), and what is stored
  (``get``, ``list``, ``stored``);
* watches that miss events: :meth:`AtlasKubeEmulator.delete_unseen` (no event), ``expire_watches`` (410 Gone).

* garbage collection by ownerReferences, one pass when a test asks (:meth:`AtlasKubeEmulator.collect_garbage`).

Not emulated: garbage collection in the background, field selectors, the DELETED event a labelSelector watch gets
when an object's labels stop matching, watch timeouts, a 410 for a watch from a resourceVersion too old (a watch
without one replays all objects as ADDED, one from a list's resourceVersion only what is newer), admission and
validation.

Usage (synchronous test; the emulator runs in its own thread with its own event loop, so the
synchronous ``kubernetes`` client, kopf's ``KopfRunner`` thread and subprocesses can all reach it)::

    from harness.kube_emulator import kube_emulator, kubeconfig  # noqa: F401  (fixtures)

    def test_x(kube_emulator, kubeconfig):          # kubeconfig also sets $KUBECONFIG
        kubernetes.config.load_kube_config(config_file=str(kubeconfig))
        kube_emulator.emulator.fail_next('POST', 'apps/v1/deployments', status=500)
        ...
        assert kube_emulator.emulator.get(TRAININGS, 'ns', 'run1')['metadata']['uid']

In an async test, ``async with running_emulator() as emu:`` serves from the test's own loop:
then call synchronous clients through ``asyncio.to_thread`` or the loop deadlocks.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import dataclasses
import datetime
import itertools
import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import threading
import types
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, cast

import aiohttp.web
import attrs
import jsonpatch
import kmock
import pytest
from kmock._internal import dicts as _kdicts
from kmock._internal import parsing as _kparsing

from harness import label_selectors

# ------------------------------------------------------------------------------------------------
# Resources.

CORE_RESOURCES: dict[str, dict[str, Any]] = {
    "v1/namespaces": dict(kind="Namespace", namespaced=False, subresources=["status"]),
    "v1/configmaps": dict(kind="ConfigMap", namespaced=True),
    "v1/pods": dict(kind="Pod", namespaced=True, subresources=["status"]),  # status: as the kubelet writes it
    "v1/services": dict(kind="Service", namespaced=True, subresources=["status"]),
    "v1/events": dict(kind="Event", namespaced=True),
    "v1/secrets": dict(kind="Secret", namespaced=True),
    "v1/persistentvolumeclaims": dict(kind="PersistentVolumeClaim", namespaced=True, subresources=["status"]),
    "apps/v1/deployments": dict(kind="Deployment", namespaced=True, subresources=["status", "scale"]),
    "networking.k8s.io/v1/networkpolicies": dict(kind="NetworkPolicy", namespaced=True),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(
        kind="CustomResourceDefinition", namespaced=False, subresources=["status"]
    ),
}
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
NETWORK_POLICIES = "networking.k8s.io/v1/networkpolicies"
PODS = "v1/pods"
TRAININGS = "atlas.arc.computer/v1alpha1/atlastrainings"
TEACHERS = "atlas.arc.computer/v1alpha1/atlasteachers"
KUBEFLOW_RESOURCES: dict[str, dict[str, Any]] = {
    PYTORCHJOBS: dict(kind="PyTorchJob", namespaced=True, subresources=["status"]),
}
JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
JOBS = "batch/v1/jobs"  # a JobSet's child Jobs: served with the JobSet API (the operator never reads them)
JOBSET_RESOURCES: dict[str, dict[str, Any]] = {
    JOBSETS: dict(kind="JobSet", namespaced=True, subresources=["status"]),
    JOBS: dict(kind="Job", namespaced=True, subresources=["status"]),
}
TRAINJOBS = "trainer.kubeflow.org/v1alpha1/trainjobs"
CLUSTER_TRAINING_RUNTIMES = "trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
# Kubeflow Trainer v2 (it needs JobSet: a cluster with it serves both).
TRAINER_RESOURCES: dict[str, dict[str, Any]] = {
    TRAINJOBS: dict(kind="TrainJob", namespaced=True, subresources=["status"]),
    CLUSTER_TRAINING_RUNTIMES: dict(kind="ClusterTrainingRuntime", namespaced=False),
}
ATLAS_RESOURCES: dict[str, dict[str, Any]] = {
    TRAININGS: dict(kind="AtlasTraining", namespaced=True, subresources=["status"]),
    TEACHERS: dict(kind="AtlasTeacher", namespaced=True, subresources=["status"]),
}
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]


def default_resources(
    *, pytorchjobs: bool = True, jobsets: bool = True, trainer: bool = True
) -> dict[str, dict[str, Any]]:
    """``jobsets=False``: a cluster without the JobSet CRD (batch/v1 Jobs stay, as in any cluster);
    ``trainer=False``: without the Kubeflow Trainer's (served only with JobSet's)."""
    res = dict(CORE_RESOURCES)
    res[JOBS] = JOBSET_RESOURCES[JOBS]
    if trainer and jobsets:
        res.update(TRAINER_RESOURCES)
    if pytorchjobs:
        res.update(KUBEFLOW_RESOURCES)
    if jobsets:
        res[JOBSETS] = JOBSET_RESOURCES[JOBSETS]
    res.update(ATLAS_RESOURCES)
    return res


# ------------------------------------------------------------------------------------------------
# kmock 0.8 crashes (ValueError in its path parser) on /api/v1/namespaces; the namespace object
# paths /api/v1/namespaces/NAME are misparsed as "namespace NAME, no resource". Fix the parser.

_original_parse_path = _kparsing.parse_path


def _parse_path_fixed(path: str) -> _kparsing.ParsedPath:
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"]:
        if len(parts) == 3:
            return _kparsing.ParsedPath("", "v1", "namespaces")
        if len(parts) == 4:
            return _kparsing.ParsedPath("", "v1", "namespaces", None, parts[3])
        if len(parts) == 5 and parts[4] in ("status", "finalize"):
            return _kparsing.ParsedPath("", "v1", "namespaces", None, parts[3], parts[4])
    return _original_parse_path(path)


def install_kmock_fixes() -> None:
    """Idempotent. rendering.Request._parse looks up ``parsing.parse_path`` at call time."""
    _kparsing.parse_path = _parse_path_fixed


# ------------------------------------------------------------------------------------------------
# Request log records & fault specs.


@dataclasses.dataclass(frozen=True)
class Call:
    """One request as a client sent it (the body is the original bytes, decoded)."""

    method: str  # GET/POST/PATCH/PUT/DELETE
    path: str
    query: dict[str, str]
    body: Any  # JSON-decoded request body (None if empty/not JSON)
    verb: str | None  # k8s verb: get/list/watch/create/patch/update/delete; None for discovery
    group: str | None  # '' for core v1; None for non-resource paths
    version: str | None
    resource: str | None  # plural
    namespace: str | None
    name: str | None
    subresource: str | None
    content_type: str | None
    accept: str | None  # the Accept header: what representation the client asked for
    user_agent: str | None  # who called: "kopf/…", "atlas-operator/…", the test's client
    status: int | None  # the HTTP status answered; None while still streaming (watches)

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PUT", "PATCH", "DELETE")


@dataclasses.dataclass
class Fault:
    method: str
    resource: kmock.resource
    status: int
    times: int
    namespace: str | None = None
    name: str | None = None
    subresource: str | None | types.EllipsisType = ...
    reason: str | None = None
    message: str | None = None
    hits: int = 0

    def matches(self, request: kmock.Request) -> bool:
        return bool(
            request.method.value.upper() == self.method
            and request.resource is not None
            and self.resource.check(request.resource)
            and (self.namespace is None or self.namespace == request.namespace)
            and (self.name is None or self.name == request.name)
            and (self.subresource is ... or self.subresource == request.subresource)
        )


_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    409: "AlreadyExists",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def label_selector(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on labels for a query-string label selector (label_selectors.parse; ValueError: a 400)."""
    parsed = label_selectors.parse(selector)
    return lambda labels: label_selectors.matches(parsed, labels)


# ------------------------------------------------------------------------------------------------
# The emulator.


@attrs.define(kw_only=True)
class AtlasKubeEmulator(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator + metadata, 404s, status subresource, PUT, faults, call log."""

    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _faults_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _rv_counter: Iterator[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _assigned_rv: int = attrs.field(default=0, init=False)  # the last resourceVersion given to a write
    _committed_rv: int = attrs.field(default=0, init=False)  # ... of the last write stored (a list's version)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _statuses: dict[int, int] = attrs.field(factory=dict, init=False)
    # Requests already served. kmock's reactions match each new request by scanning its whole
    # history (O(n) per request, O(n^2) per test); history moves here so that scan stays short.
    _served: list[kmock.Request] = attrs.field(factory=list, init=False)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        """An expected error (404, 409, 422...) as the API server's Status, without kmock's formatted traceback in
        its details: a real server sends none, and formatting one was a seventh of the emulator's CPU under load
        (a new run's children are each looked up, and not found, before it makes them). Unexpected errors (500)
        keep kmock's rendering, traceback included, for debugging the emulator."""
        if not isinstance(exc, kmock.KubernetesError):
            return await super()._render_error(exc)
        status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "code": exc.status}
        status |= {"reason": exc.reason or type(exc).__name__, "message": exc.message or repr(exc)}
        return aiohttp.web.json_response({**status, "details": exc.details or {}}, status=exc.status)

    # -- declaring -----------------------------------------------------------------------------

    def declare(self, resources: Mapping[str, Mapping[str, Any]]) -> None:
        for key, info in resources.items():
            kind = info["kind"]
            self.resources[key] = kmock.ResourceInfo(
                kind=kind,
                singular=kind.lower(),
                namespaced=info.get("namespaced", True),
                verbs=set(info.get("verbs", VERBS)),
                subresources=set(info.get("subresources", ())),
            )

    def _info(self, resource: kmock.resource) -> kmock.ResourceInfo | None:
        for declared in self.resources:
            if declared == resource:
                return self.resources[declared]
        return None

    # -- fault injection -----------------------------------------------------------------------

    def fail_next(
        self,
        method: str,
        resource: str,
        *,
        status: int = 500,
        times: int = 1,
        namespace: str | None = None,
        name: str | None = None,
        subresource: Any = ...,
        reason: str | None = None,
        message: str | None = None,
    ) -> Fault:
        """Fail the next ``times`` matching requests with ``status`` (no state change), then serve
        normally. ``resource`` as in kmock: 'apps/v1/deployments', 'v1/configmaps'. Thread-safe."""
        fault = Fault(
            method=method.upper(),
            resource=kmock.resource(resource),
            status=status,
            times=times,
            namespace=namespace,
            name=name,
            subresource=subresource,
            reason=reason,
            message=message,
        )
        with self._faults_lock:
            self._faults.append(fault)
        return fault

    def _take_fault(self, request: kmock.Request) -> Fault | None:
        with self._faults_lock:
            for fault in self._faults:
                if fault.hits < fault.times and fault.matches(request):
                    fault.hits += 1
                    return fault
        return None

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        self._served.extend(self._requests)
        self._requests.clear()
        response = await super().__call__(raw_request)
        for req in reversed(self._requests + self._served[-64:]):  # the answer's status, for the log
            if req._raw_request is raw_request:
                self._statuses[id(req)] = response.status
                break
        return response

    # -- request log -----------------------------------------------------------------------------

    def request_count(self) -> int:
        """How many requests have been received so far (a mark for :meth:`calls`' ``start``)."""
        return len(self._served) + len(self._requests)

    def calls(self, predicate: Callable[[Call], bool] | None = None, start: int = 0) -> list[Call]:
        """Every request received so far (incl. failed & faulted ones), in arrival order; from the ``start``-th."""
        result = []
        for req in (self._served + list(self._requests))[start:]:
            try:
                body = json.loads(req.body) if req.body else None
            except ValueError:
                body = req.text or None
            res = req.resource
            verb = None
            if res is not None and res.plural is not None:
                if req.method.value.upper() == "PUT":
                    verb = "update"
                elif req.action is not None:
                    act = req.action.value.lower()
                    verb = {"fetch": "get", "update": "patch"}.get(act, act)
            call = Call(
                method=req.method.value.upper(),
                path=req.url.path,
                query=dict(req.params),
                body=body,
                verb=verb,
                group=res.group if res else None,
                version=res.version if res else None,
                resource=res.plural if res else None,
                namespace=req.namespace,
                name=req.name,
                subresource=req.subresource,
                content_type=next((v for k, v in req.headers.items() if k.lower() == "content-type"), None),
                accept=next((v for k, v in req.headers.items() if k.lower() == "accept"), None),
                user_agent=next((v for k, v in req.headers.items() if k.lower() == "user-agent"), None),
                status=self._statuses.get(id(req)),
            )
            if predicate is None or predicate(call):
                result.append(call)
        return result

    def writes(self, resource: str | None = None, name: str | None = None) -> list[Call]:
        sel = kmock.resource(resource) if resource else None
        return self.calls(
            lambda c: (
                c.is_write
                and (sel is None or sel.check(kmock.resource(c.group, c.version, c.resource)))
                and (
                    name is None
                    or c.name == name
                    or (
                        c.verb == "create"
                        and isinstance(c.body, dict)
                        and c.body.get("metadata", {}).get("name") == name
                    )
                )
            )
        )

    def verbs(self) -> set[tuple[str, str, str]]:
        """{(verb, group, plural[/subresource])} used so far — e.g. for an RBAC cross-check."""
        return {
            (c.verb, c.group, c.resource + (f"/{c.subresource}" if c.subresource else ""))
            for c in self.calls()
            # calls() sets a verb only on a request to a resource, which has a group and a plural
            if c.verb is not None and c.group is not None and c.resource is not None
        }

    def clear_calls(self) -> None:
        self._requests.clear()
        self._served.clear()
        self._statuses.clear()

    # -- object access -----------------------------------------------------------------------

    # The stored object, where kmock's RawHandler.get is an HTTP GET: the tests read objects by this name.
    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:  # type: ignore[override]
        """A deep copy of the stored object, or None if absent/deleted."""
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def stored(self) -> list[tuple[str, str | None, str]]:
        """(resource, namespace, name) of every object held (not deleted), the resource as ``group/version/plural``
        (``v1/plural`` for the core group): what ``kubectl get -A`` over every resource would show."""
        return [
            (f"{res.group}/{res.version}/{res.plural}".lstrip("/"), namespace, name)
            for (res, namespace, name), obj in list(self.objects.items())
            if not obj.deleted
        ]

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        sel = kmock.resource(resource)
        return [
            copy.deepcopy(obj.raw)
            for (res, ns, _), obj in list(self.objects.items())
            if res == sel and not obj.deleted and (namespace is None or ns == namespace)
        ]

    # -- watches that miss events -----------------------------------------------------------------

    async def delete_unseen(self, resource: str, namespace: str, name: str) -> None:
        """Delete an object with no event to the open watches: what a watch that was away (a dropped connection,
        an API server restart) never hears of. Only a listing shows it gone."""
        key = (kmock.resource(resource), namespace, name)
        async with self._lock:
            self._objects[key].delete()

    async def collect_garbage(self) -> builtins.list[tuple[str, str | None, str]]:
        """One pass of the API server's garbage collector, when a test asks (the real one runs in the background):
        every object all of whose ownerReferences name objects that no longer exist (by uid) is deleted, with a
        DELETED watch event, and again until nothing more goes (owners of owners). An object with no ownerReferences
        is never collected. Returns (resource, namespace, name) of what went."""
        collected: builtins.list[tuple[str, str | None, str]] = []
        while True:
            async with self._lock:
                live = {(obj.raw.get("metadata") or {}).get("uid") for obj in self._objects.values() if not obj.deleted}
                orphans = []
                for key, obj in self._objects.items():
                    refs = [] if obj.deleted else (obj.raw.get("metadata") or {}).get("ownerReferences") or []
                    if refs and not any(ref.get("uid") in live for ref in refs):
                        orphans.append((key, obj.raw))
                        obj.delete()
            if not orphans:
                return collected
            for (resource, namespace, name), raw in orphans:
                await self._buses[resource].put({"type": "DELETED", "object": raw})
                collected.append(
                    (f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/"), namespace, name)
                )

    async def expire_watches(self, resource: str) -> None:
        """End every open watch of ``resource`` with the 410 Gone ERROR event the API server sends when the watch's
        resourceVersion is too old (compacted): the client has to list again."""
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version",
            "reason": "Expired",
            "code": 410,
        }
        await self._buses[kmock.resource(resource)].put({"type": "ERROR", "object": status})

    # -- serving -------------------------------------------------------------------------------

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """kmock replays every stored object as ADDED on each watch; a real API server sends only what
        changed after the ``resourceVersion`` the client asks from (kopf passes its list's)."""
        asked = request.params.get("resourceVersion")
        since = int(asked) if asked and asked.isdigit() else None
        selector = request.params.get("labelSelector")
        try:
            selects = label_selector(selector) if selector else None
        except ValueError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from exc
        async for item in super()._serve_watch(request):
            if isinstance(item, dict) and isinstance(item.get("object"), dict):
                meta = item["object"].get("metadata") or {}
                if since is not None and item.get("type") == "ADDED":
                    version = str(meta.get("resourceVersion", ""))
                    if version.isdigit() and int(version) <= since:
                        continue
                if selects is not None and item.get("type") != "ERROR" and not selects(meta.get("labels") or {}):
                    continue  # the API server sends a watch only what its labelSelector selects
            yield item

    async def _serve_list(self, request: kmock.Request) -> Any:
        """kmock lists every object of the resource; a real API server only those its ``labelSelector`` selects, with
        the resourceVersion a watch continues from (kmock's is "...", so every watch would replay every object)."""
        # kmock's list is a dict by construction (its return type is any payload kmock serves)
        payload = cast(dict[str, Any], await super()._serve_list(request))
        payload = {**payload, "metadata": {**payload.get("metadata", {}), "resourceVersion": str(self._committed_rv)}}
        selector = request.params.get("labelSelector")
        if selector:
            try:
                selects = label_selector(selector)
            except ValueError as exc:
                raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from exc
            payload = {
                **payload,
                "items": [
                    item for item in payload["items"] if selects((item.get("metadata") or {}).get("labels") or {})
                ],
            }
        return payload

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> builtins.list[Any]:  # noqa: N802
        """kmock finds the object of a named request by scanning every stored object (O(objects) per request: at a
        thousand runs the emulator, not the operator, would be what a benchmark measures); a key lookup instead."""
        if request.resource is not None and request.name is not None and (strict or request.namespace is not None):
            obj = self._objects._objects.get((request.resource, request.namespace, request.name))
            return [] if obj is None else [obj]
        return [
            obj
            for (resource, namespace, name), obj in self._objects.items()
            if resource == request.resource
            and (namespace == request.namespace if strict else request.namespace in (None, namespace))
            and (request.name is None or name == request.name)
        ]

    def _next_rv(self) -> str:
        self._assigned_rv = next(self._rv_counter)
        return str(self._assigned_rv)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        if res is not None and res.plural is not None and request.method.value.upper() != "OPTIONS":
            info = self._info(res)
            if info is None:  # plain kmock would store a POST to an unknown resource
                what = f"{res.group}/{res.version}/{res.plural}"
                raise kmock.KubernetesResourceNotFoundError(
                    message=f"the server could not find the requested resource ({what})"
                )
            fault = self._take_fault(request)
            if fault is not None:
                raise kmock.KubernetesError(
                    status=fault.status,
                    reason=fault.reason or _REASONS.get(fault.status),
                    message=fault.message or f"injected fault {fault.status}",
                    details={"name": request.name, "kind": res.plural},
                )
            method = request.method.value.upper()
            if method in ("POST", "PATCH", "PUT", "DELETE"):
                async with self._write_lock:  # never held across watches (they are GETs)
                    try:
                        if method == "PUT":
                            return await self._serve_put(request, info)
                        if request.action == kmock.action.CREATE:
                            self._prepare_create(request, info)
                        elif request.action == kmock.action.UPDATE:
                            await self._prepare_update(request, info)
                        response = await super()._handle(request)
                        # kubernetes' CustomObjectsApi.create_* deserializes only a 201 (a 200 gives None).
                        if request.action == kmock.action.CREATE and response.status == 200 and not response.prepared:
                            response.set_status(201)
                        return response
                    finally:  # writes are one at a time: what was assigned is stored (or failed) by now
                        self._committed_rv = self._assigned_rv
        return await super()._handle(request)

    def _prepare_create(self, request: kmock.Request, info: kmock.ResourceInfo) -> None:
        data = request.data
        if not isinstance(data, dict):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="object body expected")
        meta = data.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise kmock.KubernetesError(
                    status=422, reason="Invalid", message="metadata.name or metadata.generateName is required"
                )
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        if info.namespaced and request.namespace:
            meta["namespace"] = request.namespace
        meta["uid"] = str(uuid.uuid4())
        meta["resourceVersion"] = self._next_rv()
        meta["generation"] = 1
        meta["creationTimestamp"] = _now()
        if info.kind and "kind" not in data:
            data["kind"] = info.kind
        if "apiVersion" not in data and request.resource is not None:
            g, v = request.resource.group, request.resource.version
            data["apiVersion"] = f"{g}/{v}" if g else v

    async def _prepare_update(self, request: kmock.Request, info: kmock.ResourceInfo) -> None:
        if request.resource is None or request.name is None:
            return  # nothing is stored without a resource and a name: kmock answers 404
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            obj = self._objects[key] if key in self._objects else None
            current = copy.deepcopy(obj.raw) if obj is not None and not obj.deleted else None
        if current is None:
            return  # kmock answers 404
        data = request.data
        has_status = "status" in info.subresources
        # Real status-subresource semantics: /status changes only status; the main endpoint never.
        if isinstance(data, dict):
            if request.subresource == "status":
                for k in [k for k in data if k != "status"]:
                    del data[k]
            elif has_status:
                data.pop("status", None)
        elif isinstance(data, list):

            def is_status(op: Mapping[str, Any]) -> bool:
                return op.get("path") == "/status" or str(op.get("path", "")).startswith("/status/")

            keep = [
                op
                for op in data
                if op.get("op") == "test"
                or (is_status(op) if request.subresource == "status" else not (has_status and is_status(op)))
            ]
            data[:] = keep
        else:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="patch body expected")
        try:
            new = _kdicts.patch_dict(current, data)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, ValueError) as e:
            # kmock itself would answer 500; kopf expects 422 for a failed 'test' op (stale resourceVersion).
            raise kmock.KubernetesError(status=422, reason="Invalid", message=f"patch failed: {e}") from e
        cur_meta = current.get("metadata", {})
        meta_changes: dict[str, Any] = {"resourceVersion": self._next_rv()}
        if new.get("spec") != current.get("spec"):
            meta_changes["generation"] = int(cur_meta.get("generation", 1)) + 1
        if isinstance(data, dict):
            md = data.get("metadata")
            if not isinstance(md, dict):
                md = data["metadata"] = {}
            md.update(meta_changes)
            for k in ("uid", "creationTimestamp", "name", "namespace"):  # immutable
                if k in md and cur_meta.get(k) is not None:
                    md[k] = cur_meta[k]
        else:
            data.extend({"op": "add", "path": f"/metadata/{k}", "value": v} for k, v in meta_changes.items())

    async def _serve_put(self, request: kmock.Request, info: kmock.ResourceInfo) -> aiohttp.web.StreamResponse:
        data = request.data
        if request.name is None or not isinstance(data, dict):
            raise kmock.KubernetesError(status=405, reason="MethodNotAllowed", message="PUT needs a named object")
        if request.resource is None:
            raise kmock.KubernetesObjectNotFoundError()  # nothing is stored without a resource
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            current = copy.deepcopy(self._objects[key].raw)
            cur_meta = current.get("metadata", {})
            meta = data.setdefault("metadata", {})
            if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta.get("resourceVersion"):
                raise kmock.KubernetesError(
                    status=409,
                    reason="Conflict",
                    message=(
                        "Operation cannot be fulfilled: the object has been modified; "
                        "please apply your changes to the latest version and try again"
                    ),
                )
            new = dict(current) if request.subresource == "status" else dict(data)
            if request.subresource == "status":
                new["status"] = data.get("status")
            elif "status" in info.subresources:
                new["status"] = current.get("status")
                if new["status"] is None:
                    del new["status"]
            new_meta = dict(new.get("metadata", {}))
            for k in ("uid", "creationTimestamp", "name", "namespace", "generation"):
                if k in cur_meta:
                    new_meta[k] = cur_meta[k]
            new_meta["resourceVersion"] = self._next_rv()
            if new.get("spec") != current.get("spec"):
                new_meta["generation"] = int(cur_meta.get("generation", 1)) + 1
            new["metadata"] = new_meta
            self._objects[key].create(new)  # appends a new version to the history
            raw = self._objects[key].raw
            await self._buses[request.resource].put({"type": "MODIFIED", "object": raw})
        return aiohttp.web.json_response(raw)


# ------------------------------------------------------------------------------------------------
# Running it.


@contextlib.asynccontextmanager
async def running_emulator(
    *,
    pytorchjobs: bool = True,
    jobsets: bool = True,
    trainer: bool = True,
    extra: Mapping[str, Mapping[str, Any]] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> AsyncIterator[AtlasKubeEmulator]:
    """Serve from the CURRENT event loop. ``emu.url`` is e.g. http://127.0.0.1:41234/ ."""
    install_kmock_fixes()
    emu = AtlasKubeEmulator()
    emu.declare(default_resources(pytorchjobs=pytorchjobs, jobsets=jobsets, trainer=trainer))
    if extra:
        emu.declare(extra)
    async with emu, kmock.Server(emu, host=host, port=port):
        yield emu


class EmulatorThread:
    """The emulator in a daemon thread with its own event loop (for sync tests & other processes)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.emulator: AtlasKubeEmulator | None = None
        self.url: str = ""
        self._thread = threading.Thread(target=self._main, name="kube-emulator", daemon=True)

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with running_emulator(**self._kwargs) as emu:
                self.emulator = emu
                self.url = str(emu.url).rstrip("/")
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self._error = e
            self._ready.set()
            raise

    def __enter__(self) -> EmulatorThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or self.emulator is None:
            raise RuntimeError("the kube emulator did not start") from self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def run(self, coro: Any, timeout: float = 10) -> Any:
        """Run a coroutine on the emulator's loop (e.g. to touch kmock's async-only APIs)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)


def write_kubeconfig(path: str | os.PathLike[str], url: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig for plain http (no TLS) with a dummy token; kopf & `kubernetes` both accept it."""
    path = pathlib.Path(path)
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "kmock", "user": {"token": "kmock-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": namespace}}],
        "current-context": "kmock",
    }
    path.write_text(json.dumps(cfg, indent=2))  # JSON is YAML
    return path


# ------------------------------------------------------------------------------------------------
# kopf.


def configure_kopf_for_emulator(settings: Any) -> None:
    """Call from an operator's @kopf.on.startup (or a test-only startup hook) to be quick & quiet."""
    settings.watching.reconnect_backoff = 0.1
    settings.watching.connect_timeout = 5
    settings.scanning.disabled = True  # no namespace/CRD watching (-A needs none anyway)


class KopfProcess:
    """`python -m kopf run -A --standalone FILE` against a kubeconfig; start/kill/restart."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        kubeconfig: str | os.PathLike[str],
        *,
        log: str | os.PathLike[str],
        args: tuple[str, ...] = (),
        env: Mapping[str, str] | None = None,
    ):
        self.cmd = [sys.executable, "-m", "kopf", "run", "-A", "--standalone", *args, str(path)]
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), **(env or {})}
        self.log = pathlib.Path(log)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> KopfProcess:
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(
                self.cmd, env=self.env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        rc, self.proc = self.proc.returncode, None
        return rc

    def kill(self) -> int | None:  # crash simulation: no graceful shutdown
        return self.stop(signal.SIGKILL)

    def restart(self) -> KopfProcess:
        self.stop()
        return self.start()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __enter__(self) -> KopfProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------------------------------------
# pytest fixtures (import them into a test module or conftest.py to use them).


@pytest.fixture()
def kube_emulator_options() -> dict[str, Any]:
    """Override in a test module to change the cluster, e.g. ``return {'pytorchjobs': False}``."""
    return {}


@pytest.fixture()
def kube_emulator(kube_emulator_options: dict[str, Any]) -> Iterator[EmulatorThread]:
    with EmulatorThread(**kube_emulator_options) as srv:
        yield srv


@pytest.fixture()
def kubeconfig(kube_emulator: EmulatorThread, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Writes the kubeconfig and sets $KUBECONFIG (subprocesses inherit it via os.environ)."""
    path = write_kubeconfig(tmp_path / "kubeconfig", kube_emulator.url)
    monkeypatch.setenv("KUBECONFIG", str(path))
    # kubernetes reads $KUBECONFIG once, at import: load_kube_config() without config_file (as in
    # kopf's default login_via_client, in-process) would otherwise still look at ~/.kube/config.
    import kubernetes.config.kube_config as kc

    monkeypatch.setattr(kc, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    return path


__all__ = [
    "AtlasKubeEmulator",
    "Call",
    "EmulatorThread",
    "Fault",
    "JOBS",
    "JOBSETS",
    "TRAINJOBS",
    "CLUSTER_TRAINING_RUNTIMES",
    "KopfProcess",
    "PODS",
    "NETWORK_POLICIES",
    "PYTORCHJOBS",
    "TEACHERS",
    "TRAININGS",
    "configure_kopf_for_emulator",
    "default_resources",
    "install_kmock_fixes",
    "kube_emulator",
    "kube_emulator_options",
    "kubeconfig",
    "running_emulator",
    "write_kubeconfig",
]
