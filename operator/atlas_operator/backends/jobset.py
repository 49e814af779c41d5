"""The JobSet backend (jobset.x-k8s.io/v1alpha2): the trainer and the servers as replicated jobs of one gang, restarted
together; and what a JobSet's status says (the TrainJob backend's Trainer makes a JobSet too: atlas_operator/backends/
trainjob.py reads it with these)."""

from __future__ import annotations

import json
from typing import Any

from atlas_contract.names import (
    JOBSET_TRAINER_CONTAINER,
    QUEUE_NAME_LABEL,
    RENDEZVOUS_PORT,
    SPEC_HASH_ANNOTATION,
    STOP_EXIT_CODE,
    TRAINJOB_TRAINER_JOB,
    WATCHDOG_EXIT_CODE,
    ChildNames,
)
from atlas_operator import kube
from atlas_operator.backends.protocol import CrdRequirement, JobBackend, JobState
from atlas_operator.config import Images
from atlas_operator.kube import Kube
from atlas_operator.render.config_map import checkpoint_warning
from atlas_operator.render.metadata import child_metadata, has_student_server
from atlas_operator.render.servers import rollout_pod_template, student_pod_template
from atlas_operator.render.trainer import TrainerShape, configured_trainer_template, job_spec_hash
from atlas_operator.run_status import EventReason
from atlas_operator.spec import AtlasTeacherSpec, Run

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"

# Set by the Job controller on each pod of an Indexed Job (label and annotation): the JobSet trainer's node rank.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"

# The JobSet failurePolicy rule the operator renders for a restart after a step-watchdog exit; its RestartingJobSet
# condition's reason is ``FailurePolicy_<rule>`` (JobSet v0.12.0 RestartingJobSetReasonFailurePolicyFormat).
WATCHDOG_RESTART_RULE = "WatchdogExit"
WATCHDOG_RESTART_REASON = f"FailurePolicy_{WATCHDOG_RESTART_RULE}"
# The trainer's replicated job: ours on the JobSet backend, the Trainer's in a TrainJob's JobSet.
TRAINER_JOBS = ("trainer", TRAINJOB_TRAINER_JOB)


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
    student = spec.student if isinstance(spec, AtlasTeacherSpec) else None
    if student is not None and has_student_server(run):
        servers.append(("student", student.rollout.replicas, student_pod_template(run, images)))
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
    job: dict[str, Any] = {
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
    template = configured_trainer_template(run, images, config, JobSetBackend.trainer)
    trainer_job = _one_pod_job(template, run.spec.resources.nodes)
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


def jobset_topology_env(run: Run) -> list[dict[str, Any]]:
    """What Kubeflow injects into a PyTorchJob's pods, for the JobSet's trainer: the node rank is the pod's completion
    index (Indexed Job), the master the first trainer pod's stable hostname."""
    res = run.spec.resources
    return [
        {"name": "PET_NNODES", "value": str(res.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(res.processes())},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_KEY}']"}},
        },
        {"name": "MASTER_ADDR", "value": ChildNames(run.name).host("trainer")},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
    ]


def replicated_jobs(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A JobSet's replicatedJobsStatus by name, each with ``replicas`` from its spec."""
    statuses = {s.get("name"): s for s in (job.get("status") or {}).get("replicatedJobsStatus") or []}
    out = {}
    for rjob in (job.get("spec") or {}).get("replicatedJobs") or []:
        out[rjob["name"]] = {**statuses.get(rjob["name"], {}), "replicas": int(rjob.get("replicas", 1))}
    return out


def servers_waiting(job: dict[str, Any]) -> list[str]:
    """A JobSet's servers that are not Ready yet, as ``<replicated job> <ready>/<replicas> ready``."""
    return [
        f"{name} {status.get('ready', 0)}/{status['replicas']} ready"
        for name, status in replicated_jobs(job).items()
        if name not in TRAINER_JOBS and status.get("ready", 0) < status["replicas"]
    ]


def jobset_state(job: dict[str, Any]) -> JobState:
    status = job.get("status") or {}
    true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    terminal = status.get("terminalState")
    if terminal == "Completed" or "Completed" in true:
        done = true.get("Completed") or {}
        return "Succeeded", done.get("reason") or "AllJobsCompleted", done.get("message") or "JobSet completed"
    if terminal == "Failed" or "Failed" in true:
        failed = true.get("Failed") or {}
        return "Failed", failed.get("reason") or "FailedJobs", failed.get("message") or "JobSet failed"
    if "Suspended" in true:
        return "Suspended", "Suspended", true["Suspended"].get("message") or "jobset is suspended"
    restarts = int(status.get("restarts") or 0)
    attempt = f" (restart {restarts} of {((job.get('spec') or {}).get('failurePolicy') or {}).get('maxRestarts', 0)})"
    restarting = true.get("RestartingJobSet")
    if restarting and restarting.get("reason") == WATCHDOG_RESTART_REASON:
        restarting = {
            **restarting,
            "message": f"the step watchdog ended a trainer process (exit code {WATCHDOG_EXIT_CODE}): "
            + (restarting.get("message") or "restarting"),
        }
    jobs = replicated_jobs(job)
    trainer = next((jobs[name] for name in TRAINER_JOBS if name in jobs), {})
    if trainer.get("active") or trainer.get("ready"):
        if restarting:  # the trainer of the new attempt runs; the set is not all Ready yet
            return "Running", "Restarting", (restarting.get("message") or "restarting") + attempt
        return "Running", "Running", "the trainer is running" + (attempt if restarts else "")
    waiting = servers_waiting(job)
    if restarting:  # a restart counts as Running, as on PyTorchJob
        return "Running", "Restarting", (restarting.get("message") or "restarting") + attempt
    if waiting:
        return "Pending", "ServersStarting", "the trainer starts once the servers are Ready: " + ", ".join(waiting)
    return "Pending", "JobPending", "waiting for the JobSet to start"


def watchdog_restarts(job: dict[str, Any] | None, run_status: dict[str, Any] | None) -> int:
    """Restarts of a JobSet since its run's status last showed them that followed a step-watchdog exit (its
    RestartingJobSet condition names the WatchdogExit rule); 0 for anything else. Restarts between two
    observations are all taken to have the last one's cause."""
    if job is None or job.get("kind") != "JobSet":
        return 0
    status = job.get("status") or {}
    new = int(status.get("restarts") or 0) - int((run_status or {}).get("restarts") or 0)
    restarting = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "RestartingJobSet" and c.get("status") == "True"
        ),
        None,
    )
    return max(new, 0) if restarting and restarting.get("reason") == WATCHDOG_RESTART_REASON else 0


def trainer_rank0_pod(client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
    """A JobSet's trainer pod of completion index 0 of the current attempt, by label (its name ends in a random
    suffix); its trainer job is ``trainer``, or ``node`` in a TrainJob's JobSet."""
    job_uid = (job.get("metadata") or {}).get("uid")
    names = {rjob.get("name") for rjob in (job.get("spec") or {}).get("replicatedJobs") or []}
    trainer = next((name for name in TRAINER_JOBS if name in names), TRAINER_JOBS[0])
    selector = ",".join(
        f"{key}={value}"
        for key, value in (
            ("jobset.sigs.k8s.io/jobset-name", job["metadata"]["name"]),
            ("jobset.sigs.k8s.io/replicatedjob-name", trainer),
            ("jobset.sigs.k8s.io/restart-attempt", str((job.get("status") or {}).get("restarts") or 0)),
        )
    )
    for pod in client.list(kube.POD, run.namespace, selector):
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get("jobset.sigs.k8s.io/jobset-uid") != job_uid:
            continue  # a pod of an earlier JobSet of the same name
        if (meta.get("annotations") or {}).get(COMPLETION_INDEX_KEY) == "0":
            return pod
    return None


class JobSetBackend(JobBackend):
    kind = "JobSet"
    resource = kube.JOBSET
    child_key = "jobSet"
    watched = (kube.JOBSET,)
    crd = CrdRequirement(
        EventReason.JOBSET_CRD_MISSING,
        "jobset.x-k8s.io/v1alpha2 JobSet CRD",
        "install JobSet v0.12.0 or later (kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml), "
        "or set spec.backend: PyTorchJob",
    )
    servers_in_job = True
    trainer = TrainerShape(
        container=JOBSET_TRAINER_CONTAINER, topology_env=jobset_topology_env, rendezvous_port="rendezvous"
    )
    rank0_labels = {COMPLETION_INDEX_KEY: "0"}

    def render_job(self, run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
        return jobset(run, images, config)

    def checkpoint_warning(self, run: Run) -> str | None:
        # A restart (failurePolicy Recreate) makes every pod anew.
        return checkpoint_warning(run, restart_replaces_pods=True)

    def state(self, job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
        """What its conditions, terminalState and replicated jobs say."""
        return jobset_state(job)

    def restarting_gang(self, job: dict[str, Any], gang: dict[str, Any] | None) -> dict[str, Any] | None:
        return job

    def watchdog_restarts(self, gang: dict[str, Any], run_status: dict[str, Any] | None) -> int:
        return watchdog_restarts(gang, run_status)

    def servers_waiting(self, job: dict[str, Any]) -> list[str]:
        return servers_waiting(job)

    def rank0_pod(self, client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        return trainer_rank0_pod(client, run, job)


JOBSET = JobSetBackend()
