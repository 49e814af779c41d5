"""Each run's periodic pass (a Running trainer's progress, what only a retry brings), without kopf's timers.

kopf serves a timer only to an object that carries its finalizer (``kopf.timer`` hard-codes ``requires_finalizer``
in kopf 1.45): one more write for every new run, and a deletion that waits for the operator, for nothing the garbage
collector does not do already (every child has the run as its controller owner). So the operator keeps its own
clock, as a Go controller requeues a key after an interval: one task, a heap of (when, run), the runs' copies from
the informer's watch of them (``seen``, from atlas_operator/handlers.py's ``run_changed``), at most ``limit`` passes at
once. A run deleted is dropped at its DELETED event; a pass is never given its run's copy from before the last event
it was told of (and atlas_operator/handlers.py's tick reads the informer's latest).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from atlas_operator.reconcile.memory import RunKey

log = logging.getLogger("atlas_operator")

Tick = Callable[[dict[str, Any]], Awaitable[None]]
TICK_DONE = "tick done"  # logged (DEBUG: `atlas operator --verbose`) after each run's pass


def tick_line(namespace: str, name: str) -> str:
    """The line a pass of the run ``namespace/name`` logs when it is done."""
    return f"[{namespace}/{name}] {TICK_DONE}"


def first_delay(interval: float) -> float:
    """Each run's first pass at its own point of the interval (0.5–1.5 of it): a thousand runs created (or listed at
    a restart) together do not all refresh in the same second."""
    return interval * (0.5 + random.random())


class RunTicker:
    """Calls ``tick(run)`` every ``interval`` seconds for each run it has seen and not seen deleted."""

    def __init__(self, interval: float, tick: Tick, limit: int) -> None:
        self.interval = interval
        self._tick = tick
        self._limit = asyncio.Semaphore(limit)
        self._runs: dict[RunKey, dict[str, Any]] = {}  # each run's latest copy
        self._due: list[tuple[float, int, RunKey]] = []  # (monotonic time, order, run)
        self._queued: set[RunKey] = set()  # the runs in ``_due``: each appears there once only
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._busy: set[RunKey] = set()  # a pass in progress: the next waits a whole interval, never overlaps
        self._tasks: set[asyncio.Task[None]] = set()

    def seen(self, run: RunKey, event_type: str | None, body: dict[str, Any]) -> None:
        """A watch event of ``run`` (None: listed): its latest copy, or the end of it."""
        if event_type == "DELETED":
            self._runs.pop(run, None)  # its heap entry is dropped when it comes due
            return
        if run not in self._queued:  # new (or made again before the entry of its deleted namesake came due)
            self._schedule(run, time.monotonic() + first_delay(self.interval))
        meta = body.get("metadata") or {}
        if "managedFields" in meta:  # a thousand runs are held, and no pass reads it (client-go's informers strip it)
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self._runs[run] = body

    def _schedule(self, run: RunKey, at: float) -> None:
        first = not self._due or at < self._due[0][0]
        self._queued.add(run)
        heapq.heappush(self._due, (at, next(self._order), run))
        if first:
            self._wake.set()

    async def run_forever(self) -> None:
        while True:
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, _, run = heapq.heappop(self._due)
                self._queued.discard(run)
                if run not in self._runs:
                    continue  # deleted: it ends here
                self._schedule(run, now + self.interval)
                if run not in self._busy:
                    self._start(run)
            self._wake.clear()
            delay = self._due[0][0] - now if self._due else None
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
            except TimeoutError:
                pass

    def _start(self, run: RunKey) -> None:
        self._busy.add(run)
        task = asyncio.get_running_loop().create_task(self._pass(run))
        self._tasks.add(task)  # held until done (the loop keeps only weak references to tasks)
        task.add_done_callback(self._tasks.discard)

    async def _pass(self, run: RunKey) -> None:
        try:
            async with self._limit:
                body = self._runs.get(run)  # the copy of when the pass starts, not of when it was due
                if body is not None:
                    await self._tick(body)
                    log.debug("%s", tick_line(run[1], run[2]))
        except Exception:  # one run's failure is logged and retried at its next tick; the clock goes on
            log.exception("the periodic pass of %s %s/%s failed", *run)
        finally:
            self._busy.discard(run)
