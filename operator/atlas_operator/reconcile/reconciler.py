"""The reconciliation of a run, step by step (parse, spec, prerequisites, children, observation)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from atlas_contract.errors import InvalidFields
from atlas_contract.names import ChildNames
from atlas_contract.stops import StopReport
from atlas_operator import kube
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import ApiError, Kube
from atlas_operator.ownership import (
    is_controlled_by,
)
from atlas_operator.reconcile.children import Children, reward_yaml
from atlas_operator.reconcile.common import NameConflict, condition, log
from atlas_operator.reconcile.concurrency import at_once, pool, waves
from atlas_operator.reconcile.job_policies import JobPolicies, _backend_of
from atlas_operator.reconcile.observe import Observation
from atlas_operator.reconcile.prerequisites import Prerequisites
from atlas_operator.reconcile.scrape import Scraping
from atlas_operator.render import (
    checkpoint_warning,
    child_names,
    render_children,
)
from atlas_operator.revisions import Revision, stamp
from atlas_operator.run_status import ConditionType as Condition
from atlas_operator.spec import Run
from atlas_operator.status import (
    PREEMPTED,
    Event,
    Outcome,
    gang_of,
    job_phase,
    job_ran,
    job_suspended,
    preempted_message,
    training_reason,
    watchdog_restarts,
)
from atlas_operator.validation import parse_run


class Reconciler(Prerequisites, Children, JobPolicies, Observation, Scraping):
    """One reconciliation of a run, in steps: the spec (Valid, SpecApplied, CheckpointsShared), the prerequisites, the
    children (ownership first), then what is observed (servers, pods, the job's phase, the result)."""

    def __init__(self, client: Kube, settings: OperatorConfig | None = None):
        self.kube = client
        self.settings = settings or OperatorConfig()
        self.requests = pool()  # a run's requests that do not wait on each other (concurrency.py)
        self._crd_seen_at: dict[str, float] = {}  # job kind → when its CRD was last seen served
        self._runtime_seen: dict[str, tuple[float, dict]] = {}  # ClusterTrainingRuntime → when read, as read
        # Trainer scrapes: their own small pool (each run's timer awaits its own, so one in flight per run).
        self._scraper = ThreadPoolExecutor(max_workers=8, thread_name_prefix="atlas-scrape")
        self._result_lock = threading.Lock()
        self._result_reads: dict[tuple, int] = {}  # (namespace, run, run uid, job uid) → pod reads so far
        self._restarts_counted: dict[tuple, int] = {}  # (namespace, run, run uid, JobSet uid) → restarts seen
        # Pods the kubelet cannot start (from the pod watch): (namespace, run) → pod → (reason, message); and the
        # kind of each run reconciled, so a pod's run is known from its app.kubernetes.io/instance label alone.
        self._stuck_lock = threading.Lock()
        self._stuck: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}
        self._kinds: dict[tuple[str, str], str] = {}
        # Saves on SIGTERM (from the pod watch): (namespace, run) → the highest step's stop report and when its
        # container ended; and the step last counted, per (namespace, run, run uid).
        self._stops: dict[tuple[str, str], tuple[StopReport, str | None]] = {}
        self._saves_counted: dict[tuple, int] = {}

    def reconcile(self, body: dict[str, Any], adopt: Callable[[dict, dict], None]) -> Outcome:
        meta = body.get("metadata") or {}
        with self._stuck_lock:
            self._kinds[(meta.get("namespace", "default"), meta.get("name"))] = body.get("kind")
        started_on = _backend_of(body)  # a run keeps the backend it started on when the operator's default changes
        try:
            run = parse_run(body, default_backend=started_on or self.settings.default_backend)
        except InvalidFields as invalid:
            return self.invalid(body, "; ".join(invalid.problems))
        run, revision, result = self.spec_status(run, body, started_on)
        missing = self.missing_prerequisites(run)
        if missing:
            reason, message = missing
            result.conditions.append(condition(Condition.PREREQUISITES_MET, False, reason, message))
            result.events.append(Event("Warning", reason, message))
            return result
        found = f"{run.backend} CRD and referenced objects exist"
        result.conditions.append(condition(Condition.PREREQUISITES_MET, True, "Found", found))
        result.children = child_names(run, self.settings.network.enabled)
        rendered = render_children(run, self.settings.images, reward_yaml(run), self.settings.network)
        desired = [stamp(child, revision) for child in rendered]
        for child in desired:
            adopt(child, body)
        existing, foreign = self.observe_children(run, body, desired)
        if foreign:
            return self.name_conflict(run, body, result, existing, foreign)
        self.prune(run, body, result)  # first: a replaced job never runs beside its successor
        try:
            job, servers = self.apply_children(run, desired, existing, revision, result)
        except NameConflict as conflict:  # made under one of our names since it was read: create nothing more
            return self.name_conflict(run, body, result, existing, [conflict.foreign])
        self.observe(run, body, job, servers, result)
        return result

    def spec_status(self, run: Run, body: dict[str, Any], started_on: str | None) -> tuple[Run, Revision, Outcome]:
        """The run as it will be applied (on the backend it keeps), the revision its children record, and the
        conditions its spec alone decides: Valid, SpecApplied (a backend change kept back), CheckpointsShared."""
        revision = Revision.of(body)
        conditions = [condition(Condition.VALID, True, "SpecValid", "the spec passed validation")]
        if self.keeps_running_on(run, body, started_on):
            job_name = ChildNames(run.name).job
            conditions.append(
                condition(
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
            conditions.append(condition(Condition.CHECKPOINTS_SHARED, False, "CheckpointsNotShared", unshared))
        else:
            where = f"PersistentVolumeClaim {run.spec.checkpoint.pvc}" if run.spec.checkpoint.pvc else "one pod"
            shared = f"every rank's checkpoints are on {where}"
            conditions.append(condition(Condition.CHECKPOINTS_SHARED, True, "Shared", shared))
        return run, revision, Outcome("Pending", conditions, events=events)

    def apply_children(
        self,
        run: Run,
        desired: list[dict[str, Any]],
        existing: dict[tuple[str, str], dict[str, Any] | None],
        revision: Revision,
        result: Outcome,
    ) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any] | None]]:
        """Apply each child in order; ChildrenReady says what the API server refused. Returns the job and the server
        Deployments as applied (name → object)."""
        job, rejected = None, []
        servers: dict[str, dict[str, Any] | None] = {}

        def apply(child: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
            return self.apply(run, child, existing[(child["kind"], child["metadata"]["name"])], revision, result)

        for wave in waves(desired):  # each wave at once, in order (concurrency.py)
            failed = None
            for child, (applied, error) in zip(wave, at_once(self.requests, apply, wave), strict=True):
                if isinstance(error, ApiError) and error.rejected:
                    # The API server refuses this object as rendered: retrying at once changes nothing, so say
                    # why and try again at the next status refresh (the timer), not in a hot loop.
                    rejected.append(
                        f"{child['kind']} {child['metadata']['name']}: {error.status} {error.reason}: {error.message}"
                    )
                    continue
                if error is not None:
                    failed = failed or error  # transient, or a name taken: no later wave (kopf retries the pass)
                    continue
                observed, action = applied
                if action:
                    result.actions[f"{child['kind']}/{child['metadata']['name']}"] = action
                if child["kind"] in kube.JOBS:
                    job = observed
                elif child["kind"] == "Deployment":
                    servers[child["metadata"]["name"]] = observed
            if failed is not None:
                raise failed
        if result.actions:  # the log says what changed; the condition stays put (no status write per pass)
            changes = ", ".join(f"{action} {child}" for child, action in result.actions.items())
            log.info("%s %s/%s: %s", run.kind, run.namespace, run.name, changes)
        if rejected:
            message = "the API server rejected " + "; ".join(rejected)
            result.conditions.append(condition(Condition.CHILDREN_READY, False, "ChildRejected", message))
            result.events.append(Event("Warning", "ChildRejected", message))
        else:
            applied = "all children exist and match the spec"
            result.conditions.append(condition(Condition.CHILDREN_READY, True, "Applied", applied))
        if not any(c["type"] == Condition.SPEC_APPLIED for c in result.conditions):
            current = "the running job matches the spec"
            result.conditions.append(condition(Condition.SPEC_APPLIED, True, "UpToDate", current))
        return job, servers

    def observe(
        self,
        run: Run,
        body: dict[str, Any],
        job: dict[str, Any] | None,
        servers: dict[str, dict[str, Any] | None],
        result: Outcome,
    ) -> None:
        """RolloutReady, PodsStarted, the phase, restarts and Training from the job, and the finished job's result."""
        conditions = result.conditions
        conditions.append(self.rollout_condition(run, job, servers))
        started = self.pods_condition(run)
        conditions.append(started)
        if started["status"] == "False":  # posted once per (reason, message): status_update skips what it said
            result.events.append(Event("Warning", started["reason"], started["message"]))
        gang = self.trainjob_gang(run.namespace, job)
        result.phase = job_phase(job, run.spec.suspend, queued=bool(run.spec.queue_name), gang=gang)
        restarting = gang_of(job, gang)
        if restarting is not None:
            self.observe_restarts(run, body, restarting, result)
        self.observe_preemption(run, body, result)
        if job is not None and result.phase == "Queued" and self.preempted(body, job, result):
            shown = (body.get("status") or {}).get("preemption")
            reason, message = PREEMPTED, preempted_message(result.preemption or shown)
        elif job is not None:
            reason, message = training_reason(job, gang)
        elif run.spec.queue_name and run.spec.suspend:  # its job was deleted (Kueue owns a queued job's suspend)
            reason, message = "Suspended", f"spec.suspend: no {run.backend} while suspended; resuming queues a new one"
        else:  # not created (yet): say which kind of job the run waits for
            reason, message = "JobPending", f"waiting for the {run.backend} to start"
        conditions.append(condition(Condition.TRAINING, result.phase == "Running", reason, message))
        if job is not None and result.phase == "Succeeded":
            if not (body.get("status") or {}).get("result"):
                result.result = self.read_result(run, gang or job, result.events)
        elif job is not None:
            result.result_stale = True  # a job made again (spec change) has not reported yet

    @staticmethod
    def preempted(body: dict[str, Any], job: dict[str, Any], result: Outcome) -> bool:
        """Whether Kueue suspended the run's queued job again after admitting it (preemption, eviction), not a job it
        never admitted: the job's own conditions say so on PyTorchJob (job_ran); a JobSet's or a TrainJob's do not,
        so there the run's previous status does: Running, or already Preempted. A job this reconciliation created or
        recreated (a spec change) is a new one, waiting for its first admission."""
        if any(
            action in ("created", "recreated")
            for child, action in result.actions.items()
            if child.startswith(f"{job.get('kind')}/")
        ):
            return False
        if job_ran(job):
            return True
        status = body.get("status") or {}
        training = next((c for c in status.get("conditions") or [] if c.get("type") == Condition.TRAINING), {})
        return status.get("phase") == "Running" or (
            status.get("phase") == "Queued" and training.get("reason") == PREEMPTED
        )

    def trainjob_gang(self, namespace: str, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """The JobSet the Kubeflow Trainer made of a TrainJob (its name; controlled by the TrainJob), read only:
        its restarts and replicated jobs are the run's on TrainJob too. None for another job, or before it exists."""
        if job is None or job.get("kind") != "TrainJob":
            return None
        jobset = self.kube.get(kube.JOBSET, namespace, job["metadata"]["name"])
        return jobset if jobset is not None and is_controlled_by(jobset, job) else None

    def observe_restarts(self, run: Run, body: dict[str, Any], job: dict[str, Any], result: Outcome) -> None:
        """A JobSet's whole-gang restarts, and a Warning for each new one the step watchdog caused — counted once
        per restart, even when two reconciliations read the run before either wrote its status (a TrainJob's
        JobSet and the TrainJob itself change together)."""
        result.restarts = int((job.get("status") or {}).get("restarts") or 0)
        key = (run.namespace, run.name, run.uid, (job.get("metadata") or {}).get("uid"))
        with self._result_lock:
            counted = self._restarts_counted.get(key, 0)
            shown = int((body.get("status") or {}).get("restarts") or 0)
            result.watchdog_restarts = watchdog_restarts(job, {"restarts": max(counted, shown)})
            self._restarts_counted[key] = max(counted, result.restarts)
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

    def invalid(self, body: dict[str, Any], message: str) -> Outcome:
        """An invalid spec: nothing is created or changed. An edit that makes a running run invalid leaves
        its job running on the last valid spec, and the status keeps reporting that job."""
        conditions = [condition(Condition.VALID, False, "InvalidSpec", message)]
        events = [Event("Warning", "InvalidSpec", message)]
        meta = body.get("metadata") or {}
        children = (body.get("status") or {}).get("children") or {}
        kind = _backend_of(body) or "PyTorchJob"
        job_name = children.get("jobSet") or children.get("trainJob") or children.get("pytorchJob")
        namespace = meta.get("namespace", "default")
        job = self.kube.get(kube.JOBS[kind], namespace, job_name) if job_name else None
        if job is None or not is_controlled_by(job, body):
            return Outcome("Invalid", conditions, events=events)
        queued = bool((body.get("spec") or {}).get("queueName"))
        gang = self.trainjob_gang(namespace, job)
        phase = job_phase(job, job_suspended(job) and not queued, queued=queued, gang=gang)
        reason, job_message = training_reason(job, gang)
        conditions += [
            condition(
                Condition.SPEC_APPLIED, False, "InvalidSpec", f"{kind} {job_name} runs the last valid spec; {message}"
            ),
            condition(Condition.TRAINING, phase == "Running", reason, job_message),
        ]
        children = dict((body.get("status") or {}).get("children") or {})
        return Outcome(phase, conditions, children=children, events=events)

    def forget(self, body: dict[str, Any]) -> None:
        """Drop what is cached for a deleted run."""
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", "default"), meta.get("name"), meta.get("uid"))
        with self._result_lock:
            for read in [k for k in self._result_reads if k[:3] == key]:
                del self._result_reads[read]
            for counted in [k for k in self._restarts_counted if k[:3] == key]:
                del self._restarts_counted[counted]
            self._saves_counted.pop(key, None)
        with self._stuck_lock:
            self._stuck.pop(key[:2], None)
            self._kinds.pop(key[:2], None)
            self._stops.pop(key[:2], None)
