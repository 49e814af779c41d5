"""kopf handlers: parse → render → apply → report, for AtlasTraining and AtlasTeacher.

Run with ``atlas operator`` (or ``kopf run -A --standalone -m atlas_operator.handlers``). Settings
come from the environment (see :class:`atlas_operator.config.OperatorConfig`).
"""

from __future__ import annotations

import copy
import logging
import time

import kopf

from atlas_operator import metrics
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import ApiError, Kube, Resource
from atlas_operator.reconcile import Reconciler, Result, RetryLater
from atlas_operator.render import MANAGED_BY
from atlas_operator.spec import GROUP, KINDS, VERSION
from atlas_operator.status import merge_conditions, now, training_reason

CONFIG = OperatorConfig.from_env()
RUN_RESOURCES = {kind: Resource(GROUP, VERSION, plural, kind) for kind, plural in KINDS.items()}
log = logging.getLogger("atlas_operator")


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # kopf's bookkeeping lives in status (one write per reconciliation instead of status + annotations).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandledConfiguration")
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = CONFIG.workers
    settings.watching.connect_timeout = 30
    # A deleted run waits for its timer to exit; check every second, not kopf's default minute.
    settings.background.cancellation_polling = 1
    memo.reconciler = Reconciler(Kube(), CONFIG.reconciler_settings())
    memo.phases = metrics.RunPhases()
    memo.metrics_server = await metrics.serve(CONFIG.metrics_host, CONFIG.metrics_port) if CONFIG.metrics_port else None


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_) -> None:
    if memo.get("metrics_server"):
        await memo.metrics_server.cleanup()


def _reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, scrape: bool) -> None:
    if body.metadata.get("deletionTimestamp"):
        return  # being deleted: recreating children now would race the delete handler
    try:
        result = _reconciled(body, memo, scrape)
    except (ApiError, RetryLater) as exc:
        raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_delay) from exc
    report(body, patch, result)


def _reconciled(body: kopf.Body, memo: kopf.Memo, scrape: bool) -> Result:
    """One reconciliation, counted and timed in the operator's metrics."""
    kind = body["kind"]
    started = time.perf_counter()
    try:
        result = memo.reconciler.reconcile(plain(body), kopf.adopt, scrape=scrape)
    except Exception:
        metrics.RECONCILE_TOTAL.labels(kind, "error").inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.labels(kind).observe(time.perf_counter() - started)
    metrics.RECONCILE_TOTAL.labels(kind, "success").inc()
    memo.phases.set(kind, body.metadata.namespace, body.metadata.name, result.phase)
    return result


def plain(body: kopf.Body) -> dict:
    """kopf's read-only Body view → a plain dict (what the pure code takes)."""
    return copy.deepcopy(dict(body))


def report(body: kopf.Body, patch: kopf.Patch, result: Result) -> None:
    """Write only the status fields that changed; post an Event for each transition."""
    old = dict(body.get("status") or {})
    at = now()
    new = {
        "phase": result.phase,
        "observedGeneration": body.metadata.get("generation"),
        "conditions": merge_conditions(old.get("conditions"), result.conditions, at),
        "children": result.children or None,
    }
    for condition in new["conditions"]:
        condition["observedGeneration"] = new["observedGeneration"]
    if result.progress is not None:
        progress = {k: v for k, v in (old.get("progress") or {}).items() if k != "updatedAt"}
        if progress != result.progress:
            new["progress"] = {**result.progress, "updatedAt": at}
    for key, value in new.items():
        if old.get(key) != value:
            patch.status[key] = value
    transitioned = old.get("phase") != result.phase
    if transitioned:
        warning = result.phase in ("Failed", "Invalid")
        kopf.event(
            body, type="Warning" if warning else "Normal", reason=result.phase, message=_transition_message(result)
        )
    said = {(c.get("reason"), c.get("message")) for c in old.get("conditions") or []}
    for event in result.events:
        carried = transitioned and event.type == "Warning"  # the transition event already says it
        if (event.reason, event.message) not in said and not carried:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)


def _transition_message(result: Result) -> str:
    """Invalid/Pending: what blocks the run; otherwise what the PyTorchJob said."""
    by_type = {c["type"]: c for c in result.conditions}
    for blocking in ("Valid", "PrerequisitesMet", "SpecApplied"):
        if by_type.get(blocking, {}).get("status") == "False":
            return by_type[blocking]["message"]
    training = by_type.get("Training")
    return training["message"] if training else result.phase


for _plural in KINDS.values():

    @kopf.on.resume(GROUP, VERSION, _plural)
    @kopf.on.create(GROUP, VERSION, _plural)
    @kopf.on.update(GROUP, VERSION, _plural)
    def reconcile_run(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_) -> None:
        """Make the children match the spec (idempotent: compare, then create or patch)."""
        _reconcile(body, patch, memo, scrape=False)

    @kopf.timer(GROUP, VERSION, _plural, interval=CONFIG.progress_interval, initial_delay=CONFIG.progress_interval)
    def observe_run(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_) -> None:
        """Periodically: recreate deleted children, follow the PyTorchJob, mirror the trainer's metrics."""
        _reconcile(body, patch, memo, scrape=True)

    @kopf.on.delete(GROUP, VERSION, _plural)
    def delete_run(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_) -> None:
        """Delete the children (owner references would let the garbage collector do it too)."""
        try:
            deleted = memo.reconciler.delete_children(plain(body))
        except ApiError as exc:
            raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_delay) from exc
        memo.phases.set(body["kind"], body.metadata.namespace, body.metadata.name, None)
        logger.info("deleted %s", ", ".join(deleted) or "nothing (no children left)")


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels={"app.kubernetes.io/managed-by": MANAGED_BY})
def job_changed(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_) -> None:
    """A PyTorchJob's conditions moved: update its run's phase now rather than at the next timer tick."""
    owner = next(
        (
            ref
            for ref in body.metadata.get("ownerReferences") or []
            if ref.get("controller") and ref.get("kind") in KINDS
        ),
        None,
    )
    if owner is None:
        return
    resource = RUN_RESOURCES[owner["kind"]]
    kube = memo.reconciler.kube
    try:
        run = kube.get(resource, body.metadata.namespace, owner["name"])
        if run is None or run["metadata"].get("deletionTimestamp") or not _job_news(plain(body), run):
            return
        run_body, patch = kopf.Body(run), kopf.Patch()
        report(run_body, patch, _reconciled(run_body, memo, scrape=False))
        if patch.get("status"):
            kube.patch(
                resource,
                body.metadata.namespace,
                owner["name"],
                {"status": dict(patch["status"])},
                subresource="status",
            )
    except (ApiError, RetryLater) as exc:  # the run's timer catches up
        logger.warning("could not refresh %s %s from its PyTorchJob: %s", owner["kind"], owner["name"], exc)


def _job_news(job: dict, run: dict) -> bool:
    """Whether the job says something the run's status does not show yet (its last condition)."""
    if not (job.get("status") or {}).get("conditions"):
        return False
    training = next((c for c in (run.get("status") or {}).get("conditions") or [] if c["type"] == "Training"), {})
    return training_reason(job) != (training.get("reason"), training.get("message"))
