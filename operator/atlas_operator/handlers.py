"""The operator's handlers: parse → render → apply → report, for AtlasTraining and AtlasTeacher.

Run with ``atlas operator`` (or ``kopf run -A --standalone -m atlas_operator.handlers``). kopf runs the process (its
start-up and clean-up handlers below); the runs and their children are watched by the informer
(atlas_operator/informer.py), and each change that is news queues its run on the work queue
(atlas_operator/workqueue.py), whose threads reconcile it: :class:`~atlas_operator.reconcile.Reconciler` does the work,
:func:`status_update.status_update` decides what to write, one status write per pass, its Events after it.
atlas_operator/ticker.py keeps each run's periodic pass (reconcile/retry.py: when it reconciles again), the
Reconciler's :class:`~atlas_operator.reconcile.RunMemory` keeps what is remembered per run, and settings come from
one :class:`~atlas_operator.config.OperatorConfig`.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from atlas_contract.names import GROUP, KINDS, LABEL_MANAGED_BY, MANAGED_BY, VERSION
from atlas_operator import backends, cel_rules, config, kube, metrics
from atlas_operator.informer import Informer
from atlas_operator.kube import ApiError, Kube, Resource
from atlas_operator.reconcile import Reconciler, RetryLater, RunMemory, relevance
from atlas_operator.reconcile.memory import RunKey
from atlas_operator.reconcile.patching import merge_patch
from atlas_operator.reconcile.retry import RetryForever, needs_retry, stuck, unreconciled
from atlas_operator.status_update import Event, merge_conditions, now, progress_patch, status_update
from atlas_operator.ticker import RunTicker
from atlas_operator.tracking_status import running_update
from atlas_operator.workqueue import WorkQueue

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
RUN_PLURALS = {resource.plural for resource in RUN_RESOURCES.values()}
LEGACY_FINALIZER = f"{GROUP}/cleanup"  # kopf's, on the runs of operators before 0.2 (0.1.0's: release_legacy_finalizer)
GC_THRESHOLD = 20_000  # allocations between young-generation collections (Python's default: 700)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf handles no run (no resource handler: the informer watches the runs and a work queue reconciles them), so it
    # writes nothing of its own to them; it still runs the process (login, start-up, clean-up, --liveness), and its
    # watch-stream feeds the informer.
    settings.posting.level = logging.WARNING
    settings.watching.connect_timeout = 30
    # kopf retries a failed request (refused, 5xx, 403, 429) over 54 s, then raises: the informer's watches would stop
    # listing again for that long after an API server outage. Never given up, and retried once per progress interval
    # at least (tests/kube/test_outage.py).
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
    # Thousands of watched objects live in the informer: the collector's full passes over them, at its default pace,
    # were a good share of a busy operator's CPU. Objects made at start-up are left out of them; passes are rarer.
    cel_rules.compile_rules()  # before the first runs arrive, not in each of their reconciliations
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 20, 20)
    memo.informer = Informer(
        (*RUN_RESOURCES.values(), *CHILD_RESOURCES),
        followed=(kube.POD,),
        announced=tuple(RUN_RESOURCES.values()),  # every run listed at start is reconciled once (kopf's resume)
        namespaces=CONFIG.watch_namespaces,
        on_change=lambda type_, resource, obj: changed(type_, resource, obj, memo),
        matters=matters,
    )
    memo.memory = RunMemory()  # per run, for the Reconciler and the handlers alike (run_changed forgets it)
    memo.reconciler = Reconciler(Kube(watched=memo.informer.get, synced=memo.informer.synced), CONFIG, memo.memory)
    memo.queue = WorkQueue(lambda run: reconcile_run(run, memo), CONFIG.workers, failure_delay=CONFIG.retry_delay)
    memo.queue.start()
    memo.ticker = RunTicker(CONFIG.progress_interval, lambda body: observe_run(body, memo), CONFIG.workers)
    memo.ticker_task = asyncio.get_running_loop().create_task(memo.ticker.run_forever())
    memo.informer.start(settings)
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
    if memo.get("queue"):
        await asyncio.to_thread(memo.queue.stop)
    if memo.get("metrics_server"):
        await memo.metrics_server.cleanup()


# ---------------------------------------------------------------------------------------------- reconciling


def matters(resource: Resource, before: dict[str, Any] | None, after: dict[str, Any]) -> bool:
    """Whether a held object's change is news: a run's, when it is more than the echo of a status write; a child's,
    when its run's status depends on it (reconcile/relevance.py)."""
    if resource.plural in RUN_PLURALS:
        return before is None or relevance.run_changed(before, after)
    return relevance.matters(resource, before, after)


def run_key(body: Mapping[str, Any]) -> RunKey:
    meta = body["metadata"]
    return body["kind"], meta.get("namespace"), meta["name"]


def held_run(run: RunKey, memo: kopf.Memo) -> dict[str, Any] | None:
    """The run as the informer holds it (its watch, or the answer to this process's last write of it)."""
    kind, namespace, name = run
    held: dict[str, Any] | None = memo.informer.get(RUN_RESOURCES[kind], namespace, name)
    return held


def reconcile_counted(body: Mapping[str, Any], memo: kopf.Memo) -> tuple[dict[str, Any], list[Event]]:
    """One reconciliation of a run, counted and timed: the status patch and the Events to post."""
    kind, started = body["kind"], time.perf_counter()
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


Pass = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[Event]]]


def pass_over(run: RunKey, memo: kopf.Memo, compute: Pass) -> None:
    """One pass over a run: under the run's lock (its passes one at a time: two at once would both see a child missing
    and both create it), ``compute`` the status patch and the Events from the run as held, write the patch (one status
    write), hold what the API server answered (the next pass starts from it); then post the Events, after the status
    they tell of. A run whose spec, labels or deletion the write's answer shows changed since the copy the pass read
    is queued again."""
    with memo.memory.run_lock(run):
        body = held_run(run, memo)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return  # gone, or being deleted: recreating children now would race the garbage collector
        patch, events = compute(body)
        if patch:
            written = write_status(body, patch, memo)
            memo.informer.hold(RUN_RESOURCES[run[0]], written)
            if relevance.run_changed(body, written):
                queue_run(run, written, memo)
            body = written
    post_events(body, events, memo)


def reconcile_run(run: RunKey, memo: kopf.Memo) -> float | None:
    """The work queue's pass over a run (atlas_operator/workqueue.py): its legacy finalizer taken off, then one
    reconciliation. Returns when to try again: after ATLAS_RETRY_DELAY when the API did not answer or failed a request
    or a step asked for it (RetryLater). A request refused as sent (403, 400, 422) raises: the work queue retries it
    after a delay that doubles, and logs it once per streak."""
    body = held_run(run, memo)
    if body is None:
        return None
    try:
        if LEGACY_FINALIZER in (body["metadata"].get("finalizers") or ()):
            release_legacy_finalizer(body, memo)
        pass_over(run, memo, lambda held: reconcile_counted(held, memo))
    except ApiError as exc:
        if exc.rejected:  # refused as sent (the RBAC: the run's status write): the queue backs off, says it once
            raise
        log.warning("could not reconcile %s %s/%s: %s; again in %g s", *run, exc, CONFIG.retry_delay)
        return CONFIG.retry_delay
    except RetryLater as exc:
        log.warning("could not reconcile %s %s/%s: %s; again in %g s", *run, exc, CONFIG.retry_delay)
        return CONFIG.retry_delay
    return None


def release_legacy_finalizer(body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """Take off the finalizer kopf put on the runs of earlier operators (0.1.0: tests/fixtures/upgrade/): nothing waits
    for it any more, and a run that kept it could not be deleted. A JSON patch that tests the entry it removes: a
    finalizer list changed meanwhile fails the patch (409/422) instead of losing someone else's entry."""
    meta = body["metadata"]
    index = list(meta["finalizers"]).index(LEGACY_FINALIZER)
    path = f"/metadata/finalizers/{index}"
    operations = [{"op": "test", "path": path, "value": LEGACY_FINALIZER}, {"op": "remove", "path": path}]
    kube: Kube = memo.reconciler.kube
    resource = RUN_RESOURCES[body["kind"]]
    written = kube.patch(resource, meta.get("namespace"), meta["name"], operations, json_patch=True)
    memo.informer.hold(resource, written)


def post_events(body: Mapping[str, Any], events: list[Event], memo: kopf.Memo) -> None:
    for event in events:
        memo.reconciler.kube.post_event(body, event.type, event.reason, event.message)


def write_status(body: Mapping[str, Any], patch: dict[str, Any], memo: kopf.Memo) -> dict[str, Any]:
    """A pass's status patch (its one write of the run); the run as written."""
    meta = body["metadata"]
    resource = RUN_RESOURCES[body["kind"]]
    kube: Kube = memo.reconciler.kube
    return kube.patch(resource, meta.get("namespace"), meta["name"], {"status": patch}, subresource="status")


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
    bring (a missing prerequisite, a rejected child, a result not read yet, a run whose reconciliation has not
    happened for a while). A settled run costs no API call here: its children and its job are watched."""
    run = run_key(body)
    body = held_run(run, memo) or body
    meta, status = body["metadata"], body.get("status") or {}
    if meta.get("deletionTimestamp"):
        return
    scraped = None
    if status.get("phase") == "Running":  # the trainer's /metrics, read off the threads
        scraped = await memo.reconciler.scrape(dict(meta))
    elif not needs_retry(status, meta.get("generation"), stuck(memo.memory, run, status, meta.get("generation"), 0)):
        return  # nothing to do (most ticks of most runs; interval 0: any wait goes on, tick_pass weighs it)
    await asyncio.to_thread(pass_over, run, memo, lambda held: tick_pass(held, scraped, memo))


def tick_pass(
    body: Mapping[str, Any], scraped: tuple[dict[str, Any] | None, dict[str, Any] | None] | None, memo: kopf.Memo
) -> tuple[dict[str, Any], list[Event]]:
    """A tick's status patch and Events: a reconciliation when only a retry brings what the run waits for, then the
    trainer's progress and tracking when it was Running and scraped."""
    run, meta = run_key(body), body["metadata"]
    status, generation = dict(body.get("status") or {}), meta.get("generation")
    waited_long = stuck(memo.memory, run, status, generation, CONFIG.progress_interval)
    patch: dict[str, Any] = {}
    events: list[Event] = []
    if needs_retry(status, generation, waited_long):
        try:
            patch, events = reconcile_counted(body, memo)
        except (ApiError, RetryLater) as exc:  # its next tick retries
            log.warning("could not reconcile %s %s/%s: %s", *run, exc)
            return {}, []
        status = merge_patch(status, patch)
    if scraped is not None and status.get("phase") == "Running":
        progress, tracking = scraped
        at = now()
        patch.update(progress_patch(status, progress, at))
        update, warning = tracking_patch(body, status, generation, tracking, at)
        patch.update(update)
        if warning is not None:
            events.append(Event("Warning", *warning))
    return patch, events


def run_changed(type_: str, obj: dict[str, Any], memo: kopf.Memo) -> None:
    """A run was listed, added, changed by someone (its spec, labels or annotations, its deletion: not the echo of a
    status write, relevance.run_changed) or deleted: queue its reconciliation, or forget it (its children are the
    garbage collector's: no finalizer)."""
    run = run_key(obj)
    memo.ticker.seen(run, type_, obj)
    if type_ == "DELETED":
        memo.memory.forget(run[1], run[2])
        memo.phases.set(*run, None)
        return
    queue_run(run, obj, memo)


def queue_run(run: RunKey, body: Mapping[str, Any], memo: kopf.Memo) -> None:
    """Queue a run's pass: ahead of the children's changes while its spec is not reconciled yet (a new run, a changed
    spec: atlas_operator/workqueue.py), as a Go controller's priority queue puts its objects' own changes first."""
    meta = body["metadata"]
    memo.queue.add(run, urgent=unreconciled(body.get("status") or {}, meta.get("generation")))


# ---------------------------------------------------------------------------------------------- child events


def child_changed(type_: str, resource: Resource, obj: dict[str, Any], memo: kopf.Memo) -> None:
    """A child changed, and not by the operator's own last write (a job's or a Deployment's status, a deletion, a
    drift), or a run's pod can no longer start its containers (a missing pull Secret, a bad image), or again: queue
    its run's reconciliation now rather than at its next tick. On the event loop, for every event: the echoes of the
    operator's own writes (most events) are dropped here, without a trip through the workers' threads."""
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
    memo.queue.add((kind, obj["metadata"].get("namespace", ""), name))


def changed(type_: str, resource: Resource, obj: dict[str, Any], memo: kopf.Memo) -> None:
    """Every change the informer reports: a run's, or a child's or a run's pod's."""
    if resource.plural in RUN_PLURALS:
        run_changed(type_, obj, memo)
    else:
        child_changed(type_, resource, obj, memo)
