"""Every child of a run, in the order they are applied (what ``atlas render`` prints), and their names in
status.children: the backend-neutral pieces (atlas_operator/render/) around the run's backend's job
(atlas_operator/backends/)."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    VLLM_PORT,
    WEIGHT_SYNC_PORT,
    ChildNames,
)
from atlas_operator import backends
from atlas_operator.config import Images, NetworkSettings
from atlas_operator.render.config_map import config_map
from atlas_operator.render.metadata import has_student_server
from atlas_operator.render.network import network_policies
from atlas_operator.render.servers import metrics_service, rollout_deployment, service, student_deployment
from atlas_operator.spec import Run


def child_names(run: Run, network: bool = True) -> dict[str, str]:
    """status.children: the names of what the run owns (rollout/student only when they exist, the NetworkPolicies
    when ``network``)."""
    backend = backends.for_run(run)
    owned = ChildNames(run.name)
    policies = (
        {"networkPolicy": owned.network_policy, "trainerNetworkPolicy": owned.trainer_network_policy} if network else {}
    )
    names = {backend.child_key: owned.job, "configMap": owned.config_map, "metricsService": owned.metrics, **policies}
    if backend.servers_in_job:  # the servers are part of the job, not objects of their own
        return names
    if run.spec.rollout.replicas:
        names["rollout"] = owned.rollout
    if has_student_server(run):
        names["student"] = owned.student
    return names


def render_children(
    run: Run, images: Images | None = None, reward_yaml: str | None = None, network: NetworkSettings | None = None
) -> list[dict[str, Any]]:
    """Every child of ``run``, in apply order: the NetworkPolicies first, so no pod of the run is ever unprotected;
    the job last, so its pods find everything they mount and call."""
    backend = backends.for_run(run)
    images = images or Images()
    config = config_map(run, reward_yaml, images.trainer, server_hostnames=backend.servers_in_job)
    children = [*network_policies(run, network or NetworkSettings()), config]
    servers = not backend.servers_in_job
    owned = ChildNames(run.name)
    if servers and run.spec.rollout.replicas:
        children.append(
            service(run, owned.rollout, "rollout", [("http", VLLM_PORT), ("weight-sync", WEIGHT_SYNC_PORT)])
        )
    if servers and has_student_server(run):
        children.append(service(run, owned.student, "student", [("http", VLLM_PORT)]))
    children.append(metrics_service(run, dict(backend.rank0_labels)))
    if servers and run.spec.rollout.replicas:
        children.append(rollout_deployment(run, images))
    if servers and has_student_server(run):
        children.append(student_deployment(run, images))
    children.append(backend.render_job(run, images, config))
    return children
