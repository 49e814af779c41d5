"""The runs waiting for a reconciliation, and the threads that reconcile them: client-go's workqueue.

A key (a run) is queued once however many events name it before a worker takes it; a key a worker is reconciling is
never given to a second worker, and one named again meanwhile is queued again when the first pass ends (it sees the
newer change). A pass that asks for it is retried after a delay; one that raised is retried after a delay that doubles
with each failure in a row (client-go's per-item exponential back-off), so a run that cannot be reconciled is neither
dropped nor retried at full speed, and is said once per streak of failures (then at DEBUG).

A key added ``urgent`` goes ahead of every key that is not (controller-runtime's priority queue): the operator's
handlers add a run urgently while its spec is not reconciled yet (a new run, a changed spec), and for a child's
change otherwise, so that a new run does not wait behind the passes its predecessors' children ask for (a server
Deployment or a pod going ready). (The throughput bench's runs never go ready: one pass each, nothing to reorder.)

This replaced kopf's handling of the runs (a worker task per object, its handler state and diff-base written in the
run's status, a patch per handler and the wait for its echo): each event of a run now costs a lookup and a set
insertion on the event loop, and each reconciliation one thread hand-off (bench/operator_throughput.py).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger("atlas_operator")

Key = TypeVar("Key", bound=Hashable)
# A pass over a key: None when it is done, else the seconds after which to do it again.
Process = Callable[[Key], "float | None"]
MAX_FAILURE_DELAY_S = 300.0  # the longest wait before retrying a pass that raised (client-go's cap is 1,000 s)


class WorkQueue(Generic[Key]):
    """Keys to process, each by one of ``workers`` threads at a time, in the order they were first named."""

    def __init__(self, process: Process[Key], workers: int, failure_delay: float, name: str = "atlas-reconcile"):
        self._process = process
        self._workers = workers
        self._failure_delay = failure_delay
        self._name = name
        self._cond = threading.Condition()
        # Keys in the order they were named, the urgent ones apart; an entry whose key is not waiting any more (taken
        # from the other deque first) is skipped when it comes up.
        self._urgent_queue: deque[Key] = deque()
        self._queue: deque[Key] = deque()
        self._dirty: set[Key] = set()  # named since its last pass began: queued, or to queue when that pass ends
        self._urgent: set[Key] = set()  # named urgently since its last pass began
        self._processing: set[Key] = set()
        self._later: list[tuple[float, int, Key]] = []  # (monotonic time, order, key): retries not due yet
        self._order = itertools.count()
        self._failures: dict[Key, int] = {}  # passes in a row that raised, per key
        self._threads: list[threading.Thread] = []
        self._stopping = False

    def start(self) -> None:
        for number in range(self._workers):
            thread = threading.Thread(target=self._work, name=f"{self._name}-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """No new pass starts; waits up to ``timeout`` for those in progress."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def add(self, key: Key, urgent: bool = False) -> None:
        """Process ``key`` (again): once, however often it is added before a worker takes it; ``urgent``: before
        every key waiting that is not (a key waiting already moves ahead)."""
        with self._cond:
            moved = urgent and key not in self._urgent
            if urgent:
                self._urgent.add(key)
            if key in self._dirty and not moved:
                return
            self._dirty.add(key)
            if key not in self._processing:
                (self._urgent_queue if urgent else self._queue).append(key)
                self._cond.notify()

    def add_after(self, key: Key, delay: float) -> None:
        """Process ``key`` in ``delay`` seconds (sooner if it is added meanwhile)."""
        with self._cond:
            heapq.heappush(self._later, (time.monotonic() + delay, next(self._order), key))
            self._cond.notify()

    def __len__(self) -> int:
        """Keys waiting (queued, not being processed; retries not due yet left out)."""
        with self._cond:
            return len(self._dirty - self._processing)

    def _take(self) -> Key | None:
        """The next key waiting, urgent ones first (caller holds the lock)."""
        for queue in (self._urgent_queue, self._queue):
            while queue:
                key = queue.popleft()
                if key in self._dirty and key not in self._processing:
                    return key
        return None

    def _next(self) -> Key | None:
        with self._cond:
            while not self._stopping:
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    due = heapq.heappop(self._later)[2]
                    if due not in self._dirty:
                        self._dirty.add(due)
                        if due not in self._processing:
                            self._queue.append(due)
                taken = self._take()
                if taken is not None:
                    self._dirty.discard(taken)
                    self._urgent.discard(taken)
                    self._processing.add(taken)
                    return taken
                self._cond.wait(self._later[0][0] - now if self._later else None)
            return None

    def _done(self, key: Key, retry_in: float | None) -> None:
        with self._cond:
            self._processing.discard(key)
            if retry_in is not None:
                heapq.heappush(self._later, (time.monotonic() + retry_in, next(self._order), key))
            if key in self._dirty:
                (self._urgent_queue if key in self._urgent else self._queue).append(key)
            self._cond.notify()

    def _work(self) -> None:
        while (key := self._next()) is not None:
            retry_in: float | None
            try:
                retry_in = self._process(key)
                self._failures.pop(key, None)
            except Exception as exc:  # one key's failure is said and retried later; the other keys go on
                failures = self._failures[key] = self._failures.get(key, 0) + 1
                retry_in = min(MAX_FAILURE_DELAY_S, self._failure_delay * 2 ** (failures - 1))
                if failures == 1:  # said once per streak: a refusal for good is not an error line every few seconds
                    log.exception("reconciling %s failed; again in %.0f s, then less and less often", key, retry_in)
                else:
                    log.debug("reconciling %s failed (%d in a row): %s; again in %.0f s", key, failures, exc, retry_in)
            self._done(key, retry_in)
