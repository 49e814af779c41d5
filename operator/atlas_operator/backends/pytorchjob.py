"""The PyTorchJob backend (Kubeflow Training Operator, kubeflow.org/v1): Master and Workers of the trainer, the vLLM
servers beside it as Deployments with their Services."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    QUEUE_NAME_LABEL,
    SPEC_HASH_ANNOTATION,
    ChildNames,
)
from atlas_operator import kube
from atlas_operator.backends.protocol import CrdRequirement, JobBackend, JobState
from atlas_operator.config import Images
from atlas_operator.kube import Kube
from atlas_operator.render.config_map import checkpoint_warning
from atlas_operator.render.metadata import child_metadata
from atlas_operator.render.trainer import TrainerShape, configured_trainer_template, job_spec_hash
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run

TRAINER_CONTAINER = "pytorch"  # the name Kubeflow's PyTorchJob controller looks for

# PyTorchJob condition type → run phase (Restarting counts as Running: the job is still at work).
JOB_PHASES = {
    "Created": "Pending",
    "Running": "Running",
    "Restarting": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Suspended": "Suspended",
}

# PyTorchJob condition types that only a job whose pods ran has: the Kubeflow Training Operator (v1.9) keeps its
# Running condition, set to False with reason PyTorchJobSuspended, when it suspends a running job, and a job Kueue
# never admitted has only Created and Suspended.
_RAN = ("Running", "Restarting")

# Kubeflow labels each pod with its replica type: rank 0 is the Master.
MASTER_LABELS = {"training.kubeflow.org/replica-type": "master"}


def pytorch_job(run: Run, images: Images, config: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = run.spec
    template = configured_trainer_template(run, images, config, PyTorchJobBackend.trainer)
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if spec.resources.nodes > 1:
        replicas["Worker"] = {"replicas": spec.resources.nodes - 1, "restartPolicy": "OnFailure", "template": template}
    job_spec = {
        "nprocPerNode": str(spec.resources.processes()),
        # With a queue, Kueue owns suspend: the job is created suspended and only Kueue resumes it.
        "runPolicy": {
            "cleanPodPolicy": "None",
            "backoffLimit": spec.max_restarts,
            "suspend": spec.suspend or bool(spec.queue_name),
        },
        "pytorchReplicaSpecs": replicas,
    }
    job: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": child_metadata(run, run.name, "trainer"),
        "spec": job_spec,
    }
    if spec.queue_name:
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job


def last_job_condition(job: dict[str, Any] | None) -> dict[str, Any] | None:
    """The PyTorchJob's newest condition whose status is True (Kubeflow appends them in order)."""
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True" and c.get("type") in JOB_PHASES]
    return true[-1] if true else None


def master_pod(client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's Master pod, by name (a pod of an earlier job of the same name is not it)."""
    pod = client.get(kube.POD, run.namespace, ChildNames(run.name).master_pod)
    return pod if pod is not None and made_by(pod, (job.get("metadata") or {}).get("uid")) else None


def made_by(pod: dict[str, Any], job_uid: str | None) -> bool:
    """Whether ``pod`` belongs to the job ``job_uid`` (its controller owner reference), not to an earlier job of
    the same name; a pod without a controller reference is taken as it is."""
    refs = [r for r in (pod.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")]
    return not refs or job_uid is None or any(r.get("uid") == job_uid for r in refs)


class PyTorchJobBackend(JobBackend):
    kind = "PyTorchJob"
    resource = kube.PYTORCH_JOB
    child_key = "pytorchJob"
    watched = (kube.PYTORCH_JOB,)
    crd = CrdRequirement(
        EventReason.PYTORCHJOB_CRD_MISSING,
        "kubeflow.org/v1 PyTorchJob CRD",
        "install the Kubeflow Training Operator v1 (kubectl apply --server-side -k "
        '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")',
    )
    trainer = TrainerShape(container=TRAINER_CONTAINER, rendezvous_port="pytorchjob-port")
    rank0_labels = MASTER_LABELS

    def render_job(self, run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
        return pytorch_job(run, images, config)

    def checkpoint_warning(self, run: Run) -> str | None:
        # A failed pod restarts in place (restartPolicy OnFailure) and keeps its emptyDir.
        return checkpoint_warning(run, restart_replaces_pods=False)

    def state(self, job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
        """The last condition, in its words."""
        last = last_job_condition(job)
        if last is None:
            return "Pending", "JobPending", "waiting for the PyTorchJob to start"
        return JOB_PHASES[last["type"]], last["type"], last.get("message") or f"PyTorchJob {last['type']}"

    def job_ran(self, job: dict[str, Any]) -> bool:
        """A Running or Restarting condition, of any status."""
        return any(c.get("type") in _RAN for c in (job.get("status") or {}).get("conditions") or [])

    def rank0_pod(self, client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        return master_pod(client, run, job)

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        return {"runPolicy": {"suspend": suspend}}


PYTORCHJOB = PyTorchJobBackend()
