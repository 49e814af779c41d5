"""kopf handlers: parse → render → apply → report, for AtlasTraining and AtlasTeacher.

Run with ``atlas operator`` (or ``kopf run -A --standalone -m atlas_operator.handlers``). Each handler
delegates: :class:`~atlas_operator.reconcile.Reconciler` does the work, :func:`status.status_update`
decides what to write, and settings come from one :class:`~atlas_operator.config.OperatorConfig`.
"""

from __future__ import annotations

import copy
import logging
import time

import kopf

from atlas_contract.names import GROUP, KINDS, LABEL_MANAGED_BY, MANAGED_BY, VERSION
from atlas_operator import config, metrics
from atlas_operator.kube import ApiError, Kube, Resource
from atlas_operator.reconcile import Reconciler, RetryLater
from atlas_operator.status import job_has_news, now, status_update

CONFIG = config.current()
RUN_RESOURCES = {kind: Resource(GROUP, VERSION, plural, kind) for kind, plural in KINDS.items()}


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_) -> None:
    # kopf's bookkeeping lives in status (one write per reconciliation instead of status + annotations).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandledConfiguration")
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = CONFIG.workers
    settings.watching.connect_timeout = 30
    # The pod watch asks the API server for the runs' pods only, not every pod of the cluster.
    settings.watching.label_selectors["v1", "pods"] = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    # A deleted run waits for its timer to exit; check every second, not kopf's default minute.
    settings.background.cancellation_polling = 1
    memo.reconciler = Reconciler(Kube(), CONFIG)
    metrics.initialize_series()
    memo.phases = metrics.RunPhases()
    memo.metrics_server = await metrics.serve(CONFIG.metrics_host, CONFIG.metrics_port) if CONFIG.metrics_port else None


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_) -> None:
    if memo.get("metrics_server"):
        await memo.metrics_server.cleanup()


def refresh(body: kopf.Body, memo: kopf.Memo, scrape: bool) -> dict:
    """One reconciliation of a run (counted and timed): posts its Events, returns the status patch."""
    kind, started = body["kind"], time.perf_counter()
    try:
        result = memo.reconciler.reconcile(copy.deepcopy(dict(body)), kopf.adopt, scrape=scrape)
    except Exception:
        metrics.RECONCILE_TOTAL.labels(kind, "error").inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.labels(kind).observe(time.perf_counter() - started)
    metrics.RECONCILE_TOTAL.labels(kind, "success").inc()
    if result.watchdog_restarts:
        metrics.WATCHDOG_RESTARTS.labels(kind, body.metadata.namespace, body.metadata.name).inc(
            result.watchdog_restarts
        )
    memo.phases.set(kind, body.metadata.namespace, body.metadata.name, result.phase)
    patch, events = status_update(dict(body.get("status") or {}), body.metadata.get("generation"), result, now())
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    return patch


def _reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, scrape: bool) -> None:
    if body.metadata.get("deletionTimestamp"):
        return  # being deleted: recreating children now would race the delete handler
    try:
        patch.status.update(refresh(body, memo, scrape))
    except (ApiError, RetryLater) as exc:
        raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_delay) from exc


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
            deleted = memo.reconciler.delete_children(copy.deepcopy(dict(body)))
        except ApiError as exc:
            raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_delay) from exc
        memo.reconciler.forget(dict(body))
        memo.phases.set(body["kind"], body.metadata.namespace, body.metadata.name, None)
        logger.info("deleted %s", ", ".join(deleted) or "nothing (no children left)")


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels={LABEL_MANAGED_BY: MANAGED_BY})
@kopf.on.event("jobset.x-k8s.io", "v1alpha2", "jobsets", labels={LABEL_MANAGED_BY: MANAGED_BY})
def job_changed(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_) -> None:
    """A run's job (PyTorchJob, JobSet) moved: reconcile its run now rather than at the next timer tick."""
    owner = memo.reconciler.owning_run(body)
    if owner is None:
        return
    resource, name = RUN_RESOURCES[owner["kind"]], owner["name"]
    kube = memo.reconciler.kube
    try:
        run = kube.get(resource, body.metadata.namespace, name)
        if run is None or run["metadata"].get("deletionTimestamp") or not job_has_news(dict(body), run.get("status")):
            return
        patch = refresh(kopf.Body(run), memo, scrape=False)
        if patch:
            kube.patch(resource, body.metadata.namespace, name, {"status": patch}, subresource="status")
    except (ApiError, RetryLater) as exc:  # the run's timer catches up
        logger.warning("could not refresh %s %s from its %s: %s", owner["kind"], name, body["kind"], exc)


@kopf.on.event("", "v1", "pods", labels={LABEL_MANAGED_BY: MANAGED_BY})
def pod_changed(body: kopf.Body, event: dict, memo: kopf.Memo, logger: logging.Logger, **_) -> None:
    """A run's pod cannot start (a missing pull Secret, a Secret its env names, a bad image), or no longer: say so on
    the run now (PodsStarted and an Event). The pod's app.kubernetes.io/instance label names its run."""
    changed = memo.reconciler.pod_changed(dict(body), deleted=event.get("type") == "DELETED")
    if changed is not None:
        refresh_run(RUN_RESOURCES[changed[0]], body.metadata.namespace, changed[1], memo, logger)


def refresh_run(resource: Resource, namespace: str, name: str, memo: kopf.Memo, logger: logging.Logger) -> None:
    """Reconcile one run outside its own handlers (something it owns moved) and write its status."""
    kube = memo.reconciler.kube
    try:
        run = kube.get(resource, namespace, name)
        if run is None or run["metadata"].get("deletionTimestamp"):
            return
        patch = refresh(kopf.Body(run), memo, scrape=False)
        if patch:
            kube.patch(resource, namespace, name, {"status": patch}, subresource="status")
    except (ApiError, RetryLater) as exc:  # the run's timer catches up
        logger.warning("could not refresh %s %s/%s: %s", resource.kind, namespace, name, exc)
