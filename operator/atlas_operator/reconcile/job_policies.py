"""The job's policies, one place each: recreate on a spec change (a user's only: atlas_operator/revisions.py), a
queued run's suspend (Kueue owns it), and a backend change (kept back while it would lose progress)."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import SPEC_HASH_ANNOTATION, ChildNames
from atlas_operator import backends
from atlas_operator.kube import ApiError, Kube
from atlas_operator.ownership import is_controlled_by
from atlas_operator.reconcile.conditions import condition
from atlas_operator.reconcile.errors import RetryLater
from atlas_operator.reconcile.patching import managed_patch
from atlas_operator.revisions import Revision
from atlas_operator.run_status import ConditionType as Condition
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run
from atlas_operator.status_update import FINISHED, Event, Outcome, job_phase, job_suspended


class JobPolicies:
    """What happens to the running job when the run changes."""

    def __init__(self, client: Kube):
        self.kube = client

    def apply_job(
        self, run: Run, desired: dict[str, Any], existing: dict[str, Any], revision: Revision, result: Outcome
    ) -> tuple[dict[str, Any] | None, str | None]:
        """A running job's pods never change (a job's pod templates may be immutable, and Kueue owns parts of
        them), so a change of the run's spec that changes the job recreates it; the trainer then resumes
        from the newest checkpoint on spec.checkpoint.pvc. Without a PVC the checkpoints die with the pods, so a
        running job is left running and SpecApplied says why. A queued run's suspend is Kueue's: suspending it
        deletes the job. Only ``suspend`` (not queued) is applied in place; an operator upgrade changes nothing."""
        kind, name = desired["kind"], desired["metadata"]["name"]
        if existing.get("metadata", {}).get("deletionTimestamp"):
            raise RetryLater(f"{kind} {name} is still being deleted")
        finished = job_phase(existing, False) in FINISHED
        # A finished job, or one suspended (no pods: Kueue has not admitted it, or preempted it), loses nothing.
        keeps_progress = bool(run.spec.checkpoint.pvc) or finished or job_suspended(existing)
        if run.spec.queue_name and run.spec.suspend:
            if keeps_progress:
                return self._delete_queued_job(run, kind, name, result)
            result.conditions.append(_suspend_needs_checkpoint(kind, name))
        changed = revision.changed_since(existing)
        if changed and _spec_hash(existing) != _spec_hash(desired):
            if keeps_progress:
                return self.recreate_job(run, desired, result)
            result.conditions.append(_restart_needs_checkpoint(kind, name))
            changed = False  # not applied: the job still records the revision it runs
        return self._patch_in_place(run, kind, name, existing, revision, changed)

    def _delete_queued_job(self, run: Run, kind: str, name: str, result: Outcome) -> tuple[None, str]:
        """spec.suspend on a queued run: Kueue owns the job's suspend, so the job goes (its quota released)."""
        self.kube.delete(backends.BACKENDS[kind].resource, run.namespace, name)
        where = f"{run.spec.checkpoint.path}/{run.name}"
        result.events.append(
            Event(
                "Normal",
                EventReason.QUEUED_RUN_SUSPENDED,
                f"spec.suspend: deleted {kind} {name} (Kueue owns its suspend), releasing its quota; "
                f"resuming queues it again and training resumes from the newest checkpoint in {where}",
            )
        )
        return None, "deleted"

    def _patch_in_place(
        self, run: Run, kind: str, name: str, existing: dict[str, Any], revision: Revision, changed: bool
    ) -> tuple[dict[str, Any], str | None]:
        """What may change on a running job: the revision it records, and (not queued) ``suspend``."""
        wanted: dict[str, Any] = {}
        if changed and not revision.is_recorded_on(existing):
            wanted["metadata"] = {"annotations": revision.annotations(kind)}
        if not run.spec.queue_name:  # a queued job's suspend is Kueue's: never written after creation
            wanted["spec"] = backends.BACKENDS[kind].suspend_patch(run.spec.suspend)
        patch = managed_patch(wanted, existing)
        if patch is None:
            return existing, None
        return self.kube.patch(backends.BACKENDS[kind].resource, run.namespace, name, patch), "patched"

    def recreate_job(self, run: Run, desired: dict[str, Any], result: Outcome) -> tuple[dict[str, Any], str]:
        kind, name = desired["kind"], desired["metadata"]["name"]
        self.kube.delete(backends.BACKENDS[kind].resource, run.namespace, name)
        result.events.append(
            Event(
                "Normal",
                EventReason.JOB_RECREATED,
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

    def keeps_running_on(self, run: Run, body: dict[str, Any], started_on: str | None) -> bool:
        """Whether a run whose spec.backend moved keeps its current job: it still runs and, without
        spec.checkpoint.pvc, a job on the other backend would start training from step 0."""
        if started_on is None or run.backend == started_on or run.spec.checkpoint.pvc:
            return False
        job = self.kube.get(backends.BACKENDS[started_on].resource, run.namespace, ChildNames(run.name).job)
        return job is not None and is_controlled_by(job, body) and job_phase(job, False) not in FINISHED


def backend_of(body: dict[str, Any]) -> str | None:
    """The backend a run's job was made on (from status.children), or None before it has one."""
    made = backends.job_child((body.get("status") or {}).get("children") or {})
    return made[0].kind if made else None


def _spec_hash(job: dict[str, Any]) -> str | None:
    return (job.get("metadata", {}).get("annotations") or {}).get(SPEC_HASH_ANNOTATION)


def _suspend_needs_checkpoint(kind: str, name: str) -> dict[str, Any]:
    return condition(
        Condition.SPEC_APPLIED,
        False,
        "SuspendNeedsCheckpoint",
        f"spec.suspend: Kueue owns {kind} {name}'s suspend (spec.queueName), so suspending means deleting "
        "the job, and without spec.checkpoint.pvc that loses all progress; it keeps running (delete "
        "the run to stop it, or set spec.checkpoint.pvc for future runs)",
    )


def _restart_needs_checkpoint(kind: str, name: str) -> dict[str, Any]:
    return condition(
        Condition.SPEC_APPLIED,
        False,
        "RestartNeedsCheckpoint",
        f"the spec changed, but a running {kind} cannot be updated and spec.checkpoint.pvc is not set, "
        f"so a restart would lose all progress; delete {kind} {name} to restart from scratch "
        "(the operator recreates it), or set spec.checkpoint.pvc for future runs",
    )
