"""The JobSet backend: the trainer and the servers as replicated jobs of one gang."""

from __future__ import annotations

import json
from typing import Any

from atlas_contract.names import (
    JOBSET_TRAINER_CONTAINER,
    QUEUE_NAME_LABEL,
    SPEC_HASH_ANNOTATION,
    STOP_EXIT_CODE,
    WATCHDOG_EXIT_CODE,
    ChildNames,
)
from atlas_operator.config import Images
from atlas_operator.render.common import JOBSET_API_VERSION, child_metadata, has_student_server
from atlas_operator.render.servers import rollout_pod_template, student_pod_template
from atlas_operator.render.trainer import configured_trainer_template, job_spec_hash
from atlas_operator.spec import Run
from atlas_operator.status_update import WATCHDOG_RESTART_RULE


def _one_pod_job(template: dict[str, Any], pods: int = 1) -> dict[str, Any]:
    """A replicated job's Job spec: ``pods`` pods (Indexed), none retried by the Job controller (restartPolicy
    Never, backoffLimit 0): a failed pod fails its Job at once, and the JobSet's failurePolicy restarts the
    whole gang. (The JobSet webhook would default restartPolicy to OnFailure: in-place restarts the JobSet
    never sees.)"""
    template = json.loads(json.dumps(template))
    template["spec"]["restartPolicy"] = "Never"
    return {
        "completionMode": "Indexed",
        "completions": pods,
        "parallelism": pods,
        "backoffLimit": 0,
        "template": template,
    }


def jobset(run: Run, images: Images, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run as one JobSet: replicated jobs ``rollout`` and (teacher) ``student``, one Job per server replica,
    then ``trainer`` (one Indexed Job, a pod per node), created once every server is Ready (``dependsOn``).
    The trainer's success completes the JobSet (its servers are then deleted); any pod's failure restarts
    every Job, up to spec.maxRestarts, and the trainer resumes from its newest checkpoint. With a queue,
    Kueue admits the whole set as one workload."""
    spec = run.spec
    servers = []
    if spec.rollout.replicas:
        servers.append(("rollout", spec.rollout.replicas, rollout_pod_template(run, images)))
    if has_student_server(run):
        servers.append(("student", spec.student.rollout.replicas, student_pod_template(run, images)))
    replicated = [
        {"name": name, "replicas": replicas, "template": {"spec": _one_pod_job(template)}}
        for name, replicas, template in servers
    ]
    replicated.append(_trainer_replicated_job(run, images, config, depends_on=[name for name, _, _ in servers]))
    job_spec = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
        "failurePolicy": job_failure_policy(spec.max_restarts),
        # With a queue, Kueue owns suspend: the JobSet is created suspended and only Kueue resumes it.
        "suspend": spec.suspend or bool(spec.queue_name),
        "replicatedJobs": replicated,
    }
    job = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": child_metadata(run, ChildNames(run.name).jobset, "trainer"),
        "spec": job_spec,
    }
    if spec.queue_name:  # on the JobSet only: Kueue makes the whole set one workload
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job


def _trainer_replicated_job(
    run: Run, images: Images, config: dict[str, Any] | None, depends_on: list[str]
) -> dict[str, Any]:
    """``trainer``: one Indexed Job, a pod per node, started once every server job is Ready."""
    trainer_job = _one_pod_job(configured_trainer_template(run, images, config), run.spec.resources.nodes)
    trainer_job["podFailurePolicy"] = pod_failure_policy(JOBSET_TRAINER_CONTAINER)
    trainer = {"name": "trainer", "replicas": 1, "template": {"spec": trainer_job}}
    if depends_on:
        trainer["dependsOn"] = [{"name": name, "status": "Ready"} for name in depends_on]
    return trainer


def pod_failure_policy(container: str) -> dict[str, Any]:
    """The trainer Job's (rules apply in order, the first that matches decides):

    - a trainer the step watchdog ended fails its Job with reason PodFailurePolicy, which the JobSet's
      WATCHDOG_RESTART_RULE names in its RestartingJobSet condition: the operator counts those restarts;
    - a trainer that stopped on SIGTERM (STOP_EXIT_CODE: the step in flight finished and saved) is a stop, not a
      failure: Ignore, so the Job recreates the pod without counting it toward backoffLimit (0: it would fail
      the Job and restart the gang), and the new pod resumes from that checkpoint;
    - a pod Kubernetes disrupted (condition DisruptionTarget: evicted by a drain, preempted, its node gone) is
      ignored the same way whatever its exit code: one killed before it could save resumes from the checkpoint
      before (Kubernetes' documented way to not count disruptions)."""
    watchdog_exit = {"containerName": container, "operator": "In", "values": [WATCHDOG_EXIT_CODE]}
    stop_exit = {"containerName": container, "operator": "In", "values": [STOP_EXIT_CODE]}
    return {
        "rules": [
            {"action": "FailJob", "onExitCodes": watchdog_exit},
            {"action": "Ignore", "onExitCodes": stop_exit},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }


def job_failure_policy(max_restarts: int, trainer_job: str = "trainer") -> dict[str, Any]:
    """Any failure restarts the whole gang (Recreate) up to ``max_restarts``; a watchdog restart is named."""
    return {
        "maxRestarts": max_restarts,
        "restartStrategy": "Recreate",
        # Any other failure: the default action, RestartJobSet, too (reason DefaultFailurePolicy).
        "rules": [
            {
                "name": WATCHDOG_RESTART_RULE,
                "action": "RestartJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "targetReplicatedJobs": [trainer_job],
            }
        ],
    }
