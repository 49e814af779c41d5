"""Pure functions from a parsed run to the backend-neutral pieces of the Kubernetes objects the operator owns.

No API calls here, and no backend: a backend (atlas_operator/backends/) builds its job from these pieces, and
atlas_operator/manifests.py puts every child of a run together in apply order (what ``atlas render`` prints).

One module per object family: ``config_map`` (the ConfigMap: run.yaml, accelerate.yaml, reward.yaml), ``trainer``
(the trainer's pod, whatever job runs it), ``servers`` (vLLM), ``network`` (NetworkPolicies), ``sources`` (models and
datasets fetched or mounted), ``tracking`` (experiment tracking), ``metadata`` (names and labels), ``pod_spec``
(placement, security, resources) and ``quantities`` (Kubernetes quantities, QoS). Settings types (``Images``,
``NetworkSettings``) are the operator's, in atlas_operator/config.py.
"""

from atlas_operator.config import Images, NetworkSettings
from atlas_operator.render.config_map import config_map, run_config
from atlas_operator.render.metadata import has_student_server
from atlas_operator.render.network import network_policies
from atlas_operator.render.servers import (
    best_effort_warning,
    metrics_service,
    rollout_deployment,
    rollout_pod_template,
    rollout_server_command,
    student_deployment,
)
from atlas_operator.render.trainer import TrainerShape, job_spec_hash, launch_command, trainer_pod_template

__all__ = [
    "Images",
    "NetworkSettings",
    "TrainerShape",
    "best_effort_warning",
    "config_map",
    "has_student_server",
    "job_spec_hash",
    "launch_command",
    "metrics_service",
    "network_policies",
    "rollout_deployment",
    "rollout_pod_template",
    "rollout_server_command",
    "run_config",
    "student_deployment",
    "trainer_pod_template",
]
