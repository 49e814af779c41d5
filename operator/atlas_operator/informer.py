"""What the operator created, listed and then watched, held in memory: the informer of client-go's controllers.

Each resource (in each watched namespace, or cluster-wide) is followed with kopf's own watch-stream: a list, then a
watch from the list's resourceVersion, reconnecting where it stopped, listing again after a 410 Gone, through a
server-side label selector (``settings.watching.label_selectors``), with kopf's login. What it leaves out is kopf's
per-object event processing (a worker, a handler state, a patch, the invocation of each index and event handler):
about a millisecond of CPU per event, and a run brings seven child events when it is created. At a thousand runs
created at once that was a third of the operator's CPU, the difference between keeping up and not
(bench/operator_throughput.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

import kopf

from atlas_operator import kopf_compat
from atlas_operator.kube import Resource

log = logging.getLogger("atlas_operator")

Key = tuple[str, str, str]  # (plural, namespace, name)
# Called on the event loop for each change after the first listing: (ADDED, MODIFIED or DELETED, resource, object).
OnChange = Callable[[str, Resource, dict[str, Any]], None]
# Whether a held object's change is news (resource, the copy held before, the new one): one that is not updates the
# copy and calls no on_change.
Matters = Callable[[Resource, dict[str, Any] | None, dict[str, Any]], bool]
# Seconds between tries to list a resource the API server does not serve (its CRD not installed: a cluster without
# one backend's controller; none of its objects exist meanwhile) or does not let the operator list (its RBAC; reads
# ask the API server).
UNSERVED_RETRY_S = 30.0


class Informer:
    """The latest state of every object of ``held`` resources (a lookup by key, no API call), and ``on_change`` for
    each change of those after their first listing (of the ``announced`` among them, for each object of the first
    listing too, as ADDED: a run that existed before the operator started is reconciled once, as kopf's resume
    handlers did); and ``on_change`` for every object of the ``followed`` ones, listed (as ADDED: a pod stuck before
    the operator started) or changed (seen, not held: pods are many and large)."""

    def __init__(
        self,
        held: Iterable[Resource],
        followed: Iterable[Resource] = (),
        namespaces: tuple[str, ...] = (),
        on_change: OnChange | None = None,
        matters: Matters | None = None,
        announced: Iterable[Resource] = (),
    ):
        self.held = tuple(held)
        self.followed = tuple(followed)
        self.announced = tuple(announced)
        if not set(self.announced) <= set(self.held):
            raise ValueError("an announced resource must be held")
        self.namespaces: tuple[str | None, ...] = namespaces or (None,)  # None: cluster-wide
        self.on_change = on_change
        self.matters = matters or (lambda resource, before, after: True)
        self._objects: dict[Key, dict[str, Any]] = {}
        self._listed: set[tuple[str, str | None]] = set()  # (plural, namespace) whose first listing is over
        self._refused: set[tuple[str, str | None]] = set()  # (plural, namespace) the RBAC does not let it list
        self._listing: dict[tuple[str, str | None], dict[Key, dict[str, Any]]] = {}  # listings in progress
        self._tasks: list[asyncio.Task[None]] = []

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """The held object, or None when the watch does not show it (absent, or not listed yet: see ``synced``)."""
        return self._objects.get((resource.plural, namespace, name))

    def hold(self, resource: Resource, obj: dict[str, Any]) -> None:
        """Hold ``obj``, the API server's answer to this process's own write, in place of an older copy: the next
        reconciliation reads what was written even before the watch brings its echo (which then is no news)."""
        meta = obj.get("metadata") or {}
        key = (resource.plural, meta.get("namespace", ""), meta.get("name", ""))
        before = self._objects.get(key)
        if before is not None and not _newer(obj, before):
            return
        meta.pop("managedFields", None)
        self._objects[key] = obj

    def synced(self, plural: str) -> bool:
        """Whether every object of ``plural`` is held: its first listing is over in every watched namespace."""
        return all((plural, namespace) in self._listed for namespace in self.namespaces)

    def started(self) -> bool:
        """Whether every watch's first listing has ended: listed, not served (no CRD), or refused (the RBAC: reads of
        it ask the API server). The operator's readiness (``/readyz``): until then a reconciliation reads every
        child from the API server."""
        wanted = {(r.plural, namespace) for r in (*self.held, *self.followed) for namespace in self.namespaces}
        return wanted <= self._listed | self._refused

    def __len__(self) -> int:
        return len(self._objects)

    def start(self, settings: kopf.OperatorSettings) -> None:
        """Follow every resource in every namespace, each in its own task (from kopf's startup: its login holds)."""
        for resource in (*self.held, *self.followed):
            for namespace in self.namespaces:
                self._tasks.append(
                    asyncio.create_task(
                        self._follow(settings, resource, namespace), name=f"informer {resource.plural} {namespace}"
                    )
                )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _follow(self, settings: kopf.OperatorSettings, resource: Resource, namespace: str | None) -> None:
        stream = kopf.Resource(resource.group, resource.version, resource.plural, kind=resource.kind, namespaced=True)
        while True:
            try:
                # kopf's NamespaceName is a NewType of str (private: kopf._cogs.structs.references), a str at run time.
                watch = kopf_compat.infinite_watch(
                    settings=settings,
                    resource=stream,
                    namespace=namespace,  # type: ignore[arg-type]  # a str is kopf's NamespaceName
                )
                async for event in watch:
                    self.handle(resource, namespace, event)
            except asyncio.CancelledError:
                raise
            except kopf_compat.APINotFoundError as exc:  # not served (its CRD is not installed): none of it exists
                if (resource.plural, namespace) not in self._listed:
                    log.info("not watching %s in %s: %s", resource.plural, namespace or "all namespaces", exc)
                self._listing.pop((resource.plural, namespace), None)
                self._relisted(resource, namespace, {})
                await asyncio.sleep(UNSERVED_RETRY_S)
            except kopf_compat.APIForbiddenError as exc:  # not listable (the RBAC): not synced, so reads ask the API
                # Said once (then at DEBUG): a refusal for good is retried every UNSERVED_RETRY_S, quietly.
                said = log.debug if (resource.plural, namespace) in self._refused else log.warning
                said("cannot watch %s in %s: %s", resource.plural, namespace or "all namespaces", exc)
                self._refused.add((resource.plural, namespace))
                self._listing.pop((resource.plural, namespace), None)
                await asyncio.sleep(UNSERVED_RETRY_S)
            except Exception:  # an unexpected answer: say so, and list again (kopf retries transient errors itself)
                log.exception("watching %s in %s failed; listing again", resource.plural, namespace or "all namespaces")
                self._listing.pop((resource.plural, namespace), None)
                await asyncio.sleep(max(1.0, settings.watching.reconnect_backoff))

    def handle(self, resource: Resource, namespace: str | None, event: Any) -> None:
        """One item of kopf's watch-stream: an object of a listing (type None), the end of a listing
        (``Bookmark.LISTED``), a change (ADDED, MODIFIED, DELETED), or a BOOKMARK (nothing to do)."""
        if event is kopf_compat.Bookmark.LISTED:
            self._relisted(resource, namespace, self._listing.pop((resource.plural, namespace), {}))
            return
        if not isinstance(event, dict) or event.get("type") == "BOOKMARK":
            return
        obj = event["object"]
        meta = obj.get("metadata") or {}
        # Who wrote which field (the API server's record, a good part of each object): nothing here reads it, and a
        # thousand runs' children are held (client-go's informers strip it too: TransformStripManagedFields).
        meta.pop("managedFields", None)
        key = (resource.plural, meta.get("namespace", ""), meta.get("name", ""))
        if event["type"] is None:
            self._listing.setdefault((resource.plural, namespace), {})[key] = obj
            return
        if resource in self.held:
            if event["type"] == "DELETED":
                self._objects.pop(key, None)
            else:
                before = self._objects.get(key)
                if before is not None and _newer(before, obj):
                    return  # older than the answer to this process's own write (``hold``), which said its news
                self._objects[key] = obj
                if event["type"] == "MODIFIED" and not self.matters(resource, before, obj):
                    return
        self._notify(event["type"], resource, obj)

    def _relisted(self, resource: Resource, namespace: str | None, listing: dict[Key, dict[str, Any]]) -> None:
        """A listing is over. The first one fills the store; a later one (after a 410) also reports what changed
        while the watch was away: objects gone, added or changed."""
        first = (resource.plural, namespace) not in self._listed
        self._listed.add((resource.plural, namespace))
        if resource not in self.held:  # nothing held to compare with: each listed object is news (a stuck pod)
            for obj in listing.values():
                self._notify("ADDED", resource, obj)
            return
        announce = first and resource in self.announced
        gone = [
            key
            for key in self._objects
            if key[0] == resource.plural and namespace in (None, key[1]) and key not in listing
        ]
        for key in gone:
            obj = self._objects.pop(key)
            if not first:
                self._notify("DELETED", resource, obj)
        for key, obj in listing.items():
            before = self._objects.get(key)
            if before is not None and _newer(before, obj):  # held from this process's own write, newer than listed
                obj = before
            self._objects[key] = obj
            if announce or (not first and _version(before) != _version(obj) and self.matters(resource, before, obj)):
                self._notify("MODIFIED" if before is not None else "ADDED", resource, obj)

    def _notify(self, type_: str, resource: Resource, obj: dict[str, Any]) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(type_, resource, obj)
        except Exception:  # one bad object must not stop the stream of every other
            log.exception("handling a %s event of %s failed", type_, resource.kind)


def _version(obj: dict[str, Any] | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def _newer(obj: dict[str, Any], than: dict[str, Any]) -> bool:
    """Whether ``obj`` is a later version of the object ``than`` is: resourceVersions are opaque, but etcd's are
    integers, which client-go's informers compare too; anything else is taken as newer."""
    mine, theirs = _version(obj), _version(than)
    try:
        return int(mine or "") > int(theirs or "")
    except ValueError:
        return mine != theirs
