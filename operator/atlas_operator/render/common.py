"""What every rendered object shares: labels, selectors, placement, resources and the restricted security context."""

from __future__ import annotations

import re
from decimal import Decimal
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


_QUANTITY_SUFFIX = {
    "": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?")


def quantity(text: str) -> Decimal:
    """A Kubernetes quantity (``32``, ``500m``, ``16Gi``, ``1.5e3``: the spec's QUANTITY_PATTERN) as a number."""
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Decimal(10) ** int(suffix[1:])
    return number * _QUANTITY_SUFFIX[suffix]


def byte_quantity(amount: Decimal) -> str:
    """Bytes as the shortest exact quantity: ``66Gi``, ``1536Mi``, else whole bytes."""
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if whole and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)


def qos_class(pod_spec: dict[str, Any]) -> str:
    """The QoS class Kubernetes gives a pod of this spec (its ``status.qosClass``: ``ComputePodQOS``, over the
    containers and init containers, CPU and memory only, a zero counting as unset): BestEffort when none requests or
    limits either, Guaranteed when every one limits both and the totals of the requests equal the limits', else
    Burstable."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in [*pod_spec.get("initContainers", []), *pod_spec.get("containers", [])]:
        resources = container.get("resources") or {}
        # The API server defaults a request that is not set to its limit.
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for totals, amounts in ((requests, asked), (limits, resources.get("limits") or {})):
            for name in ("cpu", "memory"):
                amount = quantity(str(amounts[name])) if name in amounts else Decimal(0)
                if amount > 0:
                    totals[name] = totals.get(name, Decimal(0)) + amount
                elif totals is limits:
                    guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


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
