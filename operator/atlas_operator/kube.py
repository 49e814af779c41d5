"""The Kubernetes API calls the operator makes — all of them, in one place (the chart's RBAC lists
exactly these). Plain dicts in and out, through the official client's transport and auth."""

from __future__ import annotations

import json
import urllib.parse
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
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
NETWORK_POLICY = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
# Read only: the finished rank-0 pod's termination message (the run's result); a JobSet's pods by label. (kopf also
# watches the runs' pods, for a container the kubelet cannot start.)
POD = Resource("", "v1", "pods", "Pod")
USER_AGENT = "atlas-operator/0.1.0"
RESOURCES = {r.kind: r for r in (CONFIG_MAP, SERVICE, DEPLOYMENT, PYTORCH_JOB, JOBSET, NETWORK_POLICY)}
JOBS = {"PyTorchJob": PYTORCH_JOB, "JobSet": JOBSET}  # spec.backend → the workload that runs the trainer


def resource_of(obj: dict[str, Any]) -> Resource:
    return RESOURCES[obj["kind"]]


class ApiError(Exception):
    """A failed API call: ``status`` is the HTTP status, ``reason`` the Status reason (NotFound, …)."""

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


class Kube:
    """Thin synchronous client (kopf runs sync handlers in its thread pool)."""

    def __init__(self, api_client=None, timeout: float = 30.0):
        if api_client is None:
            api_client = default_api_client()
        api_client.user_agent = USER_AGENT  # tells the operator's calls apart in audit logs
        self.api = api_client
        self.timeout = timeout

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        headers = {"Accept": accept, "Content-Type": content_type}
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, header_params=headers, body=body, _request_timeout=self.timeout)
        data = response.read()
        payload = _json(data)
        if not 200 <= response.status < 300:
            reason = payload.get("reason") if isinstance(payload, dict) else None
            message = payload.get("message") if isinstance(payload, dict) else None
            raise ApiError(response.status, reason or response.reason or "", message or str(data[:200]), method, path)
        return payload

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", resource.path(namespace, name))
        except ApiError as exc:
            if exc.not_found:
                return None
            raise

    def list(self, resource: Resource, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        return self._call("GET", f"{resource.path(namespace)}?{query}").get("items") or []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        resource = resource_of(obj)
        return self._call("POST", resource.path(obj["metadata"]["namespace"]), obj)

    def patch(
        self, resource: Resource, namespace: str, name: str, patch: dict[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        return self._call(
            "PATCH", resource.path(namespace, name, subresource), patch, content_type="application/merge-patch+json"
        )

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """True when something was deleted; a missing object is not an error."""
        try:
            self._call("DELETE", resource.path(namespace, name), {"propagationPolicy": "Background"})
            return True
        except ApiError as exc:
            if exc.not_found:
                return False
            raise

    def exists(self, resource: Resource, namespace: str, name: str) -> bool:
        return self.get(resource, namespace, name) is not None

    def serves(self, resource: Resource) -> bool:
        """Whether the API server serves ``resource`` (discovery: is its CRD installed?)."""
        try:
            document = self._call("GET", f"/apis/{resource.group}/{resource.version}")
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        return any(r.get("name") == resource.plural for r in document.get("resources") or [])


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data else {}
    except ValueError:
        return {}


def default_api_client():
    """In-cluster service account, else $KUBECONFIG / ~/.kube/config (what kopf logs in with too)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
