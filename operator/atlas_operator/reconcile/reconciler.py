"""The reconciliation of a run, step by step (parse, spec, prerequisites, children, observation)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from atlas_contract.errors import InvalidFields
from atlas_contract.names import ChildNames
from atlas_operator import backends
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import Kube
from atlas_operator.manifests import child_names, render_children
from atlas_operator.ownership import is_controlled_by
from atlas_operator.reconcile.children import Children, reward_yaml
from atlas_operator.reconcile.concurrency import pool
from atlas_operator.reconcile.conditions import condition
from atlas_operator.reconcile.errors import NameConflict
from atlas_operator.reconcile.job_policies import JobPolicies, backend_of
from atlas_operator.reconcile.memory import RunMemory
from atlas_operator.reconcile.observe import Observation
from atlas_operator.reconcile.prerequisites import Prerequisites
from atlas_operator.reconcile.scrape import Scraping
from atlas_operator.render import best_effort_warning, has_student_server
from atlas_operator.revisions import Revision, stamp
from atlas_operator.run_status import ConditionType as Condition
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run
from atlas_operator.status_update import Event, Outcome, job_phase, job_suspended, training_reason
from atlas_operator.validation import parse_run


class Reconciler:
    """One reconciliation of a run, in steps: the spec (Valid, SpecApplied, CheckpointsShared: here), the
    prerequisites, the children (ownership first), then what is observed (servers, pods, the job's phase, the
    result). Each step is an object of its own, given what it needs:

    - ``prerequisites`` (Prerequisites: the client, the settings; the CRDs and runtime it found, for a while),
    - ``jobs`` (JobPolicies: the client) — recreate, suspend, a backend change,
    - ``children`` (Children: the client, the ``requests`` pool, ``prerequisites``, ``jobs``),
    - ``observation`` (Observation: the client, ``memory``),
    - ``scraping`` (Scraping: the settings; its own pool),

    and ``memory`` (RunMemory) is what the operator remembers per run between reconciliations; the handlers keep
    theirs there too, and ``memory.forget`` drops it all when the run is deleted."""

    def __init__(self, client: Kube, settings: OperatorConfig | None = None, memory: RunMemory | None = None):
        self.kube = client
        self.settings = settings or OperatorConfig()
        self.memory = memory or RunMemory()
        self.requests = pool()  # a run's requests that do not wait on each other (concurrency.py)
        self.prerequisites = Prerequisites(client, self.settings)
        self.jobs = JobPolicies(client)
        self.children = Children(client, self.requests, self.prerequisites, self.jobs)
        self.observation = Observation(client, self.memory)
        self.scraping = Scraping(self.settings)

    def reconcile(self, body: dict[str, Any], adopt: Callable[[dict[str, Any], dict[str, Any]], None]) -> Outcome:
        meta = body.get("metadata") or {}
        kind, name = body.get("kind"), meta.get("name")
        if isinstance(kind, str) and isinstance(name, str):  # as every run from the API
            self.memory.note_kind(meta.get("namespace", "default"), name, kind)
        started_on = backend_of(body)  # a run keeps the backend it started on when the operator's default changes
        try:
            run = parse_run(body, default_backend=started_on or self.settings.default_backend)
        except InvalidFields as invalid:
            return self.invalid(body, "; ".join(invalid.problems))
        run, revision, result = self.spec_status(run, body, started_on)
        missing = self.prerequisites.missing(run)
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
        existing, foreign = self.children.observe(run, body, desired)
        if foreign:
            return self.children.name_conflict(run, body, result, existing, foreign)
        self.children.prune(run, body, result)  # first: a replaced job never runs beside its successor
        try:
            job, servers = self.children.apply_all(run, desired, existing, revision, result)
        except NameConflict as conflict:  # a name taken (the create's AlreadyExists): every taken name said at once
            self.children.take_back(run, result)
            existing, foreign = self.children.observe(run, body, desired, look=True, fresh=True)
            return self.children.name_conflict(run, body, result, existing, foreign or [conflict.foreign])
        self.observation.observe(run, body, job, servers, result)
        return result

    def spec_status(self, run: Run, body: dict[str, Any], started_on: str | None) -> tuple[Run, Revision, Outcome]:
        """The run as it will be applied (on the backend it keeps), the revision its children record, and the
        conditions its spec alone decides: Valid, SpecApplied (a backend change kept back), CheckpointsShared,
        ServersRequestResources."""
        revision = Revision.of(body)
        conditions = [condition(Condition.VALID, True, "SpecValid", "the spec passed validation")]
        if started_on is not None and self.jobs.keeps_running_on(run, body, started_on):
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
        unshared = backends.checkpoint_warning(run)
        events = [Event("Warning", EventReason.CHECKPOINTS_NOT_SHARED, unshared)] if unshared else []
        if unshared:
            conditions.append(
                condition(Condition.CHECKPOINTS_SHARED, False, EventReason.CHECKPOINTS_NOT_SHARED, unshared)
            )
        else:
            where = f"PersistentVolumeClaim {run.spec.checkpoint.pvc}" if run.spec.checkpoint.pvc else "one pod"
            shared = f"every rank's checkpoints are on {where}"
            conditions.append(condition(Condition.CHECKPOINTS_SHARED, True, "Shared", shared))
        best_effort = best_effort_warning(run)
        if best_effort:
            events.append(Event("Warning", EventReason.SERVERS_BEST_EFFORT, best_effort))
            conditions.append(
                condition(Condition.SERVERS_REQUEST_RESOURCES, False, EventReason.SERVERS_BEST_EFFORT, best_effort)
            )
        else:
            requested = (
                "every vLLM server the run renders requests CPU or memory (its pods are Burstable or Guaranteed)"
                if run.spec.rollout.replicas or has_student_server(run)
                else "the run has no vLLM server"
            )
            conditions.append(condition(Condition.SERVERS_REQUEST_RESOURCES, True, "Requested", requested))
        return run, revision, Outcome("Pending", conditions, events=events)

    def invalid(self, body: dict[str, Any], message: str) -> Outcome:
        """An invalid spec: nothing is created or changed. An edit that makes a running run invalid leaves
        its job running on the last valid spec, and the status keeps reporting that job."""
        conditions = [condition(Condition.VALID, False, EventReason.INVALID_SPEC, message)]
        events = [Event("Warning", EventReason.INVALID_SPEC, message)]
        meta = body.get("metadata") or {}
        children = (body.get("status") or {}).get("children") or {}
        made = backends.job_child(children)
        if made is None:
            return Outcome("Invalid", conditions, events=events)
        backend, job_name = made
        kind = backend.kind
        namespace = meta.get("namespace", "default")
        job = self.kube.get(backend.resource, namespace, job_name)
        if job is None or not is_controlled_by(job, body):
            return Outcome("Invalid", conditions, events=events)
        queued = bool((body.get("spec") or {}).get("queueName"))
        gang = self.observation.gang(namespace, job)
        phase = job_phase(job, job_suspended(job) and not queued, queued=queued, gang=gang)
        reason, job_message = training_reason(job, gang)
        conditions += [
            condition(
                Condition.SPEC_APPLIED,
                False,
                EventReason.INVALID_SPEC,
                f"{kind} {job_name} runs the last valid spec; {message}",
            ),
            condition(Condition.TRAINING, phase == "Running", reason, job_message),
        ]
        children = dict((body.get("status") or {}).get("children") or {})
        return Outcome(phase, conditions, children=children, events=events)

    # -- what the handlers ask of it besides a reconciliation

    def pod_changed(self, pod: dict[str, Any], deleted: bool = False) -> tuple[str, str] | None:
        """The run (kind, name) whose status a change of ``pod`` changes, else None (Observation.pod_changed)."""
        return self.observation.pod_changed(pod, deleted=deleted)

    def run_of(self, child: dict[str, Any]) -> dict[str, Any] | None:
        """The run (``{"kind", "name"}``) a changed object belongs to: its controller, or for an object a backend's
        job controller made of the run's job, the run its labels name; None for anything else."""
        return self.children.owning_run(child) or self.observation.run_of_gang(child)

    async def scrape(self, meta: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        return await self.scraping.scrape(meta)
