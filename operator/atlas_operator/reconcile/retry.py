"""When a run is reconciled again without an event: what its timer retries, and how long kopf's watch-stream retries
the API.

A watch event brings most changes (a child's, the run's own). The run's timer retries only what none will bring: a
prerequisite that appears later, a child the API server rejected, names held by someone else, a result not read yet,
and a run not reconciled at its generation for a while (its queued passes keep failing).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

from atlas_operator.kube import jittered
from atlas_operator.reconcile.memory import RunKey, RunMemory
from atlas_operator.run_status import ConditionType, EventReason

STUCK_AFTER = 3  # timer intervals a run may wait for its reconciliation at its generation before its timer does it
# kopf's own back-offs (seconds) after a failed API request, before the cap.
KOPF_BACKOFFS = (1, 1, 2, 3, 5, 8)


def unreconciled(status: dict[str, Any], generation: int | None) -> bool:
    """Whether the run's status is not (yet) its reconciliation at this generation."""
    return not status.get("phase") or status.get("observedGeneration") != generation


def stuck(memory: RunMemory, run: RunKey, status: dict[str, Any], generation: int | None, interval_s: float) -> bool:
    """Whether the run has waited for its reconciliation at its generation for STUCK_AFTER intervals (``memory``
    keeps since when): its queued passes keep failing, or wait for an event that will not come."""
    waiting = unreconciled(status, generation)
    waited = memory.unreconciled_for(run, waiting)
    return waiting and waited >= STUCK_AFTER * interval_s


def needs_retry(status: dict[str, Any], generation: int | None, stuck: bool = False) -> bool:
    """Whether a run's status leaves something that only a retry brings: a prerequisite missing (a PVC, a CRD created
    later), a child the API server rejected or a name held by an object not the run's (NameConflict, NameTaken), or
    a succeeded job whose result is not read yet (bounded by MAX_RESULT_READS). A run not reconciled at its
    generation yet is the work queue's (which retries its passes; a timer reconciling it too would only add passes),
    unless that has not happened for a while (``stuck``)."""
    if unreconciled(status, generation):
        return stuck
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    waiting = (ConditionType.PREREQUISITES_MET, ConditionType.CHILDREN_READY)
    if any((conditions.get(t) or {}).get("status") == "False" for t in waiting):
        return True
    if (conditions.get(ConditionType.VALID) or {}).get("reason") == EventReason.NAME_TAKEN:
        return True  # the other run's names may be free by now
    return status["phase"] == "Succeeded" and not status.get("result")


class RetryForever:
    """kopf's API error back-offs (seconds: 1, 1, 2, 3, 5, 8), then ``cap`` each, never exhausted; each one up to half
    of it more at random (atlas_operator.kube.jittered, client-go's jitter): the requests an outage or API Priority
    and Fairness refused in the same second do not all come back in the same second (kopf waits these for a 429
    whose Retry-After is not longer)."""

    def __init__(self, cap: float, draw: Callable[[], float] = random.random):
        self.cap = cap
        self.draw = draw

    def __iter__(self) -> Iterator[float]:
        plain = itertools.chain((s for s in KOPF_BACKOFFS if s < self.cap), itertools.repeat(self.cap))
        return (jittered(wait, self.draw) for wait in plain)
