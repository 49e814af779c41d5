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

from collections.abc import Callable
from typing import Any

from atlas_contract.names import (
    LABEL_INSTANCE,
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
from atlas_operator import kube
from atlas_operator.backends.jobset import (
    job_failure_policy,
    jobset_state,
    pod_failure_policy,
)
from atlas_operator.backends.protocol import CachedRead, CrdRequirement, JobBackend, JobState
from atlas_operator.backends.pytorchjob import MASTER_LABELS, master_pod
from atlas_operator.config import Images
from atlas_operator.kube import Kube
from atlas_operator.ownership import is_controlled_by
from atlas_operator.render.config_map import checkpoint_warning
from atlas_operator.render.metadata import child_metadata, labels
from atlas_operator.render.pod_spec import CONTAINER_SECURITY
from atlas_operator.render.trainer import TrainerShape, configured_trainer_template, job_spec_hash
from atlas_operator.run_status import EventReason
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
    pod = configured_trainer_template(run, images, config, TrainJobBackend.trainer)
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
    job: dict[str, Any] = {
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


RUNTIME_TEMPLATE = "charts/atlas-operator/templates/trainingruntime.yaml"
# Stand-ins for the chart's values in the rendered runtime, replaced by their Helm expressions.
_RUNTIME_VALUES = {
    "atlas-runtime-name": "{{ .Values.trainJob.runtime.name }}",
    "atlas-runtime-image": '{{ include "atlas-operator.trainerImage" . }}',
    "987654321": "{{ .Values.trainJob.runtime.maxRestarts }}",
}


def training_runtime_template(dump: Callable[[dict[str, Any]], str]) -> str:
    """The chart's ClusterTrainingRuntime: :func:`training_runtime` with the chart's values,
    installed only where the Kubeflow Trainer's CRDs are served."""
    runtime = training_runtime("atlas-runtime-name", "atlas-runtime-image", max_restarts=987654321)
    runtime["metadata"]["labels"] = {"LABELS": None, **runtime["metadata"]["labels"]}
    body = dump(runtime)
    for stand_in, expression in _RUNTIME_VALUES.items():
        body = body.replace(stand_in, expression)
    body = body.replace("    LABELS: null\n", '    {{- include "atlas-operator.labels" . | nindent 4 }}\n')
    # The header still names the module's path before issue #60 (now atlas_operator/backends/trainjob.py), so that
    # the chart stays byte-identical through that move; the next change of the runtime updates it.
    return (
        "{{- /* Generated by `python -m atlas_operator.generate` from atlas_operator/render/trainjob.py: edit it "
        "there. */}}\n"
        "{{- if and .Values.trainJob.runtime.enabled (.Capabilities.APIVersions.Has "
        '"trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime") }}\n'
        f"{body}"
        "{{- end }}\n"
    )


def trainjob_state(job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
    """A TrainJob's: Complete, Failed and Suspended as the Trainer sets them (Complete and Failed in its JobSet's
    words); otherwise its JobSet's state (restarts, the trainer running), or its jobsStatus before there is one."""
    true = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in true:
        done = true["Complete"]
        return "Succeeded", done.get("reason") or "AllJobsCompleted", done.get("message") or "TrainJob completed"
    if "Failed" in true:
        failed = true["Failed"]
        return "Failed", failed.get("reason") or "FailedJobs", failed.get("message") or "TrainJob failed"
    if "Suspended" in true:
        return "Suspended", "Suspended", true["Suspended"].get("message") or "TrainJob is suspended"
    if gang is not None:
        return jobset_state(gang)
    node = {s.get("name"): s for s in (job.get("status") or {}).get("jobsStatus") or []}.get(TRAINJOB_TRAINER_JOB)
    if node and (node.get("active") or node.get("ready")):
        return "Running", "Running", "the trainer is running"
    return "Pending", "JobPending", "waiting for the TrainJob to start"


def runtime_problem(run: Run, images: Images, read: CachedRead) -> tuple[EventReason, str] | None:
    """What keeps a TrainJob run off its ClusterTrainingRuntime: the runtime missing, or a spec.maxRestarts the
    runtime does not have (a TrainJob cannot set its JobSet's failurePolicy: the runtime's applies)."""
    name = images.trainjob_runtime
    runtime = read(kube.CLUSTER_TRAINING_RUNTIME, name)
    if runtime is None:
        return EventReason.TRAINING_RUNTIME_MISSING, (
            f"the cluster has no ClusterTrainingRuntime {name} (spec.backend TrainJob): install it with the chart "
            "(value trainJob.runtime.enabled: true), or point the operator at yours (ATLAS_TRAINJOB_RUNTIME)"
        )
    policy = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("failurePolicy") or {}
    restarts = int(policy.get("maxRestarts") or 0)
    if run.spec.max_restarts != restarts:
        return EventReason.MAX_RESTARTS_NOT_THE_RUNTIMES, (
            f"spec.maxRestarts: {run.spec.max_restarts}, but on backend TrainJob whole-gang restarts are the "
            f"ClusterTrainingRuntime {name}'s (template.spec.failurePolicy.maxRestarts: {restarts}; chart value "
            f"trainJob.runtime.maxRestarts): set spec.maxRestarts: {restarts}, or use another backend"
        )
    return None


class TrainJobBackend(JobBackend):
    kind = "TrainJob"
    resource = kube.TRAINJOB
    child_key = "trainJob"
    # The JobSet the Kubeflow Trainer makes of the TrainJob carries the run's labels (its runtime patch): watched too.
    watched = (kube.TRAINJOB, kube.JOBSET)
    reads = (kube.CLUSTER_TRAINING_RUNTIME,)
    crd = CrdRequirement(
        EventReason.TRAINJOB_CRD_MISSING,
        "trainer.kubeflow.org/v1alpha1 TrainJob CRD",
        "install Kubeflow Trainer v2.3.0 or later (kubectl apply --server-side -k "
        '"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"), or set another spec.backend',
    )
    # The Trainer's torch plugin injects the topology (the master as PET_MASTER_ADDR and PET_MASTER_PORT) and adds
    # its own rendezvous port (TRAINJOB_MASTER_PORT).
    trainer = TrainerShape(container=TRAINJOB_TRAINER_CONTAINER, master_env="PET_MASTER")
    rank0_labels = MASTER_LABELS

    def render_job(self, run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
        # The servers run beside the TrainJob, as on PyTorchJob (the module's docstring says why).
        return trainjob(run, images, config, runtime=images.trainjob_runtime)

    def checkpoint_warning(self, run: Run) -> str | None:
        return checkpoint_warning(run, restart_replaces_pods=False)

    def prerequisite_problem(self, run: Run, images: Images, read: CachedRead) -> tuple[EventReason, str] | None:
        return runtime_problem(run, images, read)

    def state(self, job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
        return trainjob_state(job, gang)

    def read_gang(self, client: Kube, namespace: str, job: dict[str, Any]) -> dict[str, Any] | None:
        """The JobSet the Kubeflow Trainer made of the TrainJob (its name; controlled by the TrainJob), read only:
        its restarts and replicated jobs are the run's too. None before it exists."""
        gang = client.get(kube.JOBSET, namespace, job["metadata"]["name"])
        return gang if gang is not None and is_controlled_by(gang, job) else None

    def restarting_gang(self, job: dict[str, Any], gang: dict[str, Any] | None) -> dict[str, Any] | None:
        return gang

    def generated_files(self, dump: Callable[[dict[str, Any]], str]) -> dict[str, str]:
        return {RUNTIME_TEMPLATE: training_runtime_template(dump)}

    def rank0_pod(self, client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        """The master pod by name; once the Trainer's JobSet exists the result is read from it (the JobSet
        backend's rank-0 pod: the run's gang is a JobSet)."""
        return master_pod(client, run, job)

    def run_name_of(self, obj: dict[str, Any]) -> str | None:
        """The run of the JobSet the Kubeflow Trainer made of its TrainJob: controlled by a TrainJob, labelled with
        the run's name (through the TrainJob's runtime patch)."""
        meta = obj.get("metadata") or {}
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        run_name = (meta.get("labels") or {}).get(LABEL_INSTANCE)
        if obj.get("kind") != kube.JOBSET.kind or not run_name or not refs or refs[0].get("kind") != self.kind:
            return None
        return str(run_name)


TRAINJOB = TrainJobBackend()
