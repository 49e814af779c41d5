"""What the process is waiting for right now (a reward function, a server, a step): one register per process,
marked by whoever waits (:func:`waiting_for`) and named by the step watchdog (atlas_core.training.watchdog) when
it fires. Standard library only: the frozen student (atlas_core.teaching) marks its endpoint calls too, and sits
below training."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class _Activity:
    what: str = "starting up (loading the model and data)"
    since: float = 0.0


_activity = _Activity(since=time.monotonic())
_activity_lock = threading.Lock()


@contextlib.contextmanager
def waiting_for(what: str) -> Iterator[None]:
    """Mark what the process is waiting for while the block runs (a reward function, a server, a step): the
    watchdog names the last one when it fires."""
    with _activity_lock:
        previous = _Activity(_activity.what, _activity.since)
        _activity.what, _activity.since = what, time.monotonic()
    try:
        yield
    finally:
        with _activity_lock:
            _activity.what, _activity.since = previous.what, previous.since


def current_activity() -> tuple[str, float]:
    """(what the process waits for, seconds since it started waiting)."""
    with _activity_lock:
        return _activity.what, time.monotonic() - _activity.since


def set_activity(what: str) -> None:
    """Mark what the process does from now on (a trainer's step), until the next mark."""
    with _activity_lock:
        _activity.what, _activity.since = what, time.monotonic()
