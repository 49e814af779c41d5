"""Every child of a run, in the order they are applied, and their names in status.children."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    VLLM_PORT,
    WEIGHT_SYNC_PORT,
    ChildNames,
)
from atlas_operator.config import Images, NetworkSettings
from atlas_operator.render.common import has_student_server, on_jobset, on_trainjob
from atlas_operator.render.config_map import config_map
from atlas_operator.render.jobset import jobset
from atlas_operator.render.network import network_policies
from atlas_operator.render.pytorchjob import pytorch_job
from atlas_operator.render.servers import metrics_service, rollout_deployment, service, student_deployment
from atlas_operator.render.trainjob import trainjob
from atlas_operator.spec import Run


def child_names(run: Run, network: bool = True) -> dict[str, str]:
    """status.children: the names of what the run owns (rollout/student only when they exist, the NetworkPolicies
    when ``network``)."""
    owned = ChildNames(run.name)
    policies = (
        {"networkPolicy": owned.network_policy, "trainerNetworkPolicy": owned.trainer_network_policy} if network else {}
    )
    if on_jobset(run):  # the servers are replicated jobs of the JobSet, not objects of their own
        return {"jobSet": owned.jobset, "configMap": owned.config_map, "metricsService": owned.metrics, **policies}
    job = "trainJob" if on_trainjob(run) else "pytorchJob"
    names = {job: owned.job, "configMap": owned.config_map, "metricsService": owned.metrics, **policies}
    if run.spec.rollout.replicas:
        names["rollout"] = owned.rollout
    if has_student_server(run):
        names["student"] = owned.student
    return names


def render_children(
    run: Run, images: Images | None = None, reward_yaml: str | None = None, network: NetworkSettings | None = None
) -> list[dict[str, Any]]:
    """Every child of ``run``, in apply order: the NetworkPolicies first, so no pod of the run is ever unprotected."""
    images = images or Images()
    config = config_map(run, reward_yaml, images.trainer)
    policies = network_policies(run, network or NetworkSettings())
    if on_jobset(run):
        return [*policies, config, metrics_service(run), jobset(run, images, config)]
    owned = ChildNames(run.name)
    children = [*policies, config]
    if run.spec.rollout.replicas:
        children.append(
            service(run, owned.rollout, "rollout", [("http", VLLM_PORT), ("weight-sync", WEIGHT_SYNC_PORT)])
        )
    if has_student_server(run):
        children.append(service(run, owned.student, "student", [("http", VLLM_PORT)]))
    children.append(metrics_service(run))
    if run.spec.rollout.replicas:
        children.append(rollout_deployment(run, images))
    if has_student_server(run):
        children.append(student_deployment(run, images))
    if on_trainjob(run):  # the servers beside the TrainJob, as on PyTorchJob (atlas_operator/render/trainjob.py)
        children.append(trainjob(run, images, config, runtime=images.trainjob_runtime))
    else:
        children.append(pytorch_job(run, images, config))
    return children
