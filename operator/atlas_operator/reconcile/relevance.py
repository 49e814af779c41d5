"""Which changes of a child its run's status depends on: the rest (the bookkeeping of the controllers that run the
child) reconciles nothing. And which changes of a run are someone's (``run_changed``), not the echo of a status write.

On a real cluster the deployment controller writes a new server Deployment's status two or three times in its first
second (observedGeneration, replicas, conditions) before any replica is ready. Each was a refresh of the run: its
read from the API server, a whole reconciliation, sometimes a status write — more than the run's own creation cost
(bench/operator_throughput.py, real API). A run's status reads one field of a Deployment's status (its ready
replicas: ``Observation.rollout_condition`` in reconcile/observe.py); a change of anything else there, or of the
revision annotation the deployment controller keeps, is not news. Every
other change of a child still is: its spec, labels, owners or deletion (drift, or someone else's hand), and all of a
job's status (the training's phase, restarts, preemption: reconcile/job_policies.py and reconcile/reconciler.py).
"""

from __future__ import annotations

from typing import Any

from atlas_operator import kube
from atlas_operator.kube import Resource

# Per resource, the status fields a run's status is derived from; a resource not named here: all of its status.
READ_STATUS: dict[Resource, tuple[str, ...]] = {kube.DEPLOYMENT: ("readyReplicas",)}
# Written by the API server on every change: never news by themselves.
BOOKKEEPING = ("resourceVersion", "managedFields", "generation")
# Annotations a controller keeps on the child (the Deployment's rollout revision): the operator renders none of them.
CONTROLLER_ANNOTATIONS = ("deployment.kubernetes.io/revision",)


def matters(resource: Resource, before: dict[str, Any] | None, after: dict[str, Any]) -> bool:
    """Whether ``after`` (a watch event's object) differs from ``before`` (the held copy; None: not held) in
    anything the run's status is derived from."""
    if before is None or resource not in READ_STATUS:
        return True
    return _relevant(resource, before) != _relevant(resource, after)


def _relevant(resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in BOOKKEEPING}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in CONTROLLER_ANNOTATIONS}
    meta["annotations"] = annotations
    status = obj.get("status") or {}
    read = {field: status.get(field) for field in READ_STATUS[resource]}
    return {"metadata": meta, "spec": obj.get("spec"), "status": read}


# A run's fields whose change is someone's: its spec (generation), labels and annotations (copied to its children),
# its deletion and finalizers. The rest of a run's changes are the echoes of status writes.
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"  # kubectl's copy of the spec: the spec says it


def run_changed(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a run changed (``before`` → ``after``) in anything but its status: a reconciliation is due."""
    return _run_essence(before) != _run_essence(after)


def _run_essence(run: dict[str, Any]) -> tuple[Any, ...]:
    meta = run.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("labels") or {},
        annotations,
        meta.get("deletionTimestamp"),
        meta.get("finalizers") or [],
    )
