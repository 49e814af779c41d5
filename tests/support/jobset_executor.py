"""A local stand-in for the JobSet controller, for end-to-end tests (not a product feature): JobSets
(jobset.x-k8s.io/v1alpha2) on the API emulator, their child Jobs and pods run by tests.support.job_controller and
tests.support.kubelet, a server's ``vllm serve`` by tests.support.vllm_standin. :class:`JobSetExecutor`'s docstring
says what it emulates and what it does not."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes

from tests.support.env import free_port
from tests.support.job_controller import ChildJob, JobController
from tests.support.kubelet import Replica, now

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSET_PREFIX = "jobset.sigs.k8s.io/"
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"


@dataclass
class JobSetRun:
    uid: str
    name: str
    root: Path
    restarts: int = 0
    restarts_towards_max: int = 0
    jobs: dict[str, ChildJob] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    terminal: str | None = None
    ports: dict[tuple[str, int], int] = field(default_factory=dict)  # (replicated job, containerPort) → host port
    written: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)  # what the controllers did, in order (for tests)


class JobSetExecutor(JobController):
    """The JobSet v0.12.0 controller, the Kubernetes Job controller and the kubelet, for JobSets on the emulator.

    Each reconcile follows the JobSet controller's order (notes on JobSet v0.12.0 ``jobset_controller.go``):
    failure policy first, then success policy, then the headless Service, then the child Jobs of every
    replicated job whose ``dependsOn`` is reached, then suspend/resume, then one status write.

    * Child Jobs ``<js>-<rjob>-<jobIdx>`` (batch/v1 objects owned by the JobSet, with the JobSet labels and the
      restart-attempt label); pods ``<job>-<podIdx>-<5 random>`` owned by their Job, hostname ``<job>-<podIdx>``
      and ``subdomain`` (the JobSet's ``network.subdomain`` or name) when ``enableDNSHostnames`` (default true),
      labels/annotations of the JobSet and the Job controller, ``JOB_COMPLETION_INDEX`` (Indexed Jobs).
    * Networking on one machine: every JobSet hostname, alone or as ``<host>.<subdomain>[.<ns>.svc[.cluster.local]]``,
      is rewritten to 127.0.0.1 in commands, env values and ConfigMap files. Every declared ``containerPort`` P
      of a replicated job R gets one free host port H(R, P): ``<R's host>:P`` becomes ``127.0.0.1:H``; in R's own
      pods a whole argument or env value ``P`` (or ``--…port=P``), the readiness probe's port and the ConfigMap
      YAML ``*port`` keys become H. Pods of one replicated job share H, so only one of them may listen on it (the
      trainer's rendezvous port on pod 0; one-pod servers). ``host_ports`` (port name → host port) wins over it.
    * A container whose command is ``vllm serve MODEL …`` is not run: a small HTTP stand-in (VLLM_STANDIN) serves
      /health, /v1/models and scripted /v1/chat/completions on its port instead, and the executor logs so.
    * Readiness: a running pod with a ``readinessProbe.httpGet`` is Ready while a GET on it answers 2xx/3xx
      (probed each poll, timings ignored); without a probe, Ready once started. Job ``status.ready`` counts them.
    * Job controller: ``restartPolicy: Never`` pods; a failed pod beyond ``backoffLimit`` (default 6) fails the
      Job (reason BackoffLimitExceeded) and its other pods are killed; within it, the index gets a new pod. An
      Indexed Job is Complete when every index succeeded (NonIndexed: ``completions`` successes).
    * JobSet: Jobs of a failed attempt are deleted with their pods and recreated under the same names with
      ``restart-attempt`` + 1 (failurePolicy: the first matching rule's action — RestartJobSet (reason
      ``FailurePolicy_<rule>``), RestartJobSetAndIgnoreMaxRestarts or FailJobSet — else RestartJobSet (reason
      DefaultFailurePolicy), up to ``maxRestarts``, then Failed, ReachedMaxRestarts; no failurePolicy: Failed,
      FailedJobs); a Job's ``podFailurePolicy`` ``onExitCodes`` rules (FailJob: the Job fails at once, reason
      PodFailurePolicy; Ignore: the pod is replaced, not counted); ``successPolicy`` (All/Any over its targets)
      → Completed, ``terminalState``, still-active Jobs and their pods deleted (finished ones kept);
      ``spec.suspend``: Jobs created suspended, pods of suspended Jobs deleted; resuming merges the JobSet's
      current pod-template labels/annotations/nodeSelector/tolerations into the Jobs (how Kueue's admission
      reaches them) and starts them. ``status``: conditions (added only when True, as ``updateCondition``),
      ``restarts``, ``restartsCountTowardsMax``, ``terminalState``, ``replicatedJobsStatus``.

    Not emulated: podFailurePolicy ``onPodConditions``, failurePolicy ``restartStrategy`` other than Recreate,
    ``startupPolicy: InOrder``,
    ``ttlSecondsAfterFinished``, ``coordinator``, the webhooks' defaulting/validation, graceful termination
    (pods are SIGKILLed), probe timings, scheduling (every pod runs at once), more than the first container.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sets: dict[str, JobSetRun] = {}
        self.batch = kubernetes.client.BatchV1Api(self.api)

    def _all_pods(self) -> list[Replica]:
        return [pod for run in self.sets.values() for job in run.jobs.values() for pod in job.pods.values()]

    def run_of(self, name: str) -> JobSetRun | None:
        return next((r for r in self.sets.values() if r.name == name), None)

    def jobset_pods(self, name: str, rjob: str | None = None) -> list[Replica]:
        run = self.run_of(name)
        if run is None:
            return []
        jobs = list(run.jobs.values())  # the executor's thread changes them while a test reads
        return [p for j in jobs if rjob is None or j.rjob == rjob for _, p in sorted(list(j.pods.items()))]

    def _step(self) -> None:
        items = self.custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets")[
            "items"
        ]
        for js in items:
            if js.get("metadata", {}).get("deletionTimestamp"):
                continue
            managed_by = js["spec"].get("managedBy")
            if managed_by and managed_by != JOBSET_CONTROLLER:
                continue
            self._reconcile(js)
        present = {js["metadata"]["uid"] for js in items}
        for uid, run in list(self.sets.items()):
            if uid not in present:  # deleted: its Jobs and pods go (garbage collection)
                for job in run.jobs.values():
                    self._delete_job(run, job)
                del self.sets[uid]

    def _reconcile(self, js: dict[str, Any]) -> None:
        uid, name = js["metadata"]["uid"], js["metadata"]["name"]
        run = self.sets.get(uid)
        if run is None:
            root = self.workdir / f"{name}-{uid[:8]}"
            root.mkdir(parents=True, exist_ok=True)
            run = self.sets[uid] = JobSetRun(uid, name, root)
        spec = js["spec"]
        rjobs = spec["replicatedJobs"]
        for job in list(run.jobs.values()):
            self._supervise_job(js, run, job)
        statuses = self._rjob_statuses(rjobs, run)
        if run.terminal:
            for job in [j for j in run.jobs.values() if j.condition is None]:  # finished: active Jobs deleted
                self._delete_job(run, job)
                del run.jobs[job.name]
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        suspend = bool(spec.get("suspend"))
        failed = sorted((j for j in run.jobs.values() if j.condition == "Failed"), key=lambda j: j.failed_at)
        if failed:
            self._failure_policy(js, run, failed)
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        policy = spec.get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in rjobs]
        complete = sum(1 for j in run.jobs.values() if j.condition == "Complete" and j.rjob in targets)
        expected = (
            1
            if policy.get("operator") == "Any"
            else sum(int(r.get("replicas", 1)) for r in rjobs if r["name"] in targets)
        )
        if complete and complete >= expected:
            run.terminal = "Completed"
            self._condition(run, "Completed", True, "AllJobsCompleted", "jobset completed successfully")
            self._condition(run, "RestartingJobSet", False, "JobSetCompleted", "jobset completed successfully")
            run.log.append("Completed")
            for job in [j for j in run.jobs.values() if j.condition is None]:
                self._delete_job(run, job)
                del run.jobs[job.name]
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        self._ensure_service(js)
        replicas_before = 0
        for rjob in rjobs:
            deps_met = self._deps_met(rjob, statuses)
            replicas = int(rjob.get("replicas", 1))
            if deps_met:
                for index in range(replicas):
                    job_name = f"{name}-{rjob['name']}-{index}"
                    if job_name not in run.jobs:
                        self._create_job(js, run, rjob, index, replicas_before, suspend)
            replicas_before += replicas
        if suspend:
            self._suspend_jobs(run, [j for j in run.jobs.values() if not j.suspended and j.condition is None])
            self._condition(run, "Suspended", True, "SuspendedJobs", "jobset is suspended")
        else:
            for rjob in rjobs:
                if not self._deps_met(rjob, statuses):
                    continue
                for job in run.jobs.values():
                    if job.rjob == rjob["name"] and job.suspended:
                        self._resume_job(js, run, rjob, job)
            self._condition(run, "Suspended", False, "ResumeJobs", "jobset is resumed")
        statuses = self._rjob_statuses(rjobs, run)
        total = sum(int(r.get("replicas", 1)) for r in rjobs)
        if not suspend and sum(s["ready"] + s["succeeded"] for s in statuses) == total:
            self._condition(run, "RestartingJobSet", False, "JobsReady", "all jobs are ready")
        self._write_jobset_status(js, run, statuses)

    @staticmethod
    def _deps_met(rjob: dict[str, Any], statuses: list[dict[str, Any]]) -> bool:
        by_name = {s["name"]: s for s in statuses}
        for dep in rjob.get("dependsOn") or []:
            status = by_name.get(dep["name"])
            if status is None:
                return False
            if dep["status"] == "Ready":
                reached = status["_replicas"] == status["ready"] + status["failed"] + status["succeeded"]
            else:
                reached = status["_replicas"] == status["succeeded"]
            if not reached:
                return False
        return True

    @staticmethod
    def _rjob_statuses(rjobs: list[dict[str, Any]], run: JobSetRun) -> list[dict[str, Any]]:
        out = []
        for rjob in rjobs:
            jobs = [j for j in run.jobs.values() if j.rjob == rjob["name"] and j.attempt == run.restarts]
            ready = sum(
                1
                for j in jobs
                if j.condition is None
                and not j.suspended
                and j.active()
                and len(j.succeeded) + j.ready() >= min(j.parallelism, j.completions)
            )
            out.append(
                {
                    "name": rjob["name"],
                    "ready": ready,
                    "succeeded": sum(1 for j in jobs if j.condition == "Complete"),
                    "failed": sum(1 for j in jobs if j.condition == "Failed"),
                    "active": sum(1 for j in jobs if j.active()),
                    "suspended": sum(1 for j in jobs if j.suspended),
                    "_replicas": int(rjob.get("replicas", 1)),
                }
            )
        return out

    def _condition(self, run: JobSetRun, type_: str, status: bool, reason: str, message: str) -> None:
        """``updateCondition``: a condition that is absent is added only when True; a status change moves
        lastTransitionTime, a reason/message change alone does not."""
        current = run.conditions.get(type_)
        value = "True" if status else "False"
        if current is None:
            if status:
                run.conditions[type_] = {
                    "type": type_,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": now(),
                }
            return
        if current["status"] != value:
            current["lastTransitionTime"] = now()
        current.update(status=value, reason=reason, message=message)

    def _failure_policy(self, js: dict[str, Any], run: JobSetRun, failed: list[ChildJob]) -> None:
        """``executeFailurePolicy``: the first rule that matches a failed Job (the earliest such Job) decides;
        without one, the default action RestartJobSet on the earliest failed Job."""
        first = failed[0]
        policy = js["spec"].get("failurePolicy")
        if policy is None:
            self._fail(
                run, "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {first.name})"
            )
            return
        action, reason = "RestartJobSet", "DefaultFailurePolicy"
        for rule in policy.get("rules") or []:
            match = next((job for job in failed if self._rule_applies(rule, job)), None)
            if match is not None:
                first, action, reason = match, rule["action"], f"FailurePolicy_{rule['name']}"
                break
        if action == "FailJobSet":
            self._fail(
                run,
                "FailJobSetFailurePolicyAction",
                f"applying FailJobSet failure policy action (first failed job: {first.name})",
            )
            return
        counts = action != "RestartJobSetAndIgnoreMaxRestarts"
        if counts and run.restarts_towards_max >= int(policy.get("maxRestarts") or 0):
            self._fail(
                run,
                "ReachedMaxRestarts",
                f"jobset failed due to reaching max number of restarts (first failed job: {first.name})",
            )
            return
        run.restarts += 1
        run.restarts_towards_max += int(counts)
        run.log.append(f"RestartingJobSet {run.restarts} ({reason}; first failed job: {first.name})")
        self._condition(
            run,
            "RestartingJobSet",
            True,
            reason,
            f"applying {action} failure policy action (first failed job: {first.name})",
        )
        print(
            f"pod executor: JobSet {run.name}: restart {run.restarts} ({reason}; first failed job: {first.name})",
            file=sys.stderr,
        )
        for job in list(run.jobs.values()):  # the previous attempt's Jobs are deleted (Foreground)
            self._delete_job(run, job)
            del run.jobs[job.name]

    @staticmethod
    def _rule_applies(rule: dict[str, Any], job: ChildJob) -> bool:
        """``ruleIsApplicable``: the Job's failure reason, message and replicated job against the rule's filters."""
        import re

        if rule.get("onJobFailureReasons") and job.reason not in rule["onJobFailureReasons"]:
            return False
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if patterns and not any(re.search(p, job.message) for p in patterns):
            return False
        return not rule.get("targetReplicatedJobs") or job.rjob in rule["targetReplicatedJobs"]

    def _fail(self, run: JobSetRun, reason: str, message: str) -> None:
        run.terminal = "Failed"
        run.log.append(f"Failed {reason}")
        self._condition(run, "Failed", True, reason, message)
        self._condition(run, "RestartingJobSet", False, "JobSetFailed", "jobset failed")
        for job in [j for j in run.jobs.values() if j.condition is None]:  # active Jobs deleted
            self._delete_job(run, job)
            del run.jobs[job.name]

    def _ensure_service(self, js: dict[str, Any]) -> None:
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames", True) is False:
            return
        name = network.get("subdomain") or js["metadata"]["name"]
        try:
            self.core.read_namespaced_service(name, self.namespace)
            return
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        self.core.create_namespaced_service(
            self.namespace,
            {
                "metadata": {"name": name, "ownerReferences": [self._owner(js, "JobSet")]},
                "spec": {
                    "clusterIP": "None",
                    "selector": {f"{JOBSET_PREFIX}jobset-name": js["metadata"]["name"]},
                    "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True),
                },
            },
        )

    @staticmethod
    def _owner(obj: dict[str, Any], kind: str) -> dict[str, Any]:
        api_version = obj.get("apiVersion") or f"{JOBSET_GROUP}/{JOBSET_VERSION}"
        return {
            "apiVersion": api_version,
            "kind": kind,
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _jobset_labels(
        self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], index: int, before: int
    ) -> dict[str, str]:
        import hashlib

        rjobs = js["spec"]["replicatedJobs"]
        group = rjob.get("groupName", "default")
        in_group = [r for r in rjobs if r.get("groupName", "default") == group]
        group_before = 0
        for r in in_group:
            if r["name"] == rjob["name"]:
                break
            group_before += int(r.get("replicas", 1))
        job_name = f"{js['metadata']['name']}-{rjob['name']}-{index}"
        return {
            f"{JOBSET_PREFIX}jobset-name": js["metadata"]["name"],
            f"{JOBSET_PREFIX}jobset-uid": js["metadata"]["uid"],
            f"{JOBSET_PREFIX}replicatedjob-name": rjob["name"],
            f"{JOBSET_PREFIX}restart-attempt": str(run.restarts),
            f"{JOBSET_PREFIX}replicatedjob-replicas": str(rjob.get("replicas", 1)),
            f"{JOBSET_PREFIX}global-replicas": str(sum(int(r.get("replicas", 1)) for r in rjobs)),
            f"{JOBSET_PREFIX}job-index": str(index),
            f"{JOBSET_PREFIX}job-key": hashlib.sha1(f"{self.namespace}/{job_name}".encode()).hexdigest(),
            f"{JOBSET_PREFIX}job-global-index": str(before + index),
            f"{JOBSET_PREFIX}group-name": group,
            f"{JOBSET_PREFIX}group-replicas": str(sum(int(r.get("replicas", 1)) for r in in_group)),
            f"{JOBSET_PREFIX}job-group-index": str(group_before + index),
        }

    def _create_job(
        self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], index: int, before: int, suspend: bool
    ) -> None:
        import copy

        name = f"{js['metadata']['name']}-{rjob['name']}-{index}"
        template = copy.deepcopy(rjob["template"])
        labels = self._jobset_labels(js, run, rjob, index, before)
        spec = template.get("spec") or {}
        spec["suspend"] = suspend
        spec.setdefault("completionMode", "Indexed")
        pod_template = spec.setdefault("template", {})
        pod_meta = pod_template.setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
        pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **labels}
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames", True):
            pod_template.setdefault("spec", {})["subdomain"] = network.get("subdomain") or js["metadata"]["name"]
        meta = template.get("metadata") or {}
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "labels": {**(meta.get("labels") or {}), **labels},
                "annotations": {**(meta.get("annotations") or {}), **labels},
                "ownerReferences": [self._owner(js, "JobSet")],
            },
            "spec": spec,
        }
        status, created = self._call("POST", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", body)
        if status not in (200, 201):
            raise RuntimeError(f"creating job {name}: HTTP {status}")
        job = ChildJob(name, rjob["name"], index, created["metadata"]["uid"], spec, run.restarts, suspend)
        run.jobs[name] = job
        run.log.append(f"created job {name} (attempt {run.restarts}{', suspended' if suspend else ''})")
        for container in spec["template"]["spec"].get("containers", []):
            for port in container.get("ports", []):
                key = (rjob["name"], int(port["containerPort"]))
                if key not in run.ports:
                    run.ports[key] = self.host_ports.get(port.get("name", ""), 0) or free_port()
        if not suspend:
            self._start_job(js, run, job)

    def _write_jobset_status(self, js: dict[str, Any], run: JobSetRun, statuses: list[dict[str, Any]]) -> None:
        status: dict[str, Any] = {
            "restarts": run.restarts,
            "replicatedJobsStatus": [{k: v for k, v in s.items() if not k.startswith("_")} for s in statuses],
            "conditions": list(run.conditions.values()),
        }
        if run.restarts_towards_max:
            status["restartsCountTowardsMax"] = run.restarts_towards_max
        if run.terminal:
            status["terminalState"] = run.terminal
        if status != run.written:
            self.custom.patch_namespaced_custom_object_status(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", run.name, {"status": status}
            )
            run.written = json.loads(json.dumps(status))
