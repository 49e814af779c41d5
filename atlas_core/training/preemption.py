"""Stop on SIGTERM after the step in flight, with a checkpoint at that step (Kueue preemption, drains, spot).

Kubernetes stops a pod with SIGTERM and kills it ``terminationGracePeriodSeconds`` later. On SIGTERM a rank only
notes the time: it may be in the middle of a forward pass, a generation or a collective. At the end of every
optimizer step the ranks agree in one collective (an all-reduce of "a signal came", max) whether any of them got
one — on a drain only one node's pods are signalled — so every rank stops after the same step: the trainer saves
a checkpoint there (written whole or not at all, atlas_core/training/checkpoints.py) and ends its loop, and the
process exits with ``STOP_EXIT_CODE`` after each node's first process has written its report
(atlas_contract/stops.py) as the container's termination message. A restart resumes from that checkpoint, so a
stop loses at most the step in flight (and nothing when the signal came during a save).

The callback also measures what a stop needs, a step and a save, and warns when the pod's grace period
(``ATLAS_TERMINATION_GRACE_SECONDS``) is shorter than they took: a save cut short by SIGKILL falls back to the
previous checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from transformers import TrainerCallback

from atlas_contract.names import ENV_RESULT_FILE, ENV_TERMINATION_GRACE
from atlas_contract.stops import StopReport

logger = logging.getLogger(__name__)


class StopOnSignal(TrainerCallback):
    """See the module. ``report`` is set once the trainer has saved the checkpoint it stops at."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,), grace_s: float | None = None):
        self.signals = signals
        self.grace_s = grace_s if grace_s is not None else float(os.environ.get(ENV_TERMINATION_GRACE) or 0)
        self.received: tuple[str, float] | None = None  # (signal name, time.monotonic()) of the first signal
        self.stopping_at: int | None = None  # the step every rank agreed to stop after
        self.report: StopReport | None = None
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._step_began = self._step_ended = None
        self._step_s = 0.0
        self._warned_s = 0.0

    # ------------------------------------------------------------------ the signal

    def _on_signal(self, signum, frame) -> None:
        if self.received is None:
            self.received = (signal.Signals(signum).name, time.monotonic())
            print(
                f"atlas: {self.received[0]}: stopping after the step in flight, with a checkpoint there",
                file=sys.stderr,
                flush=True,
            )

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only; a trainer run in a thread keeps the default
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    # ------------------------------------------------------------------ trainer hooks

    def on_train_begin(self, args, state, control, **kwargs):
        self.install()

    def on_step_begin(self, args, state, control, **kwargs):
        self._step_began = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        if self._step_began is not None:
            self._step_s = now - self._step_began
        self._step_ended = now
        if any_rank(self.received is not None, args.device):  # every rank, every step: the same answer
            self.stopping_at = int(state.global_step)
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        now = time.monotonic()
        save_s = now - self._step_ended if self._step_ended is not None else 0.0
        needed = self._step_s + save_s
        if state.is_world_process_zero and self.grace_s and needed > self.grace_s and needed > 1.25 * self._warned_s:
            self._warned_s = needed
            logger.warning(
                "terminationGracePeriodSeconds (%g s) is shorter than a step and a save take (%.0f s + %.0f s at step "
                "%d): a stop on SIGTERM would be killed before its checkpoint is complete and fall back to the "
                "previous one. Raise spec.terminationGracePeriodSeconds.",
                self.grace_s,
                self._step_s,
                save_s,
                state.global_step,
            )
        if self.stopping_at is not None and self.stopping_at == state.global_step:
            signalled = self.received[1] if self.received else now  # a rank told by the others, not the kubelet
            self.report = StopReport(step=int(state.global_step), seconds=now - signalled, signal=self.signal_name)

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopping_at is None:
            self.uninstall()  # training is over: a SIGTERM during the evaluation ends the process as usual

    @property
    def signal_name(self) -> str:
        return self.received[0] if self.received else "SIGTERM"


def any_rank(flag: bool, device) -> bool:
    """True on every rank when ``flag`` is True on any: one all-reduce (max) when a process group is up."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def stop_callbacks(args) -> list[TrainerCallback]:
    """What every Atlas trainer gets: stop on SIGTERM with a checkpoint at the step in flight."""
    return [StopOnSignal()]


def stop_of(trainer) -> StopReport | None:
    """The stop ``trainer`` made on a signal (its checkpoint saved), or None when it trained to the end."""
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, StopOnSignal):
            return callback.report
    return None


def write_stop_report(report: StopReport, local_process_index: int) -> None:
    """Each node's first process: the report as the container's termination message ($ATLAS_RESULT_FILE), and on
    stderr."""
    print(report.message(), file=sys.stderr, flush=True)
    path = os.environ.get(ENV_RESULT_FILE)
    if path and local_process_index == 0:
        try:
            Path(path).write_text(report.message() + "\n")
        except OSError as exc:  # the report is for the operator; the stop itself is already done
            print(f"warning: cannot write the stop report to {path}: {exc}", file=sys.stderr)
