"""A run's requests that do not wait on each other, sent at once: its name checks, and its children in waves.

Against a real API server a new run's reconciliation was a chain of 14 round trips (7 name checks, 7 creates), each
waiting its turn behind the other runs' at the server: bench/operator_throughput.py --api real measured the creates
as most of create -> children. Sent together, a run waits about one round trip per wave instead of one per child;
the server does the same work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# The order children must exist in, lowest first: the NetworkPolicies before anything that makes pods (no pod of the
# run is ever unprotected), the ConfigMap and Services the pods use before the workloads. Any other kind: last.
WAVE_OF_KIND = {"NetworkPolicy": 0, "ConfigMap": 1, "Service": 1}
LAST_WAVE = 2
# Requests in flight for the handlers together (each handler thread waits on its own, so none is starved).
THREADS = 32


def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="atlas-requests")


def waves(children: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``children`` (in apply order) grouped by WAVE_OF_KIND, each wave in their order."""
    grouped: dict[int, list[dict[str, Any]]] = {}
    for child in children:
        grouped.setdefault(WAVE_OF_KIND.get(child["kind"], LAST_WAVE), []).append(child)
    return [grouped[wave] for wave in sorted(grouped)]


def at_once(
    executor: ThreadPoolExecutor, call: Callable[[Item], Result], items: list[Item]
) -> list[tuple[Result | None, BaseException | None]]:
    """``call(item)`` for every item, concurrently (one alone: in this thread); for each, in order, its result or
    the exception it raised. Every call has ended when this returns."""
    if len(items) <= 1:
        return [_outcome(call, item) for item in items]
    futures = [executor.submit(_outcome, call, item) for item in items]
    return [future.result() for future in futures]


def _outcome(call: Callable[[Item], Result], item: Item) -> tuple[Result | None, BaseException | None]:
    try:
        return call(item), None
    except Exception as exc:  # handed back to the caller, which raises or records it in order
        return None, exc
