"""What every rendered object shares: labels, selectors, placement, resources and the restricted security context."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    JOBSET_TRAINER_CONTAINER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
    QUEUE_NAME_LABEL,
    TRAINJOB_TRAINER_CONTAINER,
)
from atlas_operator.schema import camel
from atlas_operator.spec import AtlasTeacherSpec, Run

REWARD_REF_DIR = "/etc/atlas-reward"  # a second ConfigMap volume cannot nest inside the first

CACHE_DIR = "/var/cache/atlas"

RUN_AS_USER = 65532  # the trainer image's `atlas` user (trainer_image/Dockerfile)

NCCL_ENV = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}

TRAINER_CONTAINER = "pytorch"  # the name Kubeflow's PyTorchJob controller looks for

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"

# Set by the Job controller on each pod of an Indexed Job (label and annotation): the JobSet trainer's node rank.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"


def has_student_server(run: Run) -> bool:
    return isinstance(run.spec, AtlasTeacherSpec) and bool(run.spec.student and run.spec.student.rollout.replicas)


def on_jobset(run: Run) -> bool:
    return run.backend == "JobSet"


def on_trainjob(run: Run) -> bool:
    return run.backend == "TrainJob"


def trainer_container(run: Run) -> str:
    """The trainer container's name: the one Kubeflow's PyTorchJob or TrainJob controller requires, or ``trainer``
    in a JobSet."""
    if on_trainjob(run):
        return TRAINJOB_TRAINER_CONTAINER
    return JOBSET_TRAINER_CONTAINER if on_jobset(run) else TRAINER_CONTAINER


def labels(run: Run, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "atlas",
        LABEL_INSTANCE: run.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def with_queue_label(run: Run, pod_labels: dict[str, str]) -> dict[str, str]:
    """Server pods of a queued PyTorchJob run: Kueue admits each pod on its own (not with the job's gang)."""
    if run.spec.queue_name:
        pod_labels[QUEUE_NAME_LABEL] = run.spec.queue_name
    return pod_labels


def pod_selector(run: Run, component: str) -> dict[str, str]:
    return {LABEL_INSTANCE: run.name, LABEL_COMPONENT: component}


def child_metadata(run: Run, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": run.namespace, "labels": labels(run, component)}


def container_resources(gpus: int, cpu: str | None, memory: str | None) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if cpu:
        amounts["cpu"] = cpu
    if memory:
        amounts["memory"] = memory
    limits = dict(amounts)
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    resources: dict[str, Any] = {}
    if amounts:
        resources["requests"] = amounts
    if limits:
        resources["limits"] = limits
    return resources


def pod_placement(run: Run) -> dict[str, Any]:
    spec = run.spec
    # No API token in pods that never call the API (they run third-party model code), unless asked for.
    placement: dict[str, Any] = {"automountServiceAccountToken": spec.automount_service_account_token}
    if spec.service_account_name:
        placement["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        placement["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if spec.resources.node_selector:
        placement["nodeSelector"] = dict(spec.resources.node_selector)
    if spec.resources.tolerations:
        placement["tolerations"] = [_toleration(t) for t in spec.resources.tolerations]
    return placement


def _toleration(toleration) -> dict[str, Any]:
    return {camel(k): v for k, v in vars(toleration).items() if v is not None}


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
