"""What the operator remembers about each run between its reconciliations, in one object: one ``forget`` when the
run is deleted drops all of it.

Everything here is also in the cluster, or can be learnt again: an operator restarted starts with none of it (the
counts below are then read from the run's status). It is kept so that a reconciliation costs no API call for it
(which run a pod belongs to), or so that two reconciliations that read the run before either wrote its status do
not count the same thing twice (a restart, a save on SIGTERM) or read the same pod again and again (the result).
The handlers' threads and the event loop share it: each method is one short step under one lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from atlas_contract.stops import StopReport
from atlas_operator.status_update import Failure

# A run: (kind, namespace, name). Pods and what a job's controller makes of the job name their run by namespace and
# name alone (its app.kubernetes.io/instance label), so what comes from them is kept per (namespace, name).
RunKey = tuple[str, str, str]
# A stuck pod: (the kubelet's reason, the message the run shows).
Stuck = tuple[str, str]
# A run by its uid: (namespace, name, run uid); a job or gang of it: (namespace, name, run uid, its uid).
UidKey = tuple[str, str, str | None]
JobKey = tuple[str, str, str | None, str | None]


class RunMemory:
    """Per run: its kind; its pods that cannot start and the newest save on SIGTERM its pods reported; the saves,
    restarts and result reads counted; and for the handlers, the run's lock and how long it has waited for its
    reconciliation at its generation."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], str] = {}
        self._stuck: dict[tuple[str, str], dict[str, Stuck]] = {}  # run → pod → why it cannot start
        self._stops: dict[tuple[str, str], tuple[StopReport, str | None]] = {}  # run → (report, when it ended)
        self._source_failures: dict[tuple[str, str], dict[str, Failure]] = {}  # run → pod → its fetch's failure
        self._export_failures: dict[tuple[str, str], dict[str, Failure]] = {}  # run → pod → its export's failure
        self._saves: dict[UidKey, int] = {}  # (namespace, name, run uid) → the step last counted
        self._restarts: dict[JobKey, int] = {}  # (namespace, name, run uid, gang uid) → restarts seen
        self._result_reads: dict[JobKey, int] = {}  # (namespace, name, run uid, job uid) → pod reads so far
        self._run_locks: dict[RunKey, threading.Lock] = {}
        self._unreconciled_since: dict[RunKey, float] = {}

    # -- the run and its pods

    def note_kind(self, namespace: str, name: str, kind: str) -> None:
        with self._lock:
            self._kinds[(namespace, name)] = kind

    def kind_of(self, namespace: str, name: str) -> str | None:
        """The kind of the run of this name reconciled by this process (None: none yet)."""
        with self._lock:
            return self._kinds.get((namespace, name))

    def note_pod(
        self,
        namespace: str,
        run: str,
        pod: str,
        stuck: Stuck | None,
        stop: tuple[StopReport, str | None] | None,
        failures: tuple[Failure | None, Failure | None] = (None, None),
    ) -> tuple[bool, str | None]:
        """Note whether ``pod`` of ``run`` is stuck, its stop report when its step is newer than the one noted
        (every node reports the same step: the first pod seen with it speaks for the run), and ``failures``: its
        source fetch's and its export's. Returns whether any changed what the run should say, and the run's kind."""
        key = (namespace, run)
        with self._lock:
            failed = False
            for table, failure in zip((self._source_failures, self._export_failures), failures, strict=True):
                failed |= _note(table.setdefault(key, {}), pod, failure)
                if not table[key]:
                    del table[key]
            pods = self._stuck.setdefault(key, {})
            before = pods.pop(pod, None)
            if stuck is not None:
                pods[pod] = stuck
            if not pods:
                del self._stuck[key]
            noted = self._stops.get(key)
            new_stop = stop is not None and (noted is None or stop[0].step > noted[0].step)
            if stop is not None and new_stop:
                self._stops[key] = stop
            return stuck != before or new_stop or failed, self._kinds.get(key)

    def source_failures(self, namespace: str, name: str) -> list[tuple[str, Failure]]:
        """The run's pods whose source fetch failed, by name."""
        with self._lock:
            return sorted((self._source_failures.get((namespace, name)) or {}).items())

    def export_failures(self, namespace: str, name: str) -> list[tuple[str, Failure]]:
        """The run's pods whose export failed, by name."""
        with self._lock:
            return sorted((self._export_failures.get((namespace, name)) or {}).items())

    def stuck_pods(self, namespace: str, name: str) -> list[tuple[str, Stuck]]:
        """The run's pods that cannot start, by name."""
        with self._lock:
            return sorted((self._stuck.get((namespace, name)) or {}).items())

    def stop_of(self, namespace: str, name: str) -> tuple[StopReport, str | None] | None:
        """The newest stop report the run's pods gave, and when its container ended."""
        with self._lock:
            return self._stops.get((namespace, name))

    # -- counted once

    def count_save(self, namespace: str, name: str, uid: str | None, step: int, shown: int | None) -> bool:
        """Whether a save at ``step`` is new: past the step the status shows and the one this process counted last
        (then it is counted)."""
        key: UidKey = (namespace, name, uid)
        with self._lock:
            counted = self._saves.get(key)
            if step <= max(s for s in (shown, counted, -1) if s is not None):
                return False
            self._saves[key] = step
            return True

    def restarts_seen(self, key: JobKey, shown: int, restarts: int) -> int:
        """The restarts already told of (the status shows, or this process counted) for ``key`` (namespace, name,
        run uid, gang uid), before ``restarts`` (the gang's count now: Backend.restarting_gang) is counted."""
        with self._lock:
            counted = self._restarts.get(key, 0)
            self._restarts[key] = max(counted, restarts)
            return max(counted, shown)

    def take_result_read(self, key: JobKey, limit: int) -> bool:
        """Whether the result of the job ``key`` (namespace, name, run uid, job uid) may be read once more: fewer than
        ``limit`` reads so far (this one counted)."""
        with self._lock:
            reads = self._result_reads.get(key, 0)
            if reads >= limit:
                return False
            self._result_reads[key] = reads + 1
            return True

    def stop_result_reads(self, key: JobKey, limit: int) -> None:
        """No more reads of this job's result: the same unusable message would be read again."""
        with self._lock:
            self._result_reads[key] = limit

    def result_read(self, key: JobKey) -> None:
        """The job's result was read: its count is not needed any more."""
        with self._lock:
            self._result_reads.pop(key, None)

    # -- for the handlers

    def run_lock(self, run: RunKey) -> threading.Lock:
        """The lock that keeps a run's reconciliations one at a time (two at once would both see a child missing
        and both create it)."""
        with self._lock:
            return self._run_locks.setdefault(run, threading.Lock())

    def unreconciled_for(self, run: RunKey, unreconciled: bool) -> float:
        """Seconds the run has waited for its reconciliation at its generation (0 when it does not wait)."""
        with self._lock:
            if not unreconciled:
                self._unreconciled_since.pop(run, None)
                return 0.0
            now = time.monotonic()
            return now - self._unreconciled_since.setdefault(run, now)

    # -- a deleted run

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything remembered about the run ``name`` (of either kind, any uid): it was deleted."""
        with self._lock:
            for table, named in self._tables():
                for key in [k for k in table if named(k) == (namespace, name)]:
                    del table[key]

    def holds(self, namespace: str, name: str) -> bool:
        """Whether anything is remembered about the run ``name``."""
        with self._lock:
            return any(named(key) == (namespace, name) for table, named in self._tables() for key in table)

    def _tables(
        self,
    ) -> list[tuple[dict[Any, Any], Callable[[tuple[str | None, ...]], tuple[str | None, ...]]]]:
        """Each table, and how its key names a run: (namespace, name, ...) first, or a RunKey's last two."""
        by_name = (
            self._kinds,
            self._stuck,
            self._stops,
            self._source_failures,
            self._export_failures,
            self._saves,
            self._restarts,
            self._result_reads,
        )
        by_run = (self._run_locks, self._unreconciled_since)
        return [(table, _first_two) for table in by_name] + [(table, _last_two) for table in by_run]


def _note(pods: dict[str, Failure], pod: str, failure: Failure | None) -> bool:
    """``pod``'s failure in ``pods`` (none: removed); whether that changed it."""
    before = pods.pop(pod, None)
    if failure is not None:
        pods[pod] = failure
    return before != failure


def _first_two(key: tuple[str | None, ...]) -> tuple[str | None, ...]:
    return key[:2]


def _last_two(key: tuple[str | None, ...]) -> tuple[str | None, ...]:
    return key[1:]
