"""A run's children: observed, checked for ownership (ownership.py), created or patched, pruned and deleted."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from atlas_contract.checks import find_reward_config
from atlas_contract.names import KINDS
from atlas_operator import backends, kube
from atlas_operator.kube import ApiError, Kube
from atlas_operator.ownership import Foreign, conflict_message, is_controlled_by, name_taken_message, rival_run
from atlas_operator.reconcile.concurrency import at_once, waves
from atlas_operator.reconcile.conditions import condition
from atlas_operator.reconcile.errors import NameConflict, RetryLater
from atlas_operator.reconcile.job_policies import JobPolicies
from atlas_operator.reconcile.patching import managed_patch
from atlas_operator.reconcile.prerequisites import Prerequisites
from atlas_operator.revisions import PINNED_KINDS, Revision
from atlas_operator.run_status import ConditionType as Condition
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run
from atlas_operator.status_update import Event, Outcome, job_phase

log = logging.getLogger("atlas_operator")

# status.children key → what the run may own under it (deleted when the spec no longer wants it).
OWNED_BY_KEY = {
    **{backend.child_key: (backend.resource,) for backend in backends.BACKENDS.values()},
    "rollout": (kube.DEPLOYMENT, kube.SERVICE),
    "student": (kube.DEPLOYMENT, kube.SERVICE),
    "networkPolicy": (kube.NETWORK_POLICY,),  # operator setting network_policy turned off
    "trainerNetworkPolicy": (kube.NETWORK_POLICY,),
}


class Children:
    """Observing, applying, pruning and deleting the run's children; the job itself goes to ``jobs``. A run's requests
    that do not wait on each other go out together through ``requests`` (concurrency.py)."""

    def __init__(self, client: Kube, requests: ThreadPoolExecutor, prerequisites: Prerequisites, jobs: JobPolicies):
        self.kube = client
        self.requests = requests
        self.prerequisites = prerequisites  # which job CRDs are served (a job of another is neither made nor read)
        self.jobs = jobs

    def observe(
        self, run: Run, body: dict[str, Any], desired: list[dict[str, Any]], look: bool = False, fresh: bool = False
    ) -> tuple[dict[tuple[str, str], dict[str, Any] | None], list[Foreign]]:
        """Each child as it stands now (None: absent), and the objects under a child's name this run does not control.
        The run's own children are in the watch (and what this operator wrote a moment ago, not in the watch yet, is
        asked for); a name the watch does not show is taken as free, as Go controllers do from their informers: the
        create finds it taken by its AlreadyExists (``apply``). Only a run that met a name conflict (``look``, or its
        ChildrenReady says so) asks the API server's cache for each name, since an object someone else made there
        carries none of the labels the watch selects; ``fresh``: from etcd, not the cache (right after a create found a
        name taken, the cache may not show every object made a moment before: the conflict is said whole at once)."""
        looking = look or met_a_name_conflict(body)

        def look_up(child: dict[str, Any]) -> dict[str, Any] | None:
            resource, name = kube.resource_of(child), child["metadata"]["name"]
            if fresh:
                return self.kube.get_fresh(resource, run.namespace, name)
            return self.kube.get(resource, run.namespace, name, absent_unless_watched=not looking, cached=looking)

        # A run looking at its names asks the API server, all at once; the others are answered by the watch.
        if looking:
            found = at_once(self.requests, look_up, desired)
        else:
            found = [(look_up(c), None) for c in desired]
        existing, foreign = {}, []
        for child, (obj, error) in zip(desired, found, strict=True):
            if error is not None:
                raise error
            existing[_key(child)] = obj
            if obj is not None and not is_controlled_by(obj, body):
                foreign.append(Foreign.of({**obj, "kind": kube.resource_of(child).kind}))
        return existing, foreign

    def name_conflict(
        self,
        run: Run,
        body: dict[str, Any],
        result: Outcome,
        existing: dict[tuple[str, str], dict[str, Any] | None],
        foreign: list[Foreign],
    ) -> Outcome:
        """Objects under the run's child names that are not its own: nothing is created, changed or deleted; the
        run says which and who controls them, and its timer looks again until they are gone. Names held by a run
        of the other kind refuse this run (Invalid) instead."""
        rival = rival_run(foreign, run.kind, run.name)
        if rival is not None:
            message = name_taken_message(rival, run.kind, run.namespace)
            refused = condition(Condition.VALID, False, EventReason.NAME_TAKEN, message)
            return Outcome("Invalid", [refused], events=[Event("Warning", EventReason.NAME_TAKEN, message)])
        message = conflict_message(foreign)
        ours = {name for (_, name), obj in existing.items() if obj is not None and is_controlled_by(obj, body)}
        result.children = {key: name for key, name in result.children.items() if name in ours}
        jobs = [obj for (kind, name), obj in existing.items() if kind in backends.BACKENDS and name in ours]
        job = jobs[0] if jobs else None
        result.phase = job_phase(job, run.spec.suspend, queued=bool(run.spec.queue_name))
        result.conditions.append(condition(Condition.CHILDREN_READY, False, EventReason.NAME_CONFLICT, message))
        result.events.append(Event("Warning", EventReason.NAME_CONFLICT, message))
        return result

    def apply_all(
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
            return self.apply(run, child, existing[_key(child)], revision, result)

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
                assert applied is not None, "at_once gives the call's result when it raised nothing"
                observed, action = applied
                if action:
                    result.actions[f"{child['kind']}/{child['metadata']['name']}"] = action
                if child["kind"] in backends.BACKENDS:
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
            result.conditions.append(condition(Condition.CHILDREN_READY, False, EventReason.CHILD_REJECTED, message))
            result.events.append(Event("Warning", EventReason.CHILD_REJECTED, message))
        else:
            message = "all children exist and match the spec"
            result.conditions.append(condition(Condition.CHILDREN_READY, True, "Applied", message))
        if not any(c["type"] == Condition.SPEC_APPLIED for c in result.conditions):
            current = "the running job matches the spec"
            result.conditions.append(condition(Condition.SPEC_APPLIED, True, "UpToDate", current))
        return job, servers

    def apply(
        self,
        run: Run,
        desired: dict[str, Any],
        existing: dict[str, Any] | None,
        revision: Revision,
        result: Outcome,
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Create, patch or (job) recreate one child, which this run controls or which is absent; returns (the object
        as observed, action). A pinned child (revisions.py) is rendered again only after its user changed the run."""
        resource = kube.resource_of(desired)
        name = desired["metadata"]["name"]
        is_job = desired["kind"] in backends.BACKENDS
        if existing is None:
            if is_job and run.spec.queue_name and run.spec.suspend:
                return None, None  # a suspended queued run holds no job (and no quota) until resumed
            try:
                return self.kube.create(desired), "created"
            except ApiError as exc:
                if exc.not_found and is_job:
                    self.prerequisites.crd_gone(desired["kind"])  # uninstalled under us: report it next time
                if not exc.conflict:
                    raise
                existing = self.kube.get(resource, run.namespace, name)  # created meanwhile
                if existing is None:
                    raise RetryLater(f"{desired['kind']} {name}: conflict on create, then not found") from exc
                if not is_controlled_by(existing, _owner(run)):
                    raise NameConflict(Foreign.of({**existing, "kind": resource.kind})) from exc
        if is_job:
            return self.jobs.apply_job(run, desired, existing, revision, result)
        if _cluster_ip_changes(desired, existing):
            # A Service's clusterIP is immutable (an earlier release's metrics Service had one; it is headless now):
            # made again. Only a Service, never a workload, and one this run controls (as every child here).
            self.kube.delete(resource, run.namespace, name)
            return self.kube.create(desired), "recreated"
        pinned = desired["kind"] in PINNED_KINDS
        if pinned and not revision.changed_since(existing):
            return existing, None  # the run's spec has not changed since it was rendered: an upgrade changes nothing
        patch = managed_patch(desired, existing)
        if pinned and (patch is not None or not revision.is_recorded_on(existing)):
            patch = patch or {}
            patch.setdefault("metadata", {})["annotations"] = revision.annotations(desired["kind"])
        if patch is None:
            return existing, None
        return self.kube.patch(resource, run.namespace, name, patch), "patched"

    def take_back(self, run: Run, result: Outcome) -> None:
        """Delete what this pass created (a name of the run turned out taken): a run with a name conflict holds
        nothing. Only objects this pass made, which the run controls."""
        for child, action in list(result.actions.items()):
            if action != "created":
                continue
            kind, name = child.split("/", 1)
            self.kube.delete(kube.RESOURCES[kind], run.namespace, name)
            del result.actions[child]

    def prune(self, run: Run, body: dict[str, Any], result: Outcome) -> None:
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
                    reason, why = EventReason.NETWORK_POLICY_OFF, "the operator's network policy setting is off"
                elif key in backends.job_child_keys() or backends.for_run(run).servers_in_job:
                    reason, why = EventReason.BACKEND_CHANGED, f"spec.backend is {run.backend} now"
                else:
                    reason, why = EventReason.SERVER_REMOVED, "no longer in the spec"
                result.events.append(Event("Normal", reason, f"{child}: {why}, deleted"))

    @staticmethod
    def owning_run(child: dict[str, Any]) -> dict[str, Any] | None:
        """The controller owner reference of a child when it is a run (AtlasTraining/AtlasTeacher)."""
        refs = (child.get("metadata") or {}).get("ownerReferences") or []
        return next((ref for ref in refs if ref.get("controller") and ref.get("kind") in KINDS), None)


# The conditions (type, reason) of a run whose names were found taken: by an object someone else made, or by a run
# of the other kind.
NAME_TAKEN = {(Condition.CHILDREN_READY, EventReason.NAME_CONFLICT), (Condition.VALID, EventReason.NAME_TAKEN)}


def met_a_name_conflict(body: dict[str, Any]) -> bool:
    """The run's status says a name of its is taken: its passes look at the names before creating anything."""
    conditions = (body.get("status") or {}).get("conditions") or []
    return any((c.get("type"), c.get("reason")) in NAME_TAKEN for c in conditions)


def _cluster_ip_changes(desired: dict[str, Any], existing: dict[str, Any]) -> bool:
    """Whether a Service is rendered headless (clusterIP None) but exists with an address, or the reverse."""
    if desired.get("kind") != "Service" or "clusterIP" not in desired.get("spec", {}):
        return False
    had = (existing.get("spec") or {}).get("clusterIP")
    return had is not None and (had == "None") != (desired["spec"]["clusterIP"] == "None")


def reward_yaml(run: Run) -> str | None:
    """The named RIM config (reward_system/<spec.reward.config>.yaml), embedded in the run's ConfigMap."""
    if not run.spec.reward.config:
        return None
    path = find_reward_config(run.spec.reward.config)
    if path is None:  # only bundled names pass validation (cel_rules.py): a broken install
        raise RetryLater(f"spec.reward.config: RIM config {run.spec.reward.config!r} is not installed")
    return path.read_text()


def _key(child: dict[str, Any]) -> tuple[str, str]:
    return child["kind"], child["metadata"]["name"]


def _owner(run: Run) -> dict[str, Any]:
    """The run as an owner, for is_controlled_by."""
    return {"kind": run.kind, "metadata": {"name": run.name, "uid": run.uid}}
