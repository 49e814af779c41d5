"""Waiting for a condition: the one polling loop of the tests and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(fn: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll ``fn`` until it returns a truthy value (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
