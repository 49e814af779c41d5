"""kopf handlers: parse → render → apply → report, for AtlasTraining and AtlasTeacher.

Run with ``atlas operator`` (or ``kopf run -A --standalone -m atlas_operator.handlers``). Each handler
delegates: :class:`~atlas_operator.reconcile.Reconciler` does the work, :func:`status_update.status_update`
decides what to write, atlas_operator/ticker.py keeps each run's periodic pass (reconcile/retry.py: when it
reconciles again), the Reconciler's :class:`~atlas_operator.reconcile.RunMemory` keeps what is remembered per
run, and settings come from one :class:`~atlas_operator.config.OperatorConfig`.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from atlas_contract.names import GROUP, KINDS, LABEL_MANAGED_BY, MANAGED_BY, VERSION
from atlas_operator import backends, cel_rules, config, kube, metrics
from atlas_operator.informer import Informer
from atlas_operator.kube import ApiError, Kube, Resource
from atlas_operator.reconcile import Reconciler, RetryLater, RunMemory, relevance
from atlas_operator.reconcile.memory import RunKey
from atlas_operator.reconcile.patching import merge_patch
from atlas_operator.reconcile.retry import RetryForever, needs_retry, stuck
from atlas_operator.status_update import Event, merge_conditions, now, progress_patch, status_update
from atlas_operator.ticker import RunTicker
from atlas_operator.tracking_status import running_update

log = logging.getLogger("atlas_operator")
CONFIG = config.current()
RUN_RESOURCES = {kind: Resource(GROUP, VERSION, plural, kind) for kind, plural in KINDS.items()}
# What the operator creates for a run, watched (server-side: only objects labelled as the operator's) by the
# informer: each one's latest state is held, so a reconciliation reads none of them from the API server, and a change
# someone else makes (a deletion, a drift, a job's or a Deployment's status) reconciles its run at once. The runs'
# pods are followed too (not held): a container the kubelet cannot start.
# (Each backend says what it watches: its job, and what its job's controller makes of it with the run's labels.)
CHILD_RESOURCES = (
    kube.CONFIG_MAP,
    kube.SERVICE,
    kube.DEPLOYMENT,
    *backends.watched_resources(),
    kube.NETWORK_POLICY,
)
WATCHED_PLURALS = {resource.plural for resource in (*CHILD_RESOURCES, kube.POD)}
LEGACY_FINALIZER = f"{GROUP}/cleanup"  # kopf's, on the runs of earlier operators (see startup)
BATCH_WINDOW_S = 0.01  # kopf's wait for more events of an object before it processes them (its default: 0.1 s)
GC_THRESHOLD = 20_000  # allocations between young-generation collections (Python's default: 700)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's bookkeeping lives in status (one write per reconciliation instead of status + annotations).
    settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage(field="status.kopf.lastHandledConfiguration")
    settings.persistence.progress_storage = kopf.StatusProgressStorage(field="status.kopf.progress")
    # No handler needs a finalizer (the garbage collector deletes the children: the run is their controller owner;
    # the ticks are the operator's own, atlas_operator/ticker.py). Named still, so that kopf takes off the one earlier
    # operators put on their runs (tests/fixtures/upgrade/) instead of leaving their deletion waiting for it.
    settings.persistence.finalizer = LEGACY_FINALIZER
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = CONFIG.workers
    settings.watching.connect_timeout = 30
    # kopf retries a failed request (refused, 5xx, 403, 429) over 54 s, then raises; a timer whose status patch raises
    # is never run again (kopf 1.45 marks it stopped for good), so an API server down for longer left every running
    # run's progress unwritten until the operator restarted (tests/kube/test_outage.py). Never given up, and retried
    # once per progress interval at least: the patch the outage held lands within an interval of its return, the next
    # tick's an interval later.
    settings.networking.error_backoffs = RetryForever(min(10.0, CONFIG.progress_interval))
    # Named namespaces (the chart's watchNamespaces, `atlas operator -n`): kopf serves exactly those, as the informer
    # does. Left on, its scanning lists and watches every Namespace of the cluster to follow them (which neither RBAC
    # scope grants): nine 403s with back-off, almost a minute, before it falls back to the names and watches the
    # first run, and 403s again for the watch. Cluster-wide it lists no Namespace; there it keeps following the CRDs.
    settings.scanning.disabled = bool(CONFIG.watch_namespaces)
    # Children and the runs' pods are watched through a label selector: the API server sends only the operator's
    # own objects, not every pod of the cluster.
    settings.watching.label_selectors[lambda resource: resource.plural in WATCHED_PLURALS] = (
        f"{LABEL_MANAGED_BY}={MANAGED_BY}"
    )
    # kopf holds each object's events for a batch window (0.1 s) to process only the last: a new run waited it before
    # its handler started (twice, when kopf still added a finalizer). A run's events rarely come that close together,
    # and one processed early costs a pass that changes nothing.
    settings.batching.batch_window = BATCH_WINDOW_S
    # Thousands of watched objects live in the informer: the collector's full passes over them, at its default pace,
    # were a good share of a busy operator's CPU. Objects made at start-up are left out of them; passes are rarer.
    cel_rules.compile_rules()  # before the first runs arrive, not in each of their handler threads
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    memo.tasks = set()
    memo.informer = Informer(
        CHILD_RESOURCES,
        followed=(kube.POD,),
        namespaces=CONFIG.watch_namespaces,
        on_change=lambda type_, resource, obj: child_changed(type_, resource, obj, memo),
        matters=relevance.matters,
    )
    memo.memory = RunMemory()  # per run, for the Reconciler and the handlers alike (run_event forgets it)
    memo.reconciler = Reconciler(Kube(watched=memo.informer.get, synced=memo.informer.synced), CONFIG, memo.memory)
    memo.informer.start(settings)
    memo.ticker = RunTicker(CONFIG.progress_interval, lambda body: observe_run(body, memo), CONFIG.workers)
    memo.ticker_task = asyncio.get_running_loop().create_task(memo.ticker.run_forever())
    metrics.initialize_series()
    memo.phases = metrics.RunPhases()
    memo.metrics_server = (
        await metrics.serve(CONFIG.metrics_host, CONFIG.metrics_port, ready=memo.informer.started)
        if CONFIG.metrics_port
        else None
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("ticker_task"):
        memo.ticker_task.cancel()
    if memo.get("informer"):
        await memo.informer.stop()
    if memo.get("metrics_server"):
        await memo.metrics_server.cleanup()


# ---------------------------------------------------------------------------------------------- reconciling


def run_key(body: Mapping[str, Any]) -> RunKey:
    meta = body["metadata"]
    return body["kind"], meta.get("namespace"), meta["name"]


def reconcile_status(
    body: Mapping[str, Any], memo: kopf.Memo, handler: bool = False
) -> tuple[dict[str, Any], list[Event]]:
    """One reconciliation of a run (counted and timed): the status patch and the Events to post. A run's
    reconciliations (its handlers, its tick, its children's events) go one at a time, and each sees the status the
    one before it returned even while kopf has not written it yet: ``handler`` (a kopf handler's pass, whose status
    kopf writes after it) keeps it, under the run's lock, and every pass starts from it (a child's change during a
    new run's first pass, its own creates and take-backs among them, posted its Events a second time)."""
    run = run_key(body)
    with memo.memory.run_lock(run):
        body = _with_unwritten_status(run, body, memo)
        patch, events = reconcile_counted(body, memo, time.perf_counter())
        if handler:
            memo.memory.keep_unwritten(run, body["metadata"].get("resourceVersion"), copy.deepcopy(patch))
        return patch, events


def reconcile_counted(body: Mapping[str, Any], memo: kopf.Memo, started: float) -> tuple[dict[str, Any], list[Event]]:
    kind = body["kind"]
    try:
        result = memo.reconciler.reconcile(copy.deepcopy(dict(body)), kopf.adopt)
    except Exception:
        metrics.RECONCILE_TOTAL.labels(kind, "error").inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.labels(kind).observe(time.perf_counter() - started)
    metrics.RECONCILE_TOTAL.labels(kind, "success").inc()
    meta = body["metadata"]
    if result.watchdog_restarts:
        metrics.WATCHDOG_RESTARTS.labels(kind, meta.get("namespace"), meta["name"]).inc(result.watchdog_restarts)
    if result.preemption_saves:
        metrics.PREEMPTION_SAVES.labels(meta.get("namespace"), meta["name"], kind).inc(result.preemption_saves)
    memo.phases.set(kind, meta.get("namespace"), meta["name"], result.phase)
    return status_update(dict(body.get("status") or {}), meta.get("generation"), result, now())


def post_events(body: Mapping[str, Any], events: list[Event], memo: kopf.Memo) -> None:
    for event in events:
        memo.reconciler.kube.post_event(body, event.type, event.reason, event.message)


def write_status(body: Mapping[str, Any], patch: dict[str, Any], memo: kopf.Memo) -> dict[str, Any]:
    """The status patch of a pass kopf does not write (a child's change, the run's tick); the run as written."""
    meta = body["metadata"]
    resource = RUN_RESOURCES[body["kind"]]
    kube: Kube = memo.reconciler.kube
    return kube.patch(resource, meta.get("namespace"), meta["name"], {"status": patch}, subresource="status")


def reconcile_into_patch(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    """A kopf handler's pass: its status goes into kopf's one write of the run, and its Events wait for that write
    (posted at its echo, ``run_event``): an Event never tells of a status nobody can read yet."""
    if body.metadata.get("deletionTimestamp"):
        return  # being deleted: recreating children now would race the garbage collector
    try:
        status, events = reconcile_status(body, memo, handler=True)
    except (ApiError, RetryLater) as exc:
        raise kopf.TemporaryError(str(exc), delay=CONFIG.retry_delay) from exc
    if events and status:
        memo.memory.keep_unposted(run_key(body), body.metadata.get("resourceVersion"), events)
    elif events:  # nothing to write: nothing to wait for
        post_events(body, events, memo)
    patch.status.update(status)


def _with_unwritten_status(run: RunKey, body: Mapping[str, Any], memo: kopf.Memo) -> Mapping[str, Any]:
    """``body`` as it will be once kopf writes the status its handler returned for this very version of the run.
    kopf writes it only after the handler (and the run's lock) is done: a child's change in between (a new run's
    Deployment, its status written by the deployment controller at once) read the run without it, and posted the
    phase's Event and wrote the status a second time."""
    status = memo.memory.unwritten(run, body["metadata"].get("resourceVersion"))
    if status is None:  # none, or written by now (or the run changed since): the API server's copy has it
        return body
    return {**body, "status": merge_patch(dict(body.get("status") or {}), status)}


def tracking_patch(
    body: Mapping[str, Any], status: dict[str, Any], generation: int | None, seen: dict[str, Any] | None, at: str
) -> tuple[dict[str, Any], tuple[str, str] | None]:
    """Condition Tracking and .status.tracking from what the Running trainer's /metrics said of its MLflow logging,
    and the Warning Event to post when the server just stopped answering (tracking_status.running_update)."""
    new, tracking, warning = running_update(status, dict(body.get("spec") or {}), seen)
    patch: dict[str, Any] = {}
    if new is not None:
        new["observedGeneration"] = generation
        patch["conditions"] = merge_conditions(status.get("conditions"), [new], at)
    if tracking is not None:
        patch["tracking"] = tracking
    return patch, warning


async def observe_run(body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """A run's tick (atlas_operator/ticker.py): mirror a Running trainer's metrics; retry what no watch event will
    bring (a missing prerequisite, a rejected child, a result not read yet, a run whose handler never ran). A settled
    run costs no API call here: its children and its job are watched."""
    meta = body["metadata"]
    if meta.get("deletionTimestamp"):
        return
    status, generation = dict(body.get("status") or {}), meta.get("generation")
    waited_long = stuck(memo.memory, run_key(body), status, generation, CONFIG.progress_interval)
    patch: dict[str, Any] = {}
    events: list[Event] = []
    if needs_retry(status, generation, waited_long):
        try:
            patch, events = await asyncio.to_thread(reconcile_status, body, memo)
        except (ApiError, RetryLater) as exc:  # its next tick retries
            log.warning("could not reconcile %s %s/%s: %s", body["kind"], meta.get("namespace"), meta["name"], exc)
            return
        status = merge_patch(status, patch)
    if status.get("phase") == "Running":
        progress, tracking = await memo.reconciler.scrape(dict(meta))
        at = now()
        patch.update(progress_patch(status, progress, at))
        update, warning = tracking_patch(body, status, generation, tracking, at)
        patch.update(update)
        if warning is not None:
            events.append(Event("Warning", *warning))
    if patch:  # blocking calls: off the event loop; the Events after the status they tell of
        body = await asyncio.to_thread(write_status, body, patch, memo)
    if events:
        await asyncio.to_thread(post_events, body, events, memo)


for _plural in KINDS.values():

    @kopf.on.resume(GROUP, VERSION, _plural)
    @kopf.on.create(GROUP, VERSION, _plural)
    @kopf.on.update(GROUP, VERSION, _plural)
    def reconcile_run(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
        """Make the children match the spec (idempotent: compare, then create or patch)."""
        reconcile_into_patch(body, patch, memo)

    @kopf.on.event(GROUP, VERSION, _plural)
    async def run_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        """Every event of a run (kopf's watch): its copy for its tick; the Events its handler's status waited for;
        at its deletion, what is remembered of it (its children are the garbage collector's: no finalizer)."""
        body, type_ = event["object"], event.get("type")
        run = run_key(body)
        memo.ticker.seen(run, type_, body)
        if type_ == "DELETED":
            memo.memory.forget(run[1], run[2])
            memo.phases.set(*run, None)
            return
        events = memo.memory.take_unposted(run, body["metadata"].get("resourceVersion"))
        if events:
            await asyncio.to_thread(post_events, body, events, memo)


# ---------------------------------------------------------------------------------------------- child events


def child_changed(type_: str, resource: Resource, obj: dict[str, Any], memo: kopf.Memo) -> None:
    """A child changed, and not by the operator's own last write (a job's or a Deployment's status, a deletion, a
    drift), or a run's pod can no longer start its containers (a missing pull Secret, a bad image), or again: reconcile
    its run now rather than at the next timer tick. On the event loop, for every event: the echoes of the operator's
    own writes (most events) are dropped here, without a trip through the handlers' threads."""
    reconciler = memo.reconciler
    deleted = type_ == "DELETED"
    if resource is kube.POD:  # its app.kubernetes.io/instance label names its run; only a change of state counts
        changed = reconciler.pod_changed(obj, deleted=deleted)
        if changed is None:
            return
        kind, name = changed
    else:
        if reconciler.kube.own_write(resource, obj, deleted=deleted):
            return  # the echo of our own create, patch or delete
        owner = reconciler.run_of(obj)
        if owner is None:
            return
        kind, name = owner["kind"], owner["name"]
    run = (kind, obj["metadata"].get("namespace", ""), name)
    if not memo.memory.queue_refresh(run):
        return  # a refresh is queued and has not started: it will see this change too
    task = asyncio.get_running_loop().create_task(asyncio.to_thread(reconcile_after_change, run, obj.get("kind"), memo))
    memo.tasks.add(task)  # held until done (the loop keeps only weak references to tasks)
    task.add_done_callback(memo.tasks.discard)


def reconcile_after_change(run: tuple[str, str, str], cause: str | None, memo: kopf.Memo) -> None:
    """Reconcile a run after a change of one of its children or pods. The run is read from the API server first: a
    copy held from a watch can be behind a spec change, and reconciling it would write the old spec back to the
    children (a resumed run's job suspended again) until the run's own update handler undid it. Only events that
    are not the echo of the operator's own writes get here, so a settled run costs nothing."""
    memo.memory.refresh_started(run)
    reconciler = memo.reconciler
    kind, namespace, name = run
    try:
        body = reconciler.kube.get_fresh(RUN_RESOURCES[kind], namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        patch, events = reconcile_status(body, memo)
        if patch:
            body = write_status(body, patch, memo)
        post_events(body, events, memo)
    except (ApiError, RetryLater) as exc:  # the run's tick catches up
        log.warning("could not refresh %s %s/%s after a change of its %s: %s", kind, namespace, name, cause, exc)
