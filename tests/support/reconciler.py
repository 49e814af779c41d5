"""The operator's Reconciler in this process, with the operator's own API client (atlas_operator.kube.Kube) on the API
emulator: no kopf, no operator process. A test calls ``reconcile`` itself (with ``kopf.adopt``, as the handlers pass
it), writes what the rest of the cluster would write (a job's status, a finished pod) through its own client, and
reads what the operator wrote from the emulator's store and request log.

    with ReconcilerCluster() as cluster:
        result = cluster.reconciler().reconcile(body, kopf.adopt)
        cluster.emu.get(PYTORCHJOBS, "team-a", "run")
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes

from harness.kube_emulator import PYTORCHJOBS, Call, EmulatorThread
from harness.manifests import NS, teacher

OPERATOR = "atlas-operator/"  # the User-Agent of the operator's client (atlas_operator.kube.USER_AGENT)


class ReconcilerCluster:
    """An emulator of its own, the operator's client on it (``kube``) and a separate client for what the test writes
    (``core``, ``custom``, ``networking``: their requests are told apart from the operator's by User-Agent)."""

    def __init__(self, **emulator_options: Any):
        self._options = emulator_options
        self.server: EmulatorThread | None = None

    def __enter__(self) -> ReconcilerCluster:
        from atlas_operator.kube import Kube

        self.server = EmulatorThread(**self._options).__enter__()
        self.emu = self.server.emulator
        self.kube = Kube(self._client())
        test_client = self._client()
        self.core = kubernetes.client.CoreV1Api(test_client)
        self.custom = kubernetes.client.CustomObjectsApi(test_client)
        self.networking = kubernetes.client.NetworkingV1Api(test_client)
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.server is not None
        self.server.__exit__(*exc)

    def _client(self) -> kubernetes.client.ApiClient:
        assert self.server is not None
        return kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.server.url))

    def reconciler(self, config=None):
        """A Reconciler on this cluster (``config``: an OperatorConfig; its defaults when None)."""
        from atlas_operator.config import OperatorConfig
        from atlas_operator.reconcile import Reconciler

        return Reconciler(self.kube, config if config is not None else OperatorConfig())

    # -- what the operator did

    def operator_calls(
        self, verb: str | None = None, resource: str | None = None, name: str | None = None
    ) -> list[Call]:
        """The operator's requests (``verb`` get/list/create/patch/delete, ``resource`` a plural), in order."""
        return self.emu.calls(
            lambda c: (
                (c.user_agent or "").startswith(OPERATOR)
                and (verb is None or c.verb == verb)
                and (resource is None or c.resource == resource)
                and (name is None or c.name == name)
            )
        )

    def stored(self) -> set[tuple[str, str | None, str]]:
        """(plural, namespace, name) of every object the API server holds."""
        return {(resource.rsplit("/", 1)[1], namespace, name) for resource, namespace, name in self.emu.stored()}

    # -- what the rest of the cluster writes

    def set_job_status(self, name: str, status: dict[str, Any]) -> None:
        """What the Kubeflow controller writes on PyTorchJob ``name``: its status (a merge patch of /status)."""
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", NS, "pytorchjobs", name, {"status": status}
        )

    def put_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """Pod ``pod`` as its controller creates it and the kubelet reports it (its ``status`` written through the
        status subresource, as the kubelet does); one of the same name is replaced."""
        name = pod["metadata"]["name"]
        if self.emu.get("v1/pods", NS, name) is not None:
            self.core.delete_namespaced_pod(name, NS, _preload_content=False)
        body = {k: v for k, v in copy.deepcopy(pod).items() if k != "status"}
        body.setdefault("spec", {"containers": [{"name": "pytorch", "image": "registry.example/atlas-trainer:test"}]})
        self.core.create_namespaced_pod(NS, body, _preload_content=False)  # unchecked: a partial Pod
        if pod.get("status"):
            self.core.patch_namespaced_pod_status(
                name,
                NS,
                {"status": pod["status"]},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        return self.emu.get("v1/pods", NS, name)


def master_pod(name: str, job_uid: str, message: str | None, exit_code: int = 0) -> dict[str, Any]:
    """A finished Master pod as the Kubeflow controller names it and the kubelet reports it."""
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {
            "name": f"{name}-master-0",
            "namespace": NS,
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": name,
                    "uid": job_uid,
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "pytorch", "state": {"terminated": terminated}}],
        },
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """``patch`` applied to ``target`` as a JSON merge patch (RFC 7386: None deletes; what kopf does with a status
    patch a handler returns)."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(target.get(key), value)
    return out


class ResultCluster:
    """A Reconciler on a ReconcilerCluster with one teacher run (evaluation on) whose job it has created: drive the job,
    read what is written to the run's status."""

    def __init__(self, cluster: ReconcilerCluster, name: str):
        self.cluster = cluster
        self.reconciler = cluster.reconciler()
        self.name = name
        self.body = teacher(name, evaluation={"samples": 1, "limit": 4})
        self.body["metadata"]["uid"] = f"{name}-uid"
        self.status: dict = {}
        self.events: list = []
        self.reconcile()

    @property
    def job(self) -> dict:
        return self.cluster.emu.get(PYTORCHJOBS, NS, self.name)

    def succeed_job(self) -> None:
        self.cluster.set_job_status(
            self.name, {"conditions": [{"type": "Succeeded", "status": "True", "message": "done"}]}
        )

    def put_master_pod(self, message: str | None, exit_code: int = 0, job_uid: str | None = None) -> dict:
        """The job's finished Master pod (``job_uid``: of another job of the same name)."""
        uid = job_uid or self.job["metadata"]["uid"]
        return self.cluster.put_pod(master_pod(self.name, uid, message, exit_code))

    def reconcile(self) -> dict:
        """One pass; returns the status patch and applies it (as kopf would)."""
        import kopf
        from atlas_operator.status_update import status_update

        result = self.reconciler.reconcile({**copy.deepcopy(self.body), "status": self.status}, kopf.adopt)
        patch, events = status_update(self.status, None, result, "2026-01-01T00:00:00Z")
        self.events += events
        self.status = merge_patch(self.status, patch)
        return patch

    def pod_reads(self) -> int:
        return len(self.cluster.operator_calls("get", "pods", f"{self.name}-master-0"))
