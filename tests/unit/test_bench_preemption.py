"""bench/preemption.py's judgement of a restart, without the 2-node run it measures."""

from bench.preemption import restart_ok


def test_a_restart_that_trains_each_remaining_step_once_is_ok() -> None:
    assert restart_ok(5, [6, 7, 8], 8, [0, 0])


def test_a_restart_that_repeats_or_skips_a_step_or_fails_is_not_ok() -> None:
    assert not restart_ok(5, [5, 6, 7, 8], 8, [0, 0])
    assert not restart_ok(5, [7, 8], 8, [0, 0])
    assert not restart_ok(5, [6, 7, 8], 8, [0, 1])


def test_a_stop_that_saved_nothing_is_not_ok_rather_than_a_crash() -> None:
    # No stop report: the step saved is None (it raised a TypeError on None + 1 before).
    assert not restart_ok(None, [1, 2, 3], 3, [0, 0])
