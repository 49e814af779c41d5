"""What the run's status reports of what runs: the job's phase, restarts and preemption, servers Ready, pods that
cannot start, the trainer's result."""

from __future__ import annotations

import logging
from typing import Any

from atlas_contract.metrics import PROGRESS
from atlas_contract.names import KINDS, LABEL_COMPONENT, LABEL_INSTANCE
from atlas_contract.results import parse_result
from atlas_contract.sources import REASONS
from atlas_operator import backends, kube
from atlas_operator.kube import ApiError, Kube
from atlas_operator.manifests import child_names
from atlas_operator.reconcile.conditions import condition
from atlas_operator.reconcile.memory import RunMemory
from atlas_operator.render import has_student_server
from atlas_operator.render.sources import needs_sources, source_uris
from atlas_operator.run_status import ConditionType as Condition
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run
from atlas_operator.status_update import (
    FINISHED,
    PREEMPTED,
    Event,
    Outcome,
    export_failure,
    job_phase,
    job_ran,
    job_state,
    now,
    pod_stuck,
    preempted_message,
    save_message,
    sources_failure,
    stop_report,
    termination_message,
    training_reason,
)
from atlas_operator.tracking_status import tracking_condition

log = logging.getLogger("atlas_operator")

# Reads of a succeeded job's Master pod for the run's result, per job and operator process: a pod that is gone
# or carries no result is not read again at every status refresh.
MAX_RESULT_READS = 3


class Observation:
    """Conditions and the result read from the cluster (pods, Deployments, the job), and what the run's pods said
    between reconciliations (kept in ``memory``)."""

    def __init__(self, client: Kube, memory: RunMemory):
        self.kube = client
        self.memory = memory

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
            result.events.append(Event("Warning", EventReason(started["reason"]), started["message"]))
        gang = self.gang(run.namespace, job)
        result.phase = job_phase(job, run.spec.suspend, queued=bool(run.spec.queue_name), gang=gang)
        restarting = backends.of_job(job).restarting_gang(job, gang) if job is not None else None
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
                if result.result is not None:  # the export: .status.output, not the result's
                    result.output = result.result.pop("output", None)
                    result.result.pop("exportError", None)
                    result.tracking = result.result.pop("tracking", None)
                    # The run's last figures: it may end before any scrape saw them (kubectl get's columns).
                    result.progress = {k: result.result[k] for k in PROGRESS if k in result.result}
        elif job is not None:
            result.result_stale = True  # a job made again (spec change) has not reported yet
        self.observe_sources(run, body, result)
        self.observe_export(run, body, result)
        self.observe_tracking(run, body, result)

    @staticmethod
    def preempted(body: dict[str, Any], job: dict[str, Any], result: Outcome) -> bool:
        """Whether Kueue suspended the run's queued job again after admitting it (preemption, eviction), not a job it
        never admitted: the job's own conditions say so where its backend keeps the trace (job_ran); elsewhere the
        run's previous status does: Running, or already Preempted. A job this reconciliation created or
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
        training: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == Condition.TRAINING), {}
        )
        return status.get("phase") == "Running" or (
            status.get("phase") == "Queued" and training.get("reason") == PREEMPTED
        )

    def gang(self, namespace: str, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """What the job's controller made of it whose state is the run's too (Backend.read_gang), or None."""
        return None if job is None else backends.of_job(job).read_gang(self.kube, namespace, job)

    def observe_restarts(self, run: Run, body: dict[str, Any], job: dict[str, Any], result: Outcome) -> None:
        """The gang's whole-gang restarts (``job``: the backend's restarting_gang), and a Warning for each new one
        the step watchdog caused — counted once per restart, even when two reconciliations read the run before
        either wrote its status (a job and the gang made of it change together)."""
        result.restarts = int((job.get("status") or {}).get("restarts") or 0)
        key = (run.namespace, run.name, run.uid, (job.get("metadata") or {}).get("uid"))
        shown = int((body.get("status") or {}).get("restarts") or 0)
        seen = self.memory.restarts_seen(key, shown, result.restarts)
        result.watchdog_restarts = backends.of_job(job).watchdog_restarts(job, {"restarts": seen})
        if result.watchdog_restarts:
            result.events.append(
                Event(
                    "Warning",
                    EventReason.WATCHDOG_RESTART,
                    f"the step watchdog ended a trainer process of {job['kind']} {job['metadata']['name']} (no "
                    f"optimizer step within spec.training.stepTimeoutSeconds, or a server unreachable): restart "
                    f"{result.restarts} of {run.spec.max_restarts}; the trainer log has the stacks and the reason",
                )
            )

    def rollout_condition(
        self, run: Run, job: dict[str, Any] | None, observed: dict[str, dict[str, Any] | None] | None = None
    ) -> dict[str, Any]:
        """Whether the servers are Ready: their Deployments (``observed``: as just applied, else read), or (a
        backend that runs them in its job) the job's servers."""
        observed = observed or {}
        backend = backends.for_run(run)
        if backend.servers_in_job:
            servers = ["rollout"] * bool(run.spec.rollout.replicas) + ["student"] * has_student_server(run)
        else:
            names = child_names(run)
            servers = [names[c] for c in ("rollout", "student") if c in names]
        if not servers:
            return condition(Condition.ROLLOUT_READY, True, "NotNeeded", "generation runs inside the trainer")
        if backend.servers_in_job:
            waiting = (
                backend.servers_waiting(job) if job is not None else [f"{c}: no {backend.kind} yet" for c in servers]
            )
            if job is not None and job_state(job)[0] in FINISHED:  # the job deletes its servers when it finishes
                return condition(
                    Condition.ROLLOUT_READY, False, "Finished", f"{backend.kind} {job['metadata']['name']} has finished"
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
            return condition(Condition.ROLLOUT_READY, False, "Waiting", "; ".join(waiting))
        return condition(Condition.ROLLOUT_READY, True, "Ready", f"{', '.join(servers)} ready")

    def pod_changed(self, pod: dict[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """Note whether a run's pod is stuck before starting (pod_stuck: a missing pull Secret, a Secret its env
        names, a bad image), and a trainer pod's stop report (a save on SIGTERM: stop_report; a deleted pod's last
        state too, since the kubelet posts it before the pod goes). Returns the run's (kind, name) when that changes
        what its status should say, else None (also for a run this process has not reconciled yet: its first
        reconciliation reads what is noted). The run is known from the pod's labels alone, no API call."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        run_name, pod_name = labels.get(LABEL_INSTANCE), meta.get("name")
        if not run_name or not pod_name:
            return None
        stuck = None if deleted else pod_stuck(pod)
        trainer = labels.get(LABEL_COMPONENT) == "trainer"
        stop = stop_report(pod) if trainer else None
        failures = (None, None) if deleted else (sources_failure(pod), export_failure(pod, _container_of(pod)))
        namespace = meta.get("namespace", "default")
        changed, kind = self.memory.note_pod(namespace, run_name, pod_name, stuck, stop, failures)
        return (kind, run_name) if changed and kind in KINDS else None

    def observe_sources(self, run: Run, body: dict[str, Any], result: Outcome) -> None:
        """SourcesReady, for a run that names an S3, hub or PVC source: False with the fetcher's reason (a Warning
        Event too) while a pod's initializer reports a failure; True once the trainer got past its sources (it
        reports progress, succeeded, or reports an export); else False Fetching. An endpoint that did not answer
        within the fetcher's bounded wait (Unreachable) fails the run. AccessDenied and NotFound are retried with
        the kubelet's back-off: a trainer's restarts count toward its job's limit (spec.maxRestarts), so the phase
        follows the job (a fixed Secret or an uploaded object in time lets the run go on); a server retries
        until it fetches."""
        if not needs_sources(run):
            return
        status = body.get("status") or {}
        past = (
            bool(status.get("progress") or result.progress or status.get("output") or result.output)
            or result.phase == "Succeeded"
            or bool(self.memory.export_failures(run.namespace, run.name))
        )
        failures = [] if past else self.memory.source_failures(run.namespace, run.name)
        if failures:
            pod, failure = failures[0]
            said = failure.message if failure.uri in failure.message else f"{failure.uri}: {failure.message}"
            message = f"{said} (pod {pod})"
            result.conditions.append(condition(Condition.SOURCES_READY, False, failure.reason, message))
            if failure.reason in REASONS:
                result.events.append(Event("Warning", EventReason(failure.reason), message))
            if failure.reason == EventReason.UNREACHABLE:
                result.phase = "Failed"
            return
        if past:
            ready = condition(Condition.SOURCES_READY, True, "Fetched", "the run's sources are whole on its volume")
        else:
            ready = condition(Condition.SOURCES_READY, False, "Fetching", f"fetching {', '.join(source_uris(run))}")
        result.conditions.append(ready)

    def observe_export(self, run: Run, body: dict[str, Any], result: Outcome) -> None:
        """Exported, for a run with spec.output: True with .status.output once the finished trainer reported its
        export; False with the export's reason (a Warning Event too) while a trainer pod reports a failed one (the
        model stays on the checkpoint volume; the restarted pod retries the export alone); else False Pending."""
        if run.spec.output is None:
            return
        shown = (body.get("status") or {}).get("output")
        output = result.output or (None if result.result_stale else shown)
        failures = self.memory.export_failures(run.namespace, run.name)
        if output:
            message = f"{output.get('files')} files, {output.get('bytes')} bytes at {output.get('uri')}"
            result.conditions.append(condition(Condition.EXPORTED, True, "Exported", message))
        elif failures:
            pod, failure = failures[0]
            message = f"{failure.message} (pod {pod}); the model stays on the checkpoint volume; the export is retried"
            reason = failure.reason if failure.reason in REASONS else EventReason.EXPORT_FAILED
            result.conditions.append(condition(Condition.EXPORTED, False, reason, message))
            result.events.append(Event("Warning", EventReason(reason), message))
        else:
            waiting = f"the trained model is exported to {run.spec.output.uri} when training succeeds"
            result.conditions.append(condition(Condition.EXPORTED, False, "Pending", waiting))

    @staticmethod
    def observe_tracking(run: Run, body: dict[str, Any], result: Outcome) -> None:
        """Tracking, for a run with spec.tracking.mlflow: True with the tracking run once the finished trainer reported
        it, False when it succeeded without one (its server never answered: a Warning Event too, unless a tick posted
        one while it ran); while it runs, the tick's scrape says (handlers.tracking_patch), and before that Waiting."""
        if run.spec.tracking is None or run.spec.tracking.mlflow is None:
            return
        uri = run.spec.tracking.mlflow.uri
        status = body.get("status") or {}
        finished = result.tracking or (status.get("tracking") if result.phase == "Succeeded" else None)
        shown = next((c for c in status.get("conditions") or [] if c.get("type") == Condition.TRACKING), None)
        if result.phase == "Succeeded" and not finished:
            message = f"the run ended with no MLflow run: MLflow at {uri} did not answer the trainer"
            result.conditions.append(condition(Condition.TRACKING, False, EventReason.TRACKING_UNREACHABLE, message))
            if (shown or {}).get("reason") != EventReason.TRACKING_UNREACHABLE:  # no tick saw it Running: say it here
                result.events.append(Event("Warning", EventReason.TRACKING_UNREACHABLE, message))
        elif finished or shown is None:
            result.conditions.append(tracking_condition(uri, None, finished if result.phase == "Succeeded" else None))

    def observe_preemption(self, run: Run, body: dict[str, Any], result: Outcome) -> None:
        """A save on SIGTERM newer than the run's status shows (pod_changed noted it): .status.preemption, a Normal
        Event PreemptionSave and one more atlas_training_preemption_saves_total. Counted once per run and step:
        every node reports the same step, a pod is seen again, an operator restarted reads the step from the
        status, and two reconciliations that read the run before either wrote its status see this process's count."""
        noted = self.memory.stop_of(run.namespace, run.name)
        if noted is None:
            return
        report, finished = noted
        created = (body.get("metadata") or {}).get("creationTimestamp")
        if finished and created and finished < created:  # RFC 3339 UTC: a pod of an earlier run of this name
            return
        shown = (body.get("status") or {}).get("preemption") or {}
        if not self.memory.count_save(run.namespace, run.name, run.uid, report.step, shown.get("step")):
            return
        result.preemption = {
            "saves": int(shown.get("saves") or 0) + 1,
            "step": report.step,
            "seconds": round(report.seconds, 1),
            "time": finished or now(),
        }
        result.preemption_saves = 1
        result.events.append(Event("Normal", EventReason.PREEMPTION_SAVE, save_message(report)))

    def run_of_gang(self, obj: dict[str, Any]) -> dict[str, str] | None:
        """The run (``{"kind", "name"}``) of an object a backend's job controller made of the run's job (its
        run_name_of); None for anything else, or a run this process has not reconciled yet (its first
        reconciliation reads it)."""
        meta = obj.get("metadata") or {}
        run_name = next(filter(None, (b.run_name_of(obj) for b in backends.BACKENDS.values())), None)
        if not run_name:
            return None
        kind = self.memory.kind_of(meta.get("namespace", "default"), run_name)
        return {"kind": kind, "name": run_name} if kind in KINDS else None

    def pods_condition(self, run: Run) -> dict[str, Any]:
        """PodsStarted: False with the kubelet's reason while a pod of the run cannot start its containers."""
        stuck = self.memory.stuck_pods(run.namespace, run.name)
        if not stuck:
            return condition(Condition.PODS_STARTED, True, "NoneStuck", "no pod of the run is kept from starting")
        _, (reason, message) = stuck[0]
        more = f" ({len(stuck) - 1} more pods stuck)" if len(stuck) > 1 else ""
        return condition(Condition.PODS_STARTED, False, reason, message + more)

    def read_result(self, run: Run, job: dict[str, Any], events: list[Event]) -> dict[str, Any] | None:
        """``.status.result`` from the succeeded job's rank-0 pod (Backend.rank0_pod): its trainer container's
        termination message (atlas_contract.results), or None. A pod that is gone, belongs to an earlier job, or
        carries no parsable message gives None, and is read at most MAX_RESULT_READS times per job. A value out of
        its schema range is left out, with a Warning in ``events``."""
        job_uid = (job.get("metadata") or {}).get("uid")
        key = (run.namespace, run.name, run.uid, job_uid)
        if not self.memory.take_result_read(key, MAX_RESULT_READS):
            return None
        try:
            pod = self.rank0_pod(run, job)
        except ApiError as exc:  # no pods permission (an older chart), the API down: no result, no crash
            log.warning("%s %s/%s: no rank-0 pod to read the result from: %s", run.kind, run.namespace, run.name, exc)
            return None
        if pod is None:
            log.info("%s %s/%s: no rank-0 pod of the succeeded job: no result", run.kind, run.namespace, run.name)
            return None
        parsed, dropped = parse_result(termination_message(pod, backends.for_run(run).trainer.container))
        if dropped:  # the trainer's word, out of the schema's range: never shown, said once
            dropped_message = "the finished trainer's result: " + "; ".join(dropped)
            events.append(Event("Warning", EventReason.RESULT_OUT_OF_RANGE, dropped_message))
            if parsed is None:
                self.memory.stop_result_reads(key, MAX_RESULT_READS)
        if parsed is None:
            log.info(
                "%s %s/%s: pod %s has no result in its termination message",
                run.kind,
                run.namespace,
                run.name,
                (pod.get("metadata") or {}).get("name"),
            )
            return None
        self.memory.result_read(key)
        return parsed

    def rank0_pod(self, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        """The trainer's pod of rank 0 of ``job``, as the job's backend finds it."""
        return backends.of_job(job).rank0_pod(self.kube, run, job)


def _container_of(pod: dict[str, Any]) -> str:
    """The trainer container's name in a run's pod (its backend's TrainerShape.container), the first container's
    for any pod: only a trainer reports an export."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return str(containers[0].get("name"))
