"""The operator's own Prometheus metrics (declared in :mod:`atlas_contract.metrics`) and its HTTP endpoint
(``/metrics`` and ``/healthz``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

if TYPE_CHECKING:
    from aiohttp import web

from atlas_contract import metrics as contract
from atlas_contract.names import KINDS, PHASES

REGISTRY = CollectorRegistry(auto_describe=True)
_SPECS = contract.by_name(contract.OPERATOR)


Metric = TypeVar("Metric", bound=MetricWrapperBase)


def _metric(cls: type[Metric], name: str, **kwargs: Any) -> Metric:
    spec = _SPECS[name]
    return cls(spec.name, spec.help, list(spec.labels), registry=REGISTRY, **kwargs)


RECONCILE_TOTAL = _metric(Counter, "atlas_operator_reconcile")
RECONCILE_DURATION = _metric(Histogram, "atlas_operator_reconcile_duration_seconds", buckets=contract.RECONCILE_BUCKETS)
RUNS = _metric(Gauge, "atlas_operator_runs")
RUN_PHASE = _metric(Gauge, "atlas_operator_run_phase")
WATCHDOG_RESTARTS = _metric(Counter, "atlas_operator_watchdog_restarts")
PREEMPTION_SAVES = _metric(Counter, "atlas_training_preemption_saves")
RESULTS = ("success", "error")


def initialize_series() -> None:
    """Export every kind's reconcile counters and histogram at zero from the start: a rate over a series that
    appears only at its first error is no rate (the error panel and alert would see nothing until then)."""
    for kind in KINDS:
        for result in RESULTS:
            RECONCILE_TOTAL.labels(kind, result)
        RECONCILE_DURATION.labels(kind)


class RunPhases:
    """Phase of every run seen, behind ``atlas_operator_runs`` (every kind×phase is exported, 0 included,
    so a dashboard shows a phase emptying) and ``atlas_operator_run_phase`` (one series per run, its current
    phase: what an alert names)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str, str], str] = {}
        self._counts: dict[tuple[str, str], int] = {}
        for kind in KINDS:
            for phase in PHASES:
                RUNS.labels(kind, phase).set(0)

    def set(self, kind: str, namespace: str, name: str, phase: str | None) -> None:
        with self._lock:  # only the phases left and entered are recounted: O(1) per reconciliation
            key = (kind, namespace, name)
            before = self._phases.pop(key, None)
            if phase is not None:
                self._phases[key] = phase
            if before == phase:
                return
            if before is not None:
                RUN_PHASE.remove(kind, namespace, name, before)
            if phase is not None:
                RUN_PHASE.labels(kind, namespace, name, phase).set(1)
            for changed, delta in ((before, -1), (phase, 1)):
                if changed is not None:
                    self._counts[(kind, changed)] = self._counts.get((kind, changed), 0) + delta
                    RUNS.labels(kind, changed).set(self._counts[(kind, changed)])


def exported_metric_names() -> set[str]:
    """Every series name the operator exports (counter/histogram suffixes included)."""
    names = set()
    for family in REGISTRY.collect():
        names |= {sample.name for sample in family.samples}
    return names


async def serve(host: str, port: int, ready: Callable[[], bool] | None = None) -> web.AppRunner:
    """Start ``/metrics``, ``/healthz`` (liveness: the event loop answers) and ``/readyz`` (readiness: ``ready()``,
    200 once it holds, else 503); returns the aiohttp runner (``await runner.cleanup()``)."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        # Answering at all proves the event loop (which runs every watch and handler) is not stuck.
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        # Ready once its watches have listed what they follow: a liveness that failed meanwhile would restart an
        # operator that is only starting (a cluster with many runs lists for a while).
        if ready is None or ready():
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "starting"}, status=503)

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/readyz", readyz)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
