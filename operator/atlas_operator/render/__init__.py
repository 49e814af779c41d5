"""Pure functions from a parsed run to the Kubernetes objects the operator owns.

No API calls here: ``render_children(run, images)`` returns plain dicts in the order they are
applied (ConfigMap, Services, then the backend's workload last so its pods find everything they
mount and call: server Deployments and the PyTorchJob, or one JobSet). ``atlas render`` prints
exactly these.

One module per object family: ``children`` (every child in apply order, their names), ``config_map`` (the ConfigMap:
run.yaml, accelerate.yaml, reward.yaml), ``trainer`` (the trainer's pod), ``pytorchjob``, ``jobset``, ``trainjob``,
``servers`` (vLLM), ``network`` (NetworkPolicies), ``common`` (labels, placement, security). Settings types
(``Images``, ``NetworkSettings``) are the operator's, in atlas_operator/config.py.
"""

from atlas_operator.config import Images, NetworkSettings
from atlas_operator.render.children import child_names, render_children
from atlas_operator.render.common import COMPLETION_INDEX_KEY, has_student_server, on_jobset, trainer_container
from atlas_operator.render.config_map import checkpoint_warning, config_map, run_config
from atlas_operator.render.jobset import jobset
from atlas_operator.render.network import network_policies
from atlas_operator.render.pytorchjob import pytorch_job
from atlas_operator.render.servers import (
    best_effort_warning,
    metrics_service,
    rollout_deployment,
    rollout_pod_template,
    rollout_server_command,
    student_deployment,
)
from atlas_operator.render.trainer import job_spec_hash, launch_command, trainer_pod_template

__all__ = [
    "COMPLETION_INDEX_KEY",
    "Images",
    "NetworkSettings",
    "best_effort_warning",
    "checkpoint_warning",
    "child_names",
    "config_map",
    "has_student_server",
    "job_spec_hash",
    "jobset",
    "launch_command",
    "metrics_service",
    "network_policies",
    "on_jobset",
    "pytorch_job",
    "render_children",
    "rollout_deployment",
    "rollout_pod_template",
    "rollout_server_command",
    "run_config",
    "student_deployment",
    "trainer_container",
    "trainer_pod_template",
]
