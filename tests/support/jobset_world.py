"""What the JobSet world writes, set by hand (no controller runs; the real ones run in tests/kube/test_runs.py): the
JobSet v0.12.0 controller's status (conditions, restarts, replicatedJobsStatus), the finished trainer pods the Job
controller and the kubelet leave, a checkpoint PVC, and on the Kubeflow Trainer's side its runtime, the JobSet it
makes of a TrainJob and the TrainJob's status; on a ``tests.support.operator_cluster.Cluster``."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import kubernetes

from harness.kube_emulator import JOBSETS
from harness.manifests import NS
from harness.polling import wait_for
from tests.support.operator_cluster import TIMEOUT

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_KEY = "jobset.sigs.k8s.io/"


def condition(type_: str, status: bool, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Condition as the JobSet controller writes it."""
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def set_jobset_status(
    cluster,
    name: str,
    jobs: dict[str, dict[str, int]] | None = None,
    conditions: list[dict[str, Any]] = (),
    restarts: int = 0,
    terminal: str | None = None,
) -> None:
    """The JobSet controller's one status write per reconcile: ``restarts`` (always present), the conditions, one
    replicatedJobsStatus entry with every count for each spec replicated job (``jobs`` gives the non-zero
    counts), ``terminalState`` once finished."""
    js = cluster.emu.get(JOBSETS, NS, name)
    statuses = [
        {"name": rjob["name"], "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        | (jobs or {}).get(rjob["name"], {})
        for rjob in js["spec"]["replicatedJobs"]
    ]
    status: dict[str, Any] = {
        "restarts": restarts,
        "restartsCountTowardsMax": restarts or None,
        "replicatedJobsStatus": statuses,
        "conditions": list(conditions),
        "terminalState": terminal,
    }
    cluster.custom.patch_namespaced_custom_object_status(
        JOBSET_GROUP, JOBSET_VERSION, NS, "jobsets", name, {"status": status}
    )


SERVERS_READY = {"rollout": {"ready": 1, "active": 1}, "student": {"ready": 1, "active": 1}}
TRAINER_RUNNING = {**SERVERS_READY, "trainer": {"active": 1}}


def wait_jobset(cluster, name: str, other_than: str | None = None) -> dict[str, Any]:
    """The JobSet ``name`` once it exists (and, with ``other_than``, is not the object of that uid)."""
    return wait_for(
        lambda: (js := cluster.emu.get(JOBSETS, NS, name)) is not None and js["metadata"]["uid"] != other_than and js,
        timeout=TIMEOUT,
        what=f"JobSet {name}" + (" recreated" if other_than else ""),
    )


def ensure_pvc(cluster, name: str) -> None:
    if cluster.emu.get("v1/persistentvolumeclaims", NS, name) is None:
        kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_persistent_volume_claim(
            NS,
            {
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )


def trainer_pod(cluster, js: dict[str, Any], index: int, attempt: int, message: str | None, uid: str = "") -> str:
    """A finished trainer pod as the JobSet, Job and kubelet controllers leave it: Job ``<js>-trainer-0`` (or, in a
    Kubeflow Trainer's JobSet, ``<js>-node-0``; attempt
    ``attempt``) owns it, named ``<js>-trainer-0-<index>-<random>``, with the JobSet's labels and annotations
    (``uid`` stands in for an earlier JobSet of the same name), the Job controller's, and its ``trainer`` container
    terminated with ``message``. Returns the pod's name."""
    name = js["metadata"]["name"]
    rjobs = js["spec"]["replicatedJobs"]
    trainer = next(r for r in rjobs if r["name"] in ("trainer", "node"))  # ours, or the Kubeflow Trainer's
    job_name = f"{name}-{trainer['name']}-0"
    job_uid = secrets.token_hex(16)
    container_name = trainer["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
    jobset = {
        "jobset-name": name,
        "jobset-uid": uid or js["metadata"]["uid"],
        "replicatedjob-name": trainer["name"],
        "restart-attempt": str(attempt),
        "replicatedjob-replicas": "1",
        "global-replicas": str(sum(r.get("replicas", 1) for r in rjobs)),
        "job-index": "0",
        "job-key": hashlib.sha1(f"{NS}/{job_name}".encode()).hexdigest(),
        "job-global-index": str(sum(r.get("replicas", 1) for r in rjobs[:-1])),
        "group-name": "default",
        "group-replicas": str(sum(r.get("replicas", 1) for r in rjobs)),
        "job-group-index": str(len(rjobs) - 1),
    }
    jobset = {JOBSET_KEY + key: value for key, value in jobset.items()}
    template = trainer["template"]["spec"]["template"]
    labels = {
        **(template.get("metadata") or {}).get("labels", {}),
        **jobset,
        "batch.kubernetes.io/job-name": job_name,
        "job-name": job_name,
        "batch.kubernetes.io/controller-uid": job_uid,
        "controller-uid": job_uid,
        COMPLETION_INDEX: str(index),
        "jobset.sigs.k8s.io/priority": "0",
    }
    annotations = {**(template.get("metadata") or {}).get("annotations", {}), **jobset, COMPLETION_INDEX: str(index)}
    pod_name = f"{job_name}-{index}-{secrets.token_hex(3)[:5]}"
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid}
    core.create_namespaced_pod(
        NS,
        {
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": {
                "containers": [{"name": container_name, "image": template["spec"]["containers"][0]["image"]}],
                "restartPolicy": "Never",
                "hostname": f"{job_name}-{index}",
                "subdomain": name,
            },
        },
    )
    terminated: dict[str, Any] = {"exitCode": 0, "reason": "Completed"}
    if message is not None:
        terminated["message"] = message
    container = {"name": container_name, "image": "", "imageID": "", "ready": False, "restartCount": 0}
    core.patch_namespaced_pod_status(
        pod_name,
        NS,
        {"status": {"phase": "Succeeded", "containerStatuses": [{**container, "state": {"terminated": terminated}}]}},
        _content_type="application/merge-patch+json",
    )
    return pod_name


# ------------------------------------------------------------------ the Kubeflow Trainer's side, by hand


def install_trainjob_runtime(cluster, max_restarts: int = 3) -> dict[str, Any]:
    """The chart's ClusterTrainingRuntime (atlas_operator.backends.trainjob), as `helm install` puts it."""
    from atlas_operator.backends.trainjob import training_runtime
    from atlas_operator.config import Images

    from atlas_contract.names import TRAINJOB_RUNTIME

    runtime = training_runtime(TRAINJOB_RUNTIME, Images().trainer, max_restarts)
    return cluster.custom.create_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", runtime
    )


def create_trainer_jobset(cluster, trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet the Kubeflow Trainer makes of ``trainjob``, written by hand as the operator reads it (the real
    Trainer builds it in tests/kube/test_runs.py): named as the TrainJob, controlled by it, with the labels of the
    TrainJob's runtime patches (the run's, which the operator's watch selects), its spec the ``runtime``'s JobSet
    template as it stands."""
    import copy

    meta = trainjob["metadata"]
    labels: dict[str, str] = {}
    for patch in trainjob["spec"].get("runtimePatches") or []:
        labels |= ((patch["trainingRuntimeSpec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
    owner = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    jobset = {
        "apiVersion": f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {"name": meta["name"], "labels": labels, "ownerReferences": [owner]},
        "spec": copy.deepcopy(runtime["spec"]["template"]["spec"]),
    }
    return cluster.custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, NS, "jobsets", jobset)


def set_trainjob_status(
    cluster, name: str, conditions: list[dict[str, Any]] = (), jobs: dict[str, dict[str, int]] | None = None
) -> None:
    """The Trainer's status write of TrainJob ``name``, by hand: its conditions (Suspended, Complete, Failed) and a
    jobsStatus entry with every count for each job in ``jobs``."""
    status: dict[str, Any] = {"conditions": list(conditions)}
    if jobs is not None:
        counts = {"ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        status["jobsStatus"] = [{"name": job, **counts, **given} for job, given in jobs.items()]
    cluster.custom.patch_namespaced_custom_object_status(
        "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", name, {"status": status}
    )
