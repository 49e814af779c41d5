"""The runs' work queue (operator/atlas_operator/workqueue.py): a key queued once however often it is named, never in
two threads at once, named again during its pass: passed again after it; a pass that asks is retried after its delay,
one that raised after a delay that doubles."""

from __future__ import annotations

import threading
import time

from atlas_operator.workqueue import WorkQueue

from harness.polling import wait_for


def blocked_queue() -> tuple[WorkQueue[str], threading.Event, list[str]]:
    """A started one-worker queue whose worker is held by the key "blocker" until the event is set; the keys passed,
    in order."""
    release = threading.Event()
    passes: list[str] = []

    def process(key: str) -> None:
        if key == "blocker":
            release.wait(5)
        passes.append(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=1, failure_delay=0.05)
    queue.start()
    queue.add("blocker")
    wait_for(lambda: len(queue) == 0, timeout=5, what="the blocker taken")
    return queue, release, passes


def test_a_key_named_many_times_before_a_worker_takes_it_is_passed_once():
    queue, release, passes = blocked_queue()  # the one worker held while "run" is named five times
    try:
        for _ in range(5):
            queue.add("run")
        assert len(queue) == 1
        release.set()
        wait_for(lambda: passes == ["blocker", "run"], timeout=5, what="one pass of run")
        time.sleep(0.1)  # (nothing more may come: a second pass would show here)
        assert passes == ["blocker", "run"]
    finally:
        queue.stop()


def test_a_key_named_during_its_pass_is_passed_again_after_it_never_beside_it():
    inside = threading.Event()
    release = threading.Event()
    running: set[str] = set()
    overlaps: list[str] = []
    passes: list[float] = []

    def process(key: str) -> None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        passes.append(time.monotonic())
        if len(passes) == 1:
            inside.set()
            release.wait(5)
        running.discard(key)

    queue: WorkQueue[str] = WorkQueue(process, workers=4, failure_delay=0.05)
    queue.start()
    try:
        queue.add("run")
        assert inside.wait(5)
        queue.add("run")  # a change during the pass: three idle workers, none may take it now
        queue.add("run")
        time.sleep(0.1)
        assert len(passes) == 1
        release.set()
        wait_for(lambda: len(passes) == 2, timeout=5, what="the second pass")
        time.sleep(0.1)
        assert len(passes) == 2 and overlaps == []
    finally:
        queue.stop()


def test_a_pass_that_asks_is_retried_after_its_delay_and_one_that_raised_after_a_doubling_delay():
    asked: list[float] = []
    raised: list[float] = []

    def process(key: str) -> float | None:
        now = time.monotonic()
        if key == "asks":
            asked.append(now)
            return 0.2 if len(asked) < 2 else None
        raised.append(now)
        if len(raised) < 4:
            raise RuntimeError("a bug in one run's pass")
        return None

    queue: WorkQueue[str] = WorkQueue(process, workers=2, failure_delay=0.1)
    queue.start()
    try:
        queue.add("asks")
        queue.add("raises")
        wait_for(lambda: len(asked) == 2 and len(raised) == 4, timeout=10, what="the retries")
        assert asked[1] - asked[0] >= 0.2
        gaps = [later - earlier for earlier, later in zip(raised, raised[1:], strict=False)]
        assert [round(g, 1) >= d for g, d in zip(gaps, (0.1, 0.2, 0.4), strict=True)] == [True] * 3, gaps
        time.sleep(0.5)  # both done: no pass comes after
        assert (len(asked), len(raised)) == (2, 4)
    finally:
        queue.stop()


def test_a_key_added_before_its_retry_is_due_is_passed_now():
    passes: list[float] = []
    queue: WorkQueue[str] = WorkQueue(lambda key: passes.append(time.monotonic()), workers=1, failure_delay=1)
    queue.start()
    try:
        started = time.monotonic()
        queue.add_after("run", 30)
        queue.add("run")
        wait_for(lambda: passes, timeout=5, what="the pass")
        assert passes[0] - started < 5
    finally:
        queue.stop()


def test_a_key_that_keeps_failing_is_said_once_per_streak(caplog):
    attempts: list[int] = []

    def process(key: str) -> None:
        attempts.append(1)
        if len(attempts) in (1, 2, 3, 5):  # a streak of three, a success, then one more failure
            raise PermissionError("403 Forbidden: atlastrainings/status")

    queue: WorkQueue[str] = WorkQueue(process, workers=1, failure_delay=0.02)
    queue.start()
    try:
        with caplog.at_level("DEBUG", logger="atlas_operator"):
            queue.add("run")
            wait_for(lambda: len(attempts) == 4, timeout=5, what="the streak and its success")
            queue.add("run")
            wait_for(lambda: len(attempts) == 6, timeout=5, what="a second streak and its end")
        said = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(said) == 2 and all(r.exc_info for r in said)  # the first failure of each streak
        assert len([r for r in caplog.records if r.levelname == "DEBUG" and "in a row" in r.getMessage()]) == 2
    finally:
        queue.stop()


def test_an_urgent_key_goes_ahead_of_those_waiting_and_a_waiting_key_named_urgently_moves_ahead():
    queue, release, passes = blocked_queue()
    try:
        for key in ("child-a", "child-b", "child-c"):
            queue.add(key)
        queue.add("new-run", urgent=True)
        queue.add("child-c", urgent=True)  # waiting already: moves ahead, behind the urgent key named before it
        queue.add("new-run")  # named again, not urgently: keeps its place
        assert len(queue) == 4
        release.set()
        wait_for(lambda: len(passes) == 5, timeout=5, what="every key passed")
        time.sleep(0.1)  # (a stale entry passed twice would show here)
        assert passes == ["blocker", "new-run", "child-c", "child-a", "child-b"]
    finally:
        queue.stop()


def test_a_key_named_urgently_during_its_pass_is_passed_again_before_the_others_waiting():
    inside = threading.Event()
    release = threading.Event()
    passes: list[str] = []

    def process(key: str) -> None:
        passes.append(key)
        if len(passes) == 1:
            inside.set()
            release.wait(5)

    queue: WorkQueue[str] = WorkQueue(process, workers=1, failure_delay=0.05)
    queue.start()
    try:
        queue.add("run")
        assert inside.wait(5)
        queue.add("other")
        queue.add("run", urgent=True)  # its spec changed during its pass
        release.set()
        wait_for(lambda: len(passes) == 3, timeout=5, what="three passes")
        assert passes == ["run", "run", "other"]
    finally:
        queue.stop()
