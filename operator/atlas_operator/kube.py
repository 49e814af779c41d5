"""The Kubernetes API calls the operator makes — all of them, in one place (the chart's RBAC lists
exactly these). Plain dicts in and out, through the official client's transport and auth."""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import logging
import random
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import urllib3

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

from atlas_operator import __version__


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}" if self.namespaced else f"{base}/{self.plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


CONFIG_MAP = Resource("", "v1", "configmaps", "ConfigMap")
SERVICE = Resource("", "v1", "services", "Service")
PVC = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
DEPLOYMENT = Resource("apps", "v1", "deployments", "Deployment")
PYTORCH_JOB = Resource("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
JOBSET = Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
TRAINJOB = Resource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
# Read only, cluster-scoped: the runtime a TrainJob names (a prerequisite the chart installs).
CLUSTER_TRAINING_RUNTIME = Resource(
    "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", "ClusterTrainingRuntime", namespaced=False
)
NETWORK_POLICY = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
# Read only: the finished rank-0 pod's termination message (the run's result); a JobSet's pods by label. (kopf also
# watches the runs' pods, for a container the kubelet cannot start.)
POD = Resource("", "v1", "pods", "Pod")
# The replicas' leader election (atlas_operator/leader.py), in the operator's own namespace.
LEASE = Resource("coordination.k8s.io", "v1", "leases", "Lease")
EVENT = Resource("", "v1", "events", "Event")  # create only: what happened to a run (kubectl describe)
EVENT_MESSAGE_MAX = 1024  # the API server refuses longer Event messages
USER_AGENT = f"atlas-operator/{__version__}"
EVENT_SOURCE = "atlas-operator"  # an Event's source.component: the "From" column of kubectl describe
log = logging.getLogger("atlas_operator")
RESOURCES = {r.kind: r for r in (CONFIG_MAP, SERVICE, DEPLOYMENT, PYTORCH_JOB, JOBSET, TRAINJOB, NETWORK_POLICY)}
# The backends' jobs by kind, for tools and tests that address them without the operator; the operator asks
# atlas_operator/backends/ (each backend's ``resource``: tests/unit/test_backends.py checks they agree).
JOBS = {"PyTorchJob": PYTORCH_JOB, "JobSet": JOBSET, "TrainJob": TRAINJOB}


def resource_of(obj: dict[str, Any]) -> Resource:
    return RESOURCES[obj["kind"]]


class ApiError(Exception):
    """A failed API call: ``status`` is the HTTP status (0: no answer, the API server unreachable), ``reason`` the
    Status reason (NotFound, …)."""

    def __init__(self, status: int, reason: str, message: str, method: str, path: str):
        super().__init__(f"{method} {path}: {status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def rejected(self) -> bool:
        """The server refuses the request as sent (invalid, forbidden, bad request): retrying it unchanged
        cannot succeed."""
        return self.status in (400, 403, 422)


# An object the operator holds from a watch: (resource, namespace, name) -> the object, or None when the watch has
# not shown it (absent, or not seen yet).
Lookup = Callable[[Resource, str, str], "dict[str, Any] | None"]


# Pooled API connections: at least the requests in flight at once (the handler threads, OperatorConfig.workers, 16 by
# default, each waiting on one, or on a wave of its run's sent together: reconcile/concurrency.py).
CONNECTIONS = 64
RETRY_AFTER_TRIES = 10  # client-go's: a request answered 429 is sent again after its Retry-After, 10 times at most
# A Retry-After is waited, then up to half of it more, at random (client-go's wait.Jitter, maxFactor 0.5): the API
# server tells every worker it rejected in one second the same whole seconds, and without it they all came back in
# the same second, to be rejected together again.
RETRY_AFTER_JITTER = 0.5
PENDING = "pending"  # a write in flight (see Kube._writing)


class Kube:
    """Thin synchronous client (kopf runs sync handlers in its thread pool).

    ``watched`` (optional) answers :meth:`get` for the resources the operator watches, from what the watch holds, so
    a settled run costs no read: an object the watch has not shown yet, or one this client wrote since (the watch is
    behind), is read from the API server as before. ``synced(plural)`` says whether the watch shows every object of
    a resource (its first listing is over), so that one it does not show is absent."""

    def __init__(
        self,
        api_client: ApiClient | None = None,
        timeout: float = 30.0,
        watched: Lookup | None = None,
        synced: Callable[[str], bool] | None = None,
    ) -> None:
        if api_client is None:
            api_client = default_api_client()
        api_client.user_agent = USER_AGENT  # tells the operator's calls apart in audit logs
        self.api = api_client
        self.timeout = timeout
        self.watched = watched
        self.synced = synced or (lambda plural: False)
        self._lock = threading.Lock()
        # (plural, namespace, name) -> resourceVersion of this client's last write: newer than the watch's copy until
        # the watch shows it; also tells a watch event that echoes our own write from someone else's change.
        self._written: dict[tuple[str, str, str], str] = {}

    def _remember(self, resource: Resource, obj: Any) -> None:
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not meta or not meta.get("name"):
            return
        with self._lock:
            self._written[(resource.plural, meta.get("namespace", ""), meta["name"])] = str(
                meta.get("resourceVersion", "")
            )

    @contextlib.contextmanager
    def _writing(self, resource: Resource, namespace: str, name: str) -> Iterator[None]:
        """While a write is in flight its watch event may come before its answer: it is ours (PENDING)."""
        key = (resource.plural, namespace, name)
        with self._lock:
            before = self._written.get(key)
            self._written[key] = PENDING
        try:
            yield
        except BaseException:
            with self._lock:
                if self._written.get(key) == PENDING:
                    if before is None:
                        self._written.pop(key, None)
                    else:
                        self._written[key] = before
            raise

    def own_write(self, resource: Resource, obj: dict[str, Any], deleted: bool = False) -> bool:
        """Whether ``obj`` (from a watch event) is exactly what this client's last write of it returned, or, when it
        is gone (``deleted``), whether this client deleted it."""
        meta = obj.get("metadata") or {}
        with self._lock:
            written = self._written.get((resource.plural, meta.get("namespace", ""), meta.get("name", "")))
        if deleted:
            return written == ""
        return written == PENDING or (written is not None and written == str(meta.get("resourceVersion", "")))

    def _from_watch(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        if self.watched is None:
            return None
        held = self.watched(resource, namespace, name)
        if held is None:
            return None
        with self._lock:
            written = self._written.get((resource.plural, namespace, name))
        if written is not None and not _not_older(
            str((held.get("metadata") or {}).get("resourceVersion", "")), written
        ):
            return None  # the watch has not shown our last write yet
        return copy.deepcopy(held)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        """One API request, as every verb here sends it (a 429 sent again after its Retry-After): the decoded answer,
        or ApiError."""
        headers = {"Accept": accept, "Content-Type": content_type}
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        for tries in range(RETRY_AFTER_TRIES + 1):
            try:
                response = self.api.call_api(
                    method, url, header_params=headers, body=body, _request_timeout=self.timeout
                )
                data = response.read()
            except urllib3.exceptions.HTTPError as exc:
                # No answer (refused, reset, timed out): an ApiError too, retried as one — not an exception kopf
                # retries after a minute, nor one that ends the leader's renewals (atlas_operator/leader.py).
                raise ApiError(0, "Unreachable", str(exc), method, path) from exc
            wait = _retry_after(response)
            if wait is None or tries == RETRY_AFTER_TRIES:
                break
            # 429 (API Priority and Fairness rejected it, unserved): sent again after the server's Retry-After, for
            # every verb, as client-go does. Before, only GET and DELETE waited it (urllib3); a POST or PATCH failed
            # its reconciliation, retried after ATLAS_RETRY_DELAY whatever the server asked.
            time.sleep(jittered(wait))
        payload = _json(data)
        if not 200 <= response.status < 300:
            reason = payload.get("reason") if isinstance(payload, dict) else None
            message = payload.get("message") if isinstance(payload, dict) else None
            raise ApiError(response.status, reason or response.reason or "", message or str(data[:200]), method, path)
        return payload

    def get(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        absent_unless_watched: bool = False,
        cached: bool = False,
    ) -> dict[str, Any] | None:
        """The object, from the watch's copy when it is current; ``absent_unless_watched``: an object the watch does
        not show and this client never wrote is taken as absent without asking (for a create that handles a 409);
        ``cached``: asked of the API server's cache (``get_fresh``)."""
        held = self._from_watch(resource, namespace, name)
        if held is not None:
            return held
        if absent_unless_watched and self.watched is not None and self.synced(resource.plural):
            with self._lock:
                if (resource.plural, namespace, name) not in self._written:
                    return None
        return self.get_fresh(resource, namespace, name, cached=cached)

    def get_fresh(self, resource: Resource, namespace: str, name: str, cached: bool = False) -> dict[str, Any] | None:
        """The object as the API server has it now (not the watch's copy). ``cached``: as the API server's watch
        cache has it (``resourceVersion=0``, client-go's reads for informers): no etcd read, and a write of the last
        moments may not show — for a look whose answer a later write checks anyway (a create's 409)."""
        path = resource.path(namespace, name) + ("?resourceVersion=0" if cached else "")
        try:
            found: dict[str, Any] = self.request("GET", path)
            return found
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def list(self, resource: Resource, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        items: list[dict[str, Any]] = self.request("GET", f"{resource.path(namespace)}?{query}").get("items") or []
        return items

    def create(self, obj: dict[str, Any], resource: Resource | None = None) -> dict[str, Any]:
        """Create ``obj`` (a child of a run, or an object of ``resource``)."""
        resource = resource or resource_of(obj)
        meta = obj["metadata"]
        with self._writing(resource, meta["namespace"], meta["name"]):
            created: dict[str, Any] = self.request("POST", resource.path(meta["namespace"]), obj)
        self._remember(resource, created)
        return created

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: dict[str, Any] | Sequence[dict[str, Any]],
        subresource: str | None = None,
        json_patch: bool = False,
    ) -> dict[str, Any]:
        """A JSON merge patch (RFC 7386), or with ``json_patch`` a JSON patch (RFC 6902: a list of operations)."""
        content_type = "application/json-patch+json" if json_patch else "application/merge-patch+json"
        with self._writing(resource, namespace, name):
            patched: dict[str, Any] = self.request(
                "PATCH", resource.path(namespace, name, subresource), patch, content_type=content_type
            )
        self._remember(resource, patched)
        return patched

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """True when something was deleted; a missing object is not an error."""
        with self._lock:  # until it is made again, the watch's copy may be the deleted object: read it
            self._written[(resource.plural, namespace, name)] = ""
        try:
            self.request("DELETE", resource.path(namespace, name), {"propagationPolicy": "Background"})
            return True
        except ApiError as exc:
            if exc.not_found:
                return False
            raise

    def post_event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """An Event about ``involved`` (a run), as kopf posts them (``kubectl describe`` shows it). A failure is
        logged, never raised: an Event is worth no failed reconciliation."""
        meta = involved["metadata"]
        if len(message) > EVENT_MESSAGE_MAX:
            message = message[: EVENT_MESSAGE_MAX - 3] + "..."
        now = datetime.datetime.now(datetime.UTC).isoformat()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"namespace": meta["namespace"], "generateName": f"{meta['name']}."},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),  # the run as the Event tells of it
            },
            "type": type_,
            "reason": reason,
            "message": message,
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.request("POST", EVENT.path(meta["namespace"]), event)
        except (ApiError, OSError) as exc:
            log.warning(
                "could not post the %s Event %s of %s %s: %s", type_, reason, involved.get("kind"), meta["name"], exc
            )

    def exists(self, resource: Resource, namespace: str, name: str) -> bool:
        return self.get(resource, namespace, name) is not None

    def serves(self, resource: Resource) -> bool:
        """Whether the API server serves ``resource`` (discovery: is its CRD installed?)."""
        try:
            document = self.request("GET", f"/apis/{resource.group}/{resource.version}")
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return any(r.get("name") == resource.plural for r in document.get("resources") or [])


def _not_older(held: str, written: str) -> bool:
    """Whether the watch's copy (resourceVersion ``held``) includes our write (``written``). resourceVersions are
    opaque in the API's contract but etcd revisions in practice: compared as numbers when both are, else equal only."""
    if held.isdigit() and written.isdigit():
        return int(held) >= int(written)
    return held == written


def jittered(wait: float, draw: Callable[[], float] = random.random) -> float:
    """``wait`` seconds and up to RETRY_AFTER_JITTER of it more (never less: the server's Retry-After is honoured)."""
    return wait * (1.0 + RETRY_AFTER_JITTER * draw())


def _retry_after(response: Any) -> float | None:
    """The seconds an answer asks to wait before the request is sent again (client-go's ``checkWait``: a 429 or a
    5xx with a Retry-After in seconds), else None."""
    if response.status != 429 and not 500 <= response.status < 600:
        return None
    try:
        return max(0.0, float(response.headers.get("Retry-After", "")))
    except ValueError:
        return None


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else {}
    except ValueError:
        return {}


def default_api_client() -> ApiClient:
    """In-cluster service account, else $KUBECONFIG / ~/.kube/config (what kopf logs in with too)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # One pooled connection per handler thread (the default, 5 per CPU, is fewer than the threads: a busy operator
    # would drop and reopen connections).
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, CONNECTIONS)
    # urllib3's default retries, but not of answers with a Retry-After: Kube.request waits those, for every verb.
    configuration.retries = urllib3.Retry(3, respect_retry_after_header=False)
    return client.ApiClient(configuration)
