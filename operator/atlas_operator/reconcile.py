"""One reconciliation of a run: parse → check prerequisites → render → apply → observe status.

Idempotent by construction: children have fixed names, an existing child is compared with what
the run renders and patched only when it differs, and a 409 on create means "someone made it
first" (a previous operator process, a racing handler) and turns into that comparison. Nothing
here knows about kopf: the handlers hand in ``adopt`` and the previous status, and write what
comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from atlas_contract.names import KINDS, LABEL_INSTANCE, SPEC_HASH_ANNOTATION, ChildNames
from atlas_contract.results import parse_result
from atlas_contract.rules import find_reward_config
from atlas_operator import kube
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import ApiError, Kube
from atlas_operator.ownership import (
    NAME_CONFLICT,
    NAME_TAKEN,
    Foreign,
    conflict_message,
    is_controlled_by,
    name_taken_message,
    rival_run,
)
from atlas_operator.render import (
    COMPLETION_INDEX_KEY,
    checkpoint_warning,
    child_names,
    has_student_server,
    on_jobset,
    render_children,
    trainer_container,
)
from atlas_operator.revisions import PINNED_KINDS, Revision, stamp
from atlas_operator.spec import ConditionType as Condition
from atlas_operator.spec import InvalidRun, Run, parse_run
from atlas_operator.status import (
    FINISHED,
    Event,
    Result,
    job_phase,
    job_state,
    job_suspended,
    parse_progress,
    pod_stuck,
    servers_waiting,
    termination_message,
    training_reason,
    watchdog_restarts,
)

log = logging.getLogger("atlas_operator")

# Reads of a succeeded job's Master pod for the run's result, per job and operator process: a pod that is gone
# or carries no result is not read again at every status refresh.
MAX_RESULT_READS = 3

# spec.backend → (condition reason, what is missing, how to install it) when its CRD is not served.
JOB_CRDS = {
    "PyTorchJob": (
        "PyTorchJobCRDMissing",
        "kubeflow.org/v1 PyTorchJob CRD",
        "install the Kubeflow Training Operator v1 (kubectl apply --server-side -k "
        '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")',
    ),
    "JobSet": (
        "JobSetCRDMissing",
        "jobset.x-k8s.io/v1alpha2 JobSet CRD",
        "install JobSet v0.12.0 or later (kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml), "
        "or set spec.backend: PyTorchJob",
    ),
}
# status.children key → what the run may own under it (deleted when the spec no longer wants it).
OWNED_BY_KEY = {
    "pytorchJob": (kube.PYTORCH_JOB,),
    "jobSet": (kube.JOBSET,),
    "rollout": (kube.DEPLOYMENT, kube.SERVICE),
    "student": (kube.DEPLOYMENT, kube.SERVICE),
    "networkPolicy": (kube.NETWORK_POLICY,),  # operator setting network_policy turned off
    "trainerNetworkPolicy": (kube.NETWORK_POLICY,),
}


class RetryLater(Exception):
    """A transient condition (API error, an old job still terminating): retry the reconciliation."""


class NameConflict(Exception):
    """An object this run does not control was found under one of its child names when creating it."""

    def __init__(self, foreign: Foreign):
        super().__init__(str(foreign))
        self.foreign = foreign


def _cond(type_: Condition, ok: bool, reason: str, message: str) -> dict[str, Any]:
    """A condition of a declared type (ConditionType: a type not in the CRD's enum raises here, not at the API)."""
    return {"type": str(Condition(type_)), "status": "True" if ok else "False", "reason": reason, "message": message}


class Reconciler:
    def __init__(self, client: Kube, settings: OperatorConfig | None = None):
        self.kube = client
        self.settings = settings or OperatorConfig()
        self._crd_seen_at: dict[str, float] = {}  # job kind → when its CRD was last seen served
        # Trainer scrapes: their own small pool (each run's timer awaits its own, so one in flight per run).
        self._scraper = ThreadPoolExecutor(max_workers=8, thread_name_prefix="atlas-scrape")
        self._result_lock = threading.Lock()
        self._result_reads: dict[tuple, int] = {}  # (namespace, run, run uid, job uid) → pod reads so far
        # Pods the kubelet cannot start (from the pod watch): (namespace, run) → pod → (reason, message); and the
        # kind of each run reconciled, so a pod's run is known from its app.kubernetes.io/instance label alone.
        self._stuck_lock = threading.Lock()
        self._stuck: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self._kinds: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------ entry point

    def reconcile(self, body: dict[str, Any], adopt: Callable[[dict, dict], None]) -> Result:
        meta = body.get("metadata") or {}
        with self._stuck_lock:
            self._kinds[(meta.get("namespace", "default"), meta.get("name"))] = body.get("kind")
        started_on = _backend_of(body)  # a run keeps the backend it started on when the operator's default changes
        revision = Revision.of(body)
        try:
            run = parse_run(body, default_backend=started_on or self.settings.default_backend)
        except InvalidRun as invalid:
            return self.invalid(body, "; ".join(invalid.problems))
        conditions = [_cond(Condition.VALID, True, "SpecValid", "the spec passed validation")]
        if self.keeps_running_on(run, body, started_on):
            job_name = ChildNames(run.name).job
            conditions.append(
                _cond(
                    Condition.SPEC_APPLIED,
                    False,
                    "BackendChangeNeedsCheckpoint",
                    f"spec.backend: {run.backend}, but {started_on} {job_name} is still running and "
                    "spec.checkpoint.pvc is not set, so moving the run would restart training from step 0; it "
                    f"keeps running on {started_on} (delete {started_on} {job_name} to move it now, or set "
                    "spec.checkpoint.pvc for future runs)",
                )
            )
            run = dataclasses.replace(run, backend=started_on)
            revision = dataclasses.replace(revision, applied=False)
        unshared = checkpoint_warning(run)
        events = [Event("Warning", "CheckpointsNotShared", unshared)] if unshared else []
        if unshared:
            conditions.append(_cond(Condition.CHECKPOINTS_SHARED, False, "CheckpointsNotShared", unshared))
        else:
            where = f"PersistentVolumeClaim {run.spec.checkpoint.pvc}" if run.spec.checkpoint.pvc else "one pod"
            conditions.append(
                _cond(Condition.CHECKPOINTS_SHARED, True, "Shared", f"every rank's checkpoints are on {where}")
            )

        missing = self.missing_prerequisites(run)
        if missing:
            reason, message = missing
            conditions.append(_cond(Condition.PREREQUISITES_MET, False, reason, message))
            return Result("Pending", conditions, events=[*events, Event("Warning", reason, message)])
        conditions.append(
            _cond(Condition.PREREQUISITES_MET, True, "Found", f"{run.backend} CRD and referenced objects exist")
        )

        network = self.settings.network
        result = Result("Pending", conditions, children=child_names(run, network.enabled), events=events)
        rendered = render_children(run, self.settings.images, reward_yaml(run), network)
        desired = [stamp(child, revision) for child in rendered]
        for child in desired:
            adopt(child, body)
        existing, foreign = self.observe_children(run, body, desired)
        if foreign:
            return self.name_conflict(run, body, result, existing, foreign)
        self.prune(run, body, result)  # first: a replaced job never runs beside its successor
        job = None
        rejected = []
        observed_servers: dict[str, dict[str, Any] | None] = {}  # Deployment name → as applied
        for child in desired:
            try:
                observed, action = self.apply(run, child, existing[_key(child)], revision, result)
            except NameConflict as conflict:  # made under one of our names since it was read: create nothing more
                return self.name_conflict(run, body, result, existing, [conflict.foreign])
            except ApiError as exc:
                if not exc.rejected:
                    raise  # transient: kopf retries the reconciliation
                # The API server refuses this object as rendered: retrying at once changes nothing, so say
                # why and try again at the next status refresh (the timer), not in a hot loop.
                rejected.append(
                    f"{child['kind']} {child['metadata']['name']}: {exc.status} {exc.reason}: {exc.message}"
                )
                continue
            if action:
                result.actions[f"{child['kind']}/{child['metadata']['name']}"] = action
            if child["kind"] in kube.JOBS:
                job = observed
            elif child["kind"] == "Deployment":
                observed_servers[child["metadata"]["name"]] = observed
        if result.actions:  # the log says what changed; the condition stays put (no status write per pass)
            log.info(
                "%s %s/%s: %s",
                run.kind,
                run.namespace,
                run.name,
                ", ".join(f"{action} {child}" for child, action in result.actions.items()),
            )
        if rejected:
            message = "the API server rejected " + "; ".join(rejected)
            conditions.append(_cond(Condition.CHILDREN_READY, False, "ChildRejected", message))
            result.events.append(Event("Warning", "ChildRejected", message))
        else:
            conditions.append(_cond(Condition.CHILDREN_READY, True, "Applied", "all children exist and match the spec"))
        if not any(c["type"] == Condition.SPEC_APPLIED for c in conditions):
            conditions.append(_cond(Condition.SPEC_APPLIED, True, "UpToDate", "the running job matches the spec"))
        conditions.append(self.rollout_condition(run, job, observed_servers))
        started = self.pods_condition(run)
        conditions.append(started)
        if started["status"] == "False":  # posted once per (reason, message): status_update skips what it said
            result.events.append(Event("Warning", started["reason"], started["message"]))

        result.phase = job_phase(job, run.spec.suspend, queued=bool(run.spec.queue_name))
        if job is not None and job["kind"] == "JobSet":
            result.restarts = int((job.get("status") or {}).get("restarts") or 0)
            result.watchdog_restarts = watchdog_restarts(job, body.get("status"))
            if result.watchdog_restarts:
                result.events.append(
                    Event(
                        "Warning",
                        "WatchdogRestart",
                        f"the step watchdog ended a trainer process of JobSet {job['metadata']['name']} (no optimizer "
                        f"step within spec.training.stepTimeoutSeconds, or a server unreachable): restart "
                        f"{result.restarts} of {run.spec.max_restarts}; the trainer log has the stacks and the reason",
                    )
                )
        if job is not None:
            reason, message = training_reason(job)
        elif run.spec.queue_name and run.spec.suspend:  # its job was deleted (Kueue owns a queued job's suspend)
            reason, message = "Suspended", f"spec.suspend: no {run.backend} while suspended; resuming queues a new one"
        else:  # not created (yet): say which kind of job the run waits for
            reason, message = "JobPending", f"waiting for the {run.backend} to start"
        conditions.append(_cond(Condition.TRAINING, result.phase == "Running", reason, message))
        if job is not None and result.phase == "Succeeded":
            if not (body.get("status") or {}).get("result"):
                result.result = self.read_result(run, job, result.events)
        elif job is not None:
            result.result_stale = True  # a job made again (spec change) has not reported yet
        return result

    def invalid(self, body: dict[str, Any], message: str) -> Result:
        """An invalid spec: nothing is created or changed. An edit that makes a running run invalid leaves
        its job running on the last valid spec, and the status keeps reporting that job."""
        conditions = [_cond(Condition.VALID, False, "InvalidSpec", message)]
        events = [Event("Warning", "InvalidSpec", message)]
        meta = body.get("metadata") or {}
        children = (body.get("status") or {}).get("children") or {}
        kind = "JobSet" if children.get("jobSet") else "PyTorchJob"
        job_name = children.get("jobSet") or children.get("pytorchJob")
        job = self.kube.get(kube.JOBS[kind], meta.get("namespace", "default"), job_name) if job_name else None
        if job is None or not is_controlled_by(job, body):
            return Result("Invalid", conditions, events=events)
        queued = bool((body.get("spec") or {}).get("queueName"))
        phase = job_phase(job, job_suspended(job) and not queued, queued=queued)
        reason, job_message = training_reason(job)
        conditions += [
            _cond(
                Condition.SPEC_APPLIED, False, "InvalidSpec", f"{kind} {job_name} runs the last valid spec; {message}"
            ),
            _cond(Condition.TRAINING, phase == "Running", reason, job_message),
        ]
        children = dict((body.get("status") or {}).get("children") or {})
        return Result(phase, conditions, children=children, events=events)

    def keeps_running_on(self, run: Run, body: dict[str, Any], started_on: str | None) -> bool:
        """Whether a run whose spec.backend moved keeps its current job: it still runs and, without
        spec.checkpoint.pvc, a job on the other backend would start training from step 0."""
        if started_on is None or run.backend == started_on or run.spec.checkpoint.pvc:
            return False
        job = self.kube.get(kube.JOBS[started_on], run.namespace, ChildNames(run.name).job)
        return job is not None and is_controlled_by(job, body) and job_phase(job, False) not in FINISHED

    # ------------------------------------------------------------------ prerequisites

    def missing_prerequisites(self, run: Run) -> tuple[str, str] | None:
        if not self.crd_installed(run.backend):
            reason, what, install = JOB_CRDS[run.backend]
            return reason, f"the cluster has no {what} (spec.backend {run.backend}): {install}"
        pvc = run.spec.checkpoint.pvc
        if pvc and not self.kube.exists(kube.PVC, run.namespace, pvc):
            return "CheckpointPVCMissing", (
                f"spec.checkpoint.pvc: PersistentVolumeClaim '{pvc}' does not exist in namespace {run.namespace}"
            )
        if run.spec.reward.config_map_ref:
            ref = run.spec.reward.config_map_ref
            if not self.kube.exists(kube.CONFIG_MAP, run.namespace, ref.name):
                return "RewardConfigMapMissing", (
                    f"spec.reward.configMapRef: ConfigMap '{ref.name}' does not exist in namespace {run.namespace}"
                )
        return None

    def crd_installed(self, kind: str) -> bool:
        """Whether the API serves the job ``kind`` (PyTorchJob, JobSet); a CRD found is trusted for a while."""
        if time.monotonic() - self._crd_seen_at.get(kind, float("-inf")) < self.settings.crd_cache_s:
            return True
        if self.kube.serves(kube.JOBS[kind]):
            self._crd_seen_at[kind] = time.monotonic()
            return True
        return False

    # ------------------------------------------------------------------ applying children

    def observe_children(
        self, run: Run, body: dict[str, Any], desired: list[dict[str, Any]]
    ) -> tuple[dict[tuple[str, str], dict[str, Any] | None], list[Foreign]]:
        """Each child as it stands now (None: absent), and the objects under a child's name this run does not control.
        A run that has made its children finds them in the watch; a new run asks the API server for each name,
        since an object someone else made there carries none of the labels the watch selects."""
        established = bool((body.get("status") or {}).get("children"))
        existing, foreign = {}, []
        for child in desired:
            resource = kube.resource_of(child)
            obj = self.kube.get(resource, run.namespace, child["metadata"]["name"], absent_unless_watched=established)
            existing[_key(child)] = obj
            if obj is not None and not is_controlled_by(obj, body):
                foreign.append(Foreign.of({**obj, "kind": resource.kind}))
        return existing, foreign

    def name_conflict(
        self,
        run: Run,
        body: dict[str, Any],
        result: Result,
        existing: dict[tuple[str, str], dict[str, Any] | None],
        foreign: list[Foreign],
    ) -> Result:
        """Objects under the run's child names that are not its own: nothing is created, changed or deleted; the
        run says which and who controls them, and its timer looks again until they are gone. Names held by a run
        of the other kind refuse this run (Invalid) instead."""
        rival = rival_run(foreign, run.kind, run.name)
        if rival is not None:
            message = name_taken_message(rival, run.kind, run.namespace)
            refused = _cond(Condition.VALID, False, NAME_TAKEN, message)
            return Result("Invalid", [refused], events=[Event("Warning", NAME_TAKEN, message)])
        message = conflict_message(foreign)
        ours = {name for (_, name), obj in existing.items() if obj is not None and is_controlled_by(obj, body)}
        result.children = {key: name for key, name in result.children.items() if name in ours}
        jobs = [obj for (kind, name), obj in existing.items() if kind in kube.JOBS and name in ours]
        job = jobs[0] if jobs else None
        result.phase = job_phase(job, run.spec.suspend, queued=bool(run.spec.queue_name))
        result.conditions.append(_cond(Condition.CHILDREN_READY, False, NAME_CONFLICT, message))
        result.events.append(Event("Warning", NAME_CONFLICT, message))
        return result

    def apply(
        self,
        run: Run,
        desired: dict[str, Any],
        existing: dict[str, Any] | None,
        revision: Revision,
        result: Result,
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Create, patch or (job) recreate one child, which this run controls or which is absent; returns (the object
        as observed, action). A pinned child (revisions.py) is rendered again only after its user changed the run."""
        resource = kube.resource_of(desired)
        name = desired["metadata"]["name"]
        is_job = desired["kind"] in kube.JOBS
        if existing is None:
            if is_job and run.spec.queue_name and run.spec.suspend:
                return None, None  # a suspended queued run holds no job (and no quota) until resumed
            try:
                return self.kube.create(desired), "created"
            except ApiError as exc:
                if exc.not_found and is_job:
                    self._crd_seen_at.pop(desired["kind"], None)  # uninstalled under us: report it next time
                if not exc.conflict:
                    raise
                existing = self.kube.get(resource, run.namespace, name)  # created meanwhile
                if existing is None:
                    raise RetryLater(f"{desired['kind']} {name}: conflict on create, then not found") from exc
                if not is_controlled_by(existing, _owner(run)):
                    raise NameConflict(Foreign.of({**existing, "kind": resource.kind})) from exc
        if is_job:
            return self.apply_job(run, desired, existing, revision, result)
        pinned = desired["kind"] in PINNED_KINDS
        if pinned and not revision.changed_since(existing):
            return existing, None  # the run's spec has not changed since it was rendered: an upgrade changes nothing
        patch = _managed_patch(desired, existing)
        if pinned and (patch is not None or not revision.is_recorded_on(existing)):
            patch = patch or {}
            patch.setdefault("metadata", {})["annotations"] = revision.annotations(desired["kind"])
        if patch is None:
            return existing, None
        return self.kube.patch(resource, run.namespace, name, patch), "patched"

    def apply_job(
        self, run: Run, desired: dict[str, Any], existing: dict[str, Any], revision: Revision, result: Result
    ) -> tuple[dict[str, Any] | None, str | None]:
        """A running job's pods never change (a JobSet's replicated jobs are immutable, and Kueue owns parts of
        their templates), so a change of the run's spec that changes the job recreates it; the trainer then resumes
        from the newest checkpoint on spec.checkpoint.pvc. Without a PVC the checkpoints die with the pods, so a
        running job is left running and SpecApplied says why. A queued run's suspend is Kueue's: suspending it
        deletes the job. Only ``suspend`` (not queued) is applied in place; an operator upgrade changes nothing."""
        kind, name = desired["kind"], desired["metadata"]["name"]
        resource = kube.JOBS[kind]
        if existing.get("metadata", {}).get("deletionTimestamp"):
            raise RetryLater(f"{kind} {name} is still being deleted")
        finished = job_phase(existing, False) in FINISHED
        # A finished job, or one suspended (no pods: Kueue has not admitted it, or preempted it), loses nothing.
        keeps_progress = bool(run.spec.checkpoint.pvc) or finished or job_suspended(existing)
        if run.spec.queue_name and run.spec.suspend:
            if keeps_progress:
                self.kube.delete(resource, run.namespace, name)
                where = f"{run.spec.checkpoint.path}/{run.name}"
                result.events.append(
                    Event(
                        "Normal",
                        "QueuedRunSuspended",
                        f"spec.suspend: deleted {kind} {name} (Kueue owns its suspend), releasing its quota; "
                        f"resuming queues it again and training resumes from the newest checkpoint in {where}",
                    )
                )
                return None, "deleted"
            result.conditions.append(
                _cond(
                    Condition.SPEC_APPLIED,
                    False,
                    "SuspendNeedsCheckpoint",
                    f"spec.suspend: Kueue owns {kind} {name}'s suspend (spec.queueName), so suspending means deleting "
                    "the job, and without spec.checkpoint.pvc that loses all progress; it keeps running (delete "
                    "the run to stop it, or set spec.checkpoint.pvc for future runs)",
                )
            )
        changed = revision.changed_since(existing)
        wanted_hash = desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
        current = (existing.get("metadata", {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)
        if changed and current != wanted_hash:
            if keeps_progress:
                return self.recreate_job(run, desired, result)
            result.conditions.append(
                _cond(
                    Condition.SPEC_APPLIED,
                    False,
                    "RestartNeedsCheckpoint",
                    f"the spec changed, but a running {kind} cannot be updated and spec.checkpoint.pvc is not set, "
                    f"so a restart would lose all progress; delete {kind} {name} to restart from scratch "
                    "(the operator recreates it), or set spec.checkpoint.pvc for future runs",
                )
            )
            changed = False  # not applied: the job still records the revision it runs
        wanted: dict[str, Any] = {}
        if changed and not revision.is_recorded_on(existing):
            wanted["metadata"] = {"annotations": revision.annotations(kind)}
        if not run.spec.queue_name:  # a queued job's suspend is Kueue's: never written after creation
            suspend = {"suspend": run.spec.suspend}
            wanted["spec"] = suspend if kind == "JobSet" else {"runPolicy": suspend}
        patch = _managed_patch(wanted, existing)
        if patch is None:
            return existing, None
        return self.kube.patch(resource, run.namespace, name, patch), "patched"

    def recreate_job(self, run: Run, desired: dict[str, Any], result: Result) -> tuple[dict[str, Any], str]:
        kind, name = desired["kind"], desired["metadata"]["name"]
        self.kube.delete(kube.JOBS[kind], run.namespace, name)
        result.events.append(
            Event(
                "Normal",
                "JobRecreated",
                (
                    f"spec changed: recreated {kind} {name}; training resumes from the newest checkpoint "
                    f"in {run.spec.checkpoint.path}/{run.name}"
                    if run.spec.checkpoint.pvc
                    else f"spec changed while the job was finished or suspended: started {kind} {name} again"
                ),
            )
        )
        try:
            return self.kube.create(desired), "recreated"
        except ApiError as exc:
            if exc.conflict:  # the old job is still terminating
                raise RetryLater(f"{kind} {name} is still being deleted") from exc
            raise

    # ------------------------------------------------------------------ observing

    def rollout_condition(
        self, run: Run, job: dict[str, Any] | None, observed: dict[str, dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Whether the servers are Ready: their Deployments (``observed``: as just applied, else read), or the
        JobSet's server replicated jobs."""
        observed = observed or {}
        if on_jobset(run):  # the JobSet's server replicated jobs
            servers = ["rollout"] * bool(run.spec.rollout.replicas) + ["student"] * has_student_server(run)
        else:
            names = child_names(run)
            servers = [names[c] for c in ("rollout", "student") if c in names]
        if not servers:
            return _cond(Condition.ROLLOUT_READY, True, "NotNeeded", "generation runs inside the trainer")
        if on_jobset(run):
            waiting = servers_waiting(job) if job is not None else [f"{c}: no JobSet yet" for c in servers]
            finished = job is not None and job_state(job)[0] in FINISHED
            if finished:  # the JobSet deletes its servers when it finishes
                return _cond(
                    Condition.ROLLOUT_READY, False, "Finished", f"JobSet {job['metadata']['name']} has finished"
                )
        else:
            waiting = []
            for name in servers:
                deployment = (
                    observed[name] if name in observed else self.kube.get(kube.DEPLOYMENT, run.namespace, name)
                ) or {}
                wanted = (deployment.get("spec") or {}).get("replicas", 0)
                ready = (deployment.get("status") or {}).get("readyReplicas", 0) or 0
                if ready < wanted:
                    waiting.append(f"{name} {ready}/{wanted} ready")
        if waiting:
            return _cond(Condition.ROLLOUT_READY, False, "Waiting", "; ".join(waiting))
        return _cond(Condition.ROLLOUT_READY, True, "Ready", f"{', '.join(servers)} ready")

    def pod_changed(self, pod: dict[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """Note whether a run's pod is stuck before starting (pod_stuck: a missing pull Secret, a Secret its env
        names, a bad image). Returns the run's (kind, name) when that changes what its status should say, else
        None (also for a run this process has not reconciled yet: its first reconciliation reads what is noted).
        The run is known from the pod's labels alone, no API call."""
        meta = pod.get("metadata") or {}
        run_name, pod_name = (meta.get("labels") or {}).get(LABEL_INSTANCE), meta.get("name")
        if not run_name or not pod_name:
            return None
        key = (meta.get("namespace", "default"), run_name)
        stuck = None if deleted else pod_stuck(pod)
        with self._stuck_lock:
            pods = self._stuck.setdefault(key, {})
            before = pods.pop(pod_name, None)
            if stuck is not None:
                pods[pod_name] = stuck
            if not pods:
                del self._stuck[key]
            kind = self._kinds.get(key)
        return (kind, run_name) if stuck != before and kind in KINDS else None

    def pods_condition(self, run: Run) -> dict[str, Any]:
        """PodsStarted: False with the kubelet's reason while a pod of the run cannot start its containers."""
        with self._stuck_lock:
            stuck = sorted((self._stuck.get((run.namespace, run.name)) or {}).items())
        if not stuck:
            return _cond(Condition.PODS_STARTED, True, "NoneStuck", "no pod of the run is kept from starting")
        _, (reason, message) = stuck[0]
        more = f" ({len(stuck) - 1} more pods stuck)" if len(stuck) > 1 else ""
        return _cond(Condition.PODS_STARTED, False, reason, message + more)

    def read_result(self, run: Run, job: dict[str, Any], events: list[Event]) -> dict[str, Any] | None:
        """``.status.result`` from the succeeded job's rank-0 pod (the PyTorchJob's Master, the JobSet trainer's
        index 0): its trainer container's termination message (atlas_contract.results), or None. A pod that is
        gone, belongs to an earlier job, or carries no parsable message gives None, and is read at most
        MAX_RESULT_READS times per job. A value out of its schema range is left out, with a Warning in ``events``."""
        job_uid = (job.get("metadata") or {}).get("uid")
        key = (run.namespace, run.name, run.uid, job_uid)
        with self._result_lock:
            reads = self._result_reads.get(key, 0)
            if reads >= MAX_RESULT_READS:
                return None
            self._result_reads[key] = reads + 1
        try:
            pod = self.rank0_pod(run, job)
        except ApiError as exc:  # no pods permission (an older chart), the API down: no result, no crash
            log.warning("%s %s/%s: no rank-0 pod to read the result from: %s", run.kind, run.namespace, run.name, exc)
            return None
        if pod is None:
            log.info("%s %s/%s: no rank-0 pod of the succeeded job: no result", run.kind, run.namespace, run.name)
            return None
        parsed, dropped = parse_result(termination_message(pod, trainer_container(run)))
        if dropped:  # the trainer's word, out of the schema's range: never shown, said once
            events.append(Event("Warning", "ResultOutOfRange", "the finished trainer's result: " + "; ".join(dropped)))
            if parsed is None:
                with self._result_lock:
                    self._result_reads[key] = MAX_RESULT_READS  # the same message would be read again
        if parsed is None:
            log.info(
                "%s %s/%s: pod %s has no result in its termination message",
                run.kind,
                run.namespace,
                run.name,
                (pod.get("metadata") or {}).get("name"),
            )
            return None
        with self._result_lock:
            self._result_reads.pop(key, None)
        return parsed

    def rank0_pod(self, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        """The pod of rank 0 of ``job``: the PyTorchJob's Master by name; a JobSet's trainer pod of completion
        index 0 of the current attempt, by label (its name ends in a random suffix)."""
        job_uid = (job.get("metadata") or {}).get("uid")
        if job["kind"] != "JobSet":
            pod = self.kube.get(kube.POD, run.namespace, ChildNames(run.name).master_pod)
            return pod if pod is not None and _made_by(pod, job_uid) else None
        selector = ",".join(
            f"{key}={value}"
            for key, value in (
                ("jobset.sigs.k8s.io/jobset-name", job["metadata"]["name"]),
                ("jobset.sigs.k8s.io/replicatedjob-name", "trainer"),
                ("jobset.sigs.k8s.io/restart-attempt", str((job.get("status") or {}).get("restarts") or 0)),
            )
        )
        for pod in self.kube.list(kube.POD, run.namespace, selector):
            meta = pod.get("metadata") or {}
            if (meta.get("labels") or {}).get("jobset.sigs.k8s.io/jobset-uid") != job_uid:
                continue  # a pod of an earlier JobSet of the same name
            if (meta.get("annotations") or {}).get(COMPLETION_INDEX_KEY) == "0":
                return pod
        return None

    def metrics_url(self, name: str, namespace: str) -> str:
        return self.settings.metrics_url_template.format(
            name=name,
            namespace=namespace,
            service=ChildNames(name).metrics,
            port=self.settings.trainer_metrics_port,
        )

    async def scrape(self, meta: dict[str, Any]) -> dict[str, Any] | None:
        """The Running trainer's step/reward/kl from its /metrics, or None when it does not answer (not up, too
        slow or big, not metrics). Each read is bounded in time and size and runs in the scrapers' own small pool,
        so a trainer that trickles or floods its endpoint delays only its own run's timer."""
        name, namespace = meta["name"], meta.get("namespace", "default")
        url = self.metrics_url(name, namespace)
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(
                self._scraper, fetch_text, url, self.settings.scrape_timeout_s, MAX_METRICS_BYTES
            )
            return parse_progress(text, name, namespace) or None
        except (OSError, ValueError, http.client.HTTPException) as exc:
            log.debug("metrics of %s/%s not readable at %s: %s", namespace, name, url, exc)
            return None

    def forget(self, body: dict[str, Any]) -> None:
        """Drop what is cached for a deleted run."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", "default"), meta.get("name"), meta.get("uid"))
        with self._result_lock:
            for read in [k for k in self._result_reads if k[:3] == key]:
                del self._result_reads[read]
        with self._stuck_lock:
            self._stuck.pop(key[:2], None)
            self._kinds.pop(key[:2], None)

    def prune(self, run: Run, body: dict[str, Any], result: Result) -> None:
        """Delete what the run had and its spec no longer wants: a server set to 0 replicas (its GPUs are freed),
        or the other backend's job and servers after a spec.backend change. What existed is read from
        status.children, so a run that never had one costs no API call."""
        had = ((body.get("status") or {}).get("children")) or {}
        for key, name in had.items():
            if key not in OWNED_BY_KEY or key in result.children or not isinstance(name, str):
                continue
            for resource in OWNED_BY_KEY[key]:
                existing = self.kube.get(resource, run.namespace, name)
                if (
                    existing is None
                    or not is_controlled_by(existing, body)
                    or not self.kube.delete(resource, run.namespace, name)
                ):
                    continue
                child = f"{resource.kind}/{name}"
                result.actions[child] = "deleted"
                if resource is kube.NETWORK_POLICY:
                    reason, why = "NetworkPolicyOff", "the operator's network policy setting is off"
                elif key in ("pytorchJob", "jobSet") or on_jobset(run):
                    reason, why = "BackendChanged", f"spec.backend is {run.backend} now"
                else:
                    reason, why = "ServerRemoved", "no longer in the spec"
                result.events.append(Event("Normal", reason, f"{child}: {why}, deleted"))

    @staticmethod
    def owning_run(child: dict[str, Any]) -> dict[str, Any] | None:
        """The controller owner reference of a child when it is a run (AtlasTraining/AtlasTeacher)."""
        refs = (child.get("metadata") or {}).get("ownerReferences") or []
        return next((ref for ref in refs if ref.get("controller") and ref.get("kind") in KINDS), None)

    # ------------------------------------------------------------------ deletion

    def delete_children(self, body: dict[str, Any]) -> list[str]:
        """Delete what the run owns (the API server's garbage collector would too, through the owner
        references; doing it here also covers a GC that is slow or off)."""
        namespace, name = body["metadata"].get("namespace", "default"), body["metadata"]["name"]
        deleted = []
        owned = ChildNames(name)
        targets = [
            (kube.PYTORCH_JOB, owned.job),
            (kube.JOBSET, owned.jobset),
            (kube.DEPLOYMENT, owned.rollout),
            (kube.DEPLOYMENT, owned.student),
            (kube.SERVICE, owned.rollout),
            (kube.SERVICE, owned.student),
            (kube.SERVICE, owned.metrics),
            (kube.CONFIG_MAP, owned.config_map),
            (kube.NETWORK_POLICY, owned.network_policy),  # after the workloads whose pods they protect
            (kube.NETWORK_POLICY, owned.trainer_network_policy),
        ]
        for resource, child in targets:
            if resource.kind in kube.JOBS and not self.crd_installed(resource.kind):
                continue
            existing = self.kube.get(resource, namespace, child)
            if existing is None or not is_controlled_by(existing, body):
                continue  # never delete what someone else made under the same name
            if self.kube.delete(resource, namespace, child):
                deleted.append(f"{resource.kind}/{child}")
        return deleted


MAX_METRICS_BYTES = 1 << 20  # a trainer's /metrics is a few KB; more is not a metrics endpoint


def fetch_text(url: str, deadline_s: float, max_bytes: int) -> str:
    """GET ``url`` within ``deadline_s`` for the whole request (not per read) and at most ``max_bytes``."""
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    end = time.monotonic() + deadline_s
    connection = connection_class(parts.hostname, parts.port, timeout=deadline_s)
    try:
        connection.request("GET", parts.path or "/")
        sock = connection.sock  # the response reads through it (the connection may drop its reference)
        response = connection.getresponse()
        if response.status != 200:
            raise OSError(f"HTTP {response.status}")
        body = bytearray()
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no complete answer within {deadline_s:g} s")
            sock.settimeout(remaining)
            chunk = response.read1(65536)
            if not chunk:
                return body.decode("utf-8", "replace")
            body += chunk
            if len(body) > max_bytes:
                raise ValueError(f"answer larger than {max_bytes} bytes")
    finally:
        connection.close()


def reward_yaml(run: Run) -> str | None:
    """The named RIM config (reward_system/<spec.reward.config>.yaml), embedded in the run's ConfigMap."""
    if not run.spec.reward.config:
        return None
    path = find_reward_config(run.spec.reward.config)
    if path is None:  # validate_run accepts only the bundled names, so this is a broken install
        raise RetryLater(f"spec.reward.config: RIM config {run.spec.reward.config!r} is not installed")
    return path.read_text()


def _key(child: dict[str, Any]) -> tuple[str, str]:
    return child["kind"], child["metadata"]["name"]


def _owner(run: Run) -> dict[str, Any]:
    """The run as an owner, for is_controlled_by."""
    return {"kind": run.kind, "metadata": {"name": run.name, "uid": run.uid}}


def _backend_of(body: dict[str, Any]) -> str | None:
    """The backend a run's job was made on (from status.children), or None before it has one."""
    children = (body.get("status") or {}).get("children") or {}
    if children.get("jobSet"):
        return "JobSet"
    return "PyTorchJob" if children.get("pytorchJob") else None


def _made_by(pod: dict[str, Any], job_uid: str | None) -> bool:
    """Whether ``pod`` belongs to the job ``job_uid`` (its controller owner reference), not to an earlier job of
    the same name; a pod without a controller reference is taken as it is."""
    refs = [r for r in (pod.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")]
    return not refs or job_uid is None or any(r.get("uid") == job_uid for r in refs)


def _managed_patch(desired: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch of the fields the operator manages (labels, annotations, owner references, spec/data), or
    None when the existing object already has them. Fields the API server adds are not compared."""
    patch: dict[str, Any] = {}
    managed = ("labels", "annotations", "ownerReferences")
    meta = {k: desired["metadata"][k] for k in managed if k in desired.get("metadata", {})}
    if meta and not _contains(existing.get("metadata", {}), meta):
        patch["metadata"] = meta
    for key in ("spec", "data"):
        if key in desired and not _contains(existing.get(key), desired[key]):
            patch[key] = desired[key]
    # A Service's selector is all ours: a key no longer rendered is removed (a merge patch would keep it, and after a
    # spec.backend change the metrics Service would select no pod: both backends' rank-0 labels at once).
    if desired.get("kind") == "Service":
        selector = desired["spec"].get("selector") or {}
        stale = {key: None for key in (existing.get("spec") or {}).get("selector") or {} if key not in selector}
        if stale:
            patch["spec"] = {**patch.get("spec", desired["spec"]), "selector": {**selector, **stale}}
    # A NetworkPolicy is all ours, and a key it does not render narrows it (a matchLabels entry that selects no pod
    # leaves the run's pods open): any difference is drift, and the patch removes what was added.
    if desired.get("kind") == "NetworkPolicy" and existing.get("spec") != desired["spec"]:
        patch["spec"] = _replacing(desired["spec"], existing.get("spec"))
    return patch or None


def _replacing(desired: Any, existing: Any) -> Any:
    """A merge patch that turns ``existing`` into exactly ``desired``: keys ``desired`` lacks are set to null."""
    if not isinstance(desired, dict) or not isinstance(existing, dict):
        return desired
    stale = {key: None for key in existing if key not in desired}
    return {**stale, **{key: _replacing(value, existing.get(key)) for key, value in desired.items()}}


def _contains(actual: Any, wanted: Any) -> bool:
    """``wanted`` is a sub-document of ``actual`` (quantities compared as text: 8 == "8")."""
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(_contains(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return actual == wanted or (actual is not None and str(actual) == str(wanted))
