"""Which changes of a child its run's status depends on: the rest (the bookkeeping of the controllers that run the
child) reconciles nothing.

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
