"""The TrainJob backend (Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1): the run's TrainJob, and the
ClusterTrainingRuntime it names, which the Helm chart installs (``python -m atlas_operator.generate``).

The Trainer controller builds one JobSet from the two (atlas_contract/names.py, "TrainJob backend"): the
runtime holds what is the same for every run (the trainer's ``node`` job: one pod per node, none retried by the
Job controller, the step watchdog's exit code, the container's fixed ports, termination message and no API token;
the restart policy of the gang), the TrainJob what is the run's: ``trainer`` (image, launch command, environment,
nodes, processes and resources per node) and one ``runtimePatches`` entry (the pods' labels, volumes and mounts,
security contexts, placement, pull secrets, service account).

The vLLM servers run beside the TrainJob, as Deployments with their Services, as on the PyTorchJob backend: a
runtime's replicated jobs are the same for every run, and a runtime patch can set neither a container's image,
command, arguments or resources nor a job's replicas (Trainer v2.3.0 ``ContainerPatch``: env, volumeMounts,
securityContext), so a server inside the runtime could not serve the run's model on the run's GPUs.
"""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    QUEUE_NAME_LABEL,
    SPEC_HASH_ANNOTATION,
    TERMINATION_MESSAGE_PATH,
    TRAINER_METRICS_PORT,
    TRAINJOB_ANCESTOR_LABEL,
    TRAINJOB_PATCH_MANAGER,
    TRAINJOB_RUNTIME,
    TRAINJOB_TRAINER_CONTAINER,
    TRAINJOB_TRAINER_JOB,
    ChildNames,
)
from atlas_operator.config import Images
from atlas_operator.render.common import CONTAINER_SECURITY, child_metadata, labels
from atlas_operator.render.jobset import job_failure_policy, pod_failure_policy
from atlas_operator.render.trainer import configured_trainer_template, job_spec_hash
from atlas_operator.spec import Run

TRAINER_API_VERSION = "trainer.kubeflow.org/v1alpha1"

#: The pod-spec fields a Trainer v2.3.0 runtime patch may set (``PodSpecPatch``); the rest of the trainer's pod
#: template is the runtime's (automountServiceAccountToken, restartPolicy).
PATCHABLE_POD_FIELDS = (
    "serviceAccountName",
    "volumes",
    "initContainers",
    "containers",
    "imagePullSecrets",
    "securityContext",
    "nodeSelector",
    "affinity",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


def trainjob(
    run: Run, images: Images, config: dict[str, Any] | None = None, runtime: str = TRAINJOB_RUNTIME
) -> dict[str, Any]:
    """The run's TrainJob: ``runtime`` (a ClusterTrainingRuntime), the trainer, and the run's pod patch."""
    spec = run.spec
    pod = configured_trainer_template(run, images, config)
    (container,) = pod["spec"]["containers"]
    trainer: dict[str, Any] = {
        "image": container["image"],
        "command": container["command"],
        "env": container["env"],
        "numNodes": spec.resources.nodes,
        "numProcPerNode": spec.resources.processes(),
    }
    if container.get("resources"):
        trainer["resourcesPerNode"] = container["resources"]
    pod_patch = {k: v for k, v in pod["spec"].items() if k in PATCHABLE_POD_FIELDS and k != "containers"}
    pod_patch["containers"] = [
        {
            "name": TRAINJOB_TRAINER_CONTAINER,
            "volumeMounts": container["volumeMounts"],
            "securityContext": container["securityContext"],
        }
    ]
    job_patch = {"name": TRAINJOB_TRAINER_JOB, "template": {"spec": {"template": {**pod, "spec": pod_patch}}}}
    job = {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainJob",
        "metadata": child_metadata(run, ChildNames(run.name).job, "trainer"),
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
            "trainer": trainer,
            "runtimePatches": [
                {
                    "manager": TRAINJOB_PATCH_MANAGER,
                    # Our labels on the JobSet too (the Trainer copies none of the TrainJob's): the operator's watch
                    # sees it, and reads its restarts and replicated jobs as the run's.
                    "trainingRuntimeSpec": {
                        "template": {
                            "metadata": {"labels": labels(run, "trainer")},
                            "spec": {"replicatedJobs": [job_patch]},
                        }
                    },
                }
            ],
            # With a queue, Kueue owns suspend: the TrainJob is created suspended and only Kueue resumes it.
            "suspend": spec.suspend or bool(spec.queue_name),
        },
    }
    if spec.queue_name:  # Kueue reads its queue from the TrainJob (the Trainer copies no label to the JobSet)
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job


def training_runtime(name: str, image: str, max_restarts: int) -> dict[str, Any]:
    """The ClusterTrainingRuntime every TrainJob run names: what the trainer's pods share whatever the run.

    ``node``: one Indexed Job of a pod per node (the Trainer sets parallelism and completions from
    trainer.numNodes), restartPolicy Never and backoffLimit 0, so a failed pod fails its Job and the JobSet's
    failurePolicy restarts the gang, at most ``max_restarts`` times (a runtime's, not a run's: spec.maxRestarts
    cannot apply); a trainer the step watchdog ended fails its Job with reason PodFailurePolicy, which the
    failurePolicy names (as on the JobSet backend). The container's image is the default for a TrainJob that
    names none (ours always names one)."""
    container = {
        "name": TRAINJOB_TRAINER_CONTAINER,
        "image": image,
        "ports": [{"name": "metrics", "containerPort": TRAINER_METRICS_PORT, "protocol": "TCP"}],
        "securityContext": dict(CONTAINER_SECURITY),
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    node_job = {
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": pod_failure_policy(TRAINJOB_TRAINER_CONTAINER),
        "template": {
            "spec": {
                "restartPolicy": "Never",
                # No API token in pods that never call the API; a runtime patch cannot set this, so it lives here.
                "automountServiceAccountToken": False,
                "containers": [container],
            }
        },
    }
    return {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All", "targetReplicatedJobs": [TRAINJOB_TRAINER_JOB]},
                    "failurePolicy": job_failure_policy(max_restarts, TRAINJOB_TRAINER_JOB),
                    "replicatedJobs": [
                        {
                            "name": TRAINJOB_TRAINER_JOB,
                            "replicas": 1,
                            "template": {
                                # the job the Trainer fills from a TrainJob's trainer
                                "metadata": {"labels": {TRAINJOB_ANCESTOR_LABEL: "trainer"}},
                                "spec": node_job,
                            },
                        }
                    ],
                }
            },
        },
    }
