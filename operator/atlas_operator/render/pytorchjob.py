"""The PyTorchJob backend's job (kubeflow.org/v1): Master and Workers of the trainer."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    QUEUE_NAME_LABEL,
    SPEC_HASH_ANNOTATION,
)
from atlas_operator.config import Images
from atlas_operator.render.common import child_metadata
from atlas_operator.render.trainer import configured_trainer_template, job_spec_hash
from atlas_operator.spec import Run


def pytorch_job(run: Run, images: Images, config: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = run.spec
    template = configured_trainer_template(run, images, config)
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
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": child_metadata(run, run.name, "trainer"),
        "spec": job_spec,
    }
    if spec.queue_name:
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job
