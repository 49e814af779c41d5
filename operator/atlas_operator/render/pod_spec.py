"""What a pod of a run is made of beside its containers' own settings: resources, placement (service account, pull
secrets, node selector, tolerations), the restricted security context, and the paths and environment its pods share."""

from __future__ import annotations

from typing import Any

from atlas_operator.schema import camel
from atlas_operator.spec import Run, Toleration

REWARD_REF_DIR = "/etc/atlas-reward"  # a second ConfigMap volume cannot nest inside the first

CACHE_DIR = "/var/cache/atlas"

RUN_AS_USER = 65532  # the trainer image's `atlas` user (trainer_image/Dockerfile)

NCCL_ENV = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


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


def _toleration(toleration: Toleration) -> dict[str, Any]:
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
