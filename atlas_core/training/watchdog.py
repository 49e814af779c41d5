"""The step watchdog: a training process that stops making progress ends by itself, and says why.

RL jobs hang in ways nothing else notices: a rollout server dies during a weight sync, a collective waits
for a rank that is gone, a reward endpoint never answers. The GPUs stay held and the job looks Running.
:class:`StepWatchdog` (a trainer callback, on when ``step_timeout_seconds`` > 0) watches the optimizer steps
from a thread of its own: when none completes within the limit (the first one gets a longer allowance for
loading and compiling), it prints every thread's stack and what the process was last waiting for (see
:func:`atlas_core.activity.waiting_for`), writes a one-line reason to stderr and to the container's termination
message, and exits with :data:`~atlas_contract.names.WATCHDOG_EXIT_CODE`. The job's restart policy then restarts it
(the whole gang on JobSet) and it resumes from the newest checkpoint.

``os._exit`` on purpose: a stalled process may hold locks (a collective, a blocked reward thread) that a
normal ``sys.exit`` would wait on forever.
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from transformers import TrainerCallback

from atlas_contract import defaults
from atlas_contract.names import ENV_RESULT_FILE, WATCHDOG_EXIT_CODE, WATCHDOG_MARK
from atlas_core.activity import current_activity, set_activity, waiting_for


def exit_stalled(reason: str, stream=None) -> None:
    """End the process the watchdog way: every thread's stack, then ``reason`` as the last line (stderr and the
    termination message), exit code WATCHDOG_EXIT_CODE. Never returns."""
    stream = stream or sys.stderr
    try:
        print(f"{WATCHDOG_MARK} {reason}; stacks of every thread follow", file=stream, flush=True)
        faulthandler.dump_traceback(file=stream, all_threads=True)
        print(f"{WATCHDOG_MARK} {reason}", file=stream, flush=True)
        result_file = os.environ.get(ENV_RESULT_FILE)
        if result_file:  # Kubernetes shows it as the container's termination message (kubectl describe pod)
            with open(result_file, "w") as out:
                out.write(f"{WATCHDOG_MARK} {reason}"[:4000])
    finally:
        os._exit(WATCHDOG_EXIT_CODE)


class StepWatchdog(TrainerCallback):
    """Exits the process (see the module) when no optimizer step completes within ``step_timeout_s``; before
    the first step, within ``first_step_timeout_s``. Every rank runs its own: a stalled collective stops them
    all."""

    def __init__(
        self,
        step_timeout_s: float,
        first_step_timeout_s: float,
        poll_s: float | None = None,
        on_stall: Callable[[str], None] = exit_stalled,
    ):
        self.step_timeout_s = float(step_timeout_s)
        self.first_step_timeout_s = float(first_step_timeout_s)
        self.poll_s = poll_s or min(1.0, self.step_timeout_s / 10)
        self.on_stall = on_stall
        self._last = time.monotonic()
        self._steps = 0
        self._step = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ trainer hooks

    def on_train_begin(self, args, state, control, **kwargs):
        self._last, self._step = time.monotonic(), int(state.global_step)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="atlas-step-watchdog", daemon=True)
            self._thread.start()

    def on_step_begin(self, args, state, control, **kwargs):
        set_activity(f"optimizer step {state.global_step + 1} (generation, rewards, forward/backward, all-reduce)")

    def on_step_end(self, args, state, control, **kwargs):
        self._last, self._steps, self._step = time.monotonic(), self._steps + 1, int(state.global_step)
        set_activity(f"what follows step {state.global_step} (logging, saving a checkpoint)")

    def on_train_end(self, args, state, control, **kwargs):
        self.stop()

    # ------------------------------------------------------------------ the thread

    def stop(self) -> None:
        self._stop.set()

    @property
    def last_progress(self) -> float:
        """When (time.monotonic) the last step ended, or training began: what ``stalled`` measures from."""
        return self._last

    def limit(self) -> float:
        """Seconds the step in flight may take; 0 = no limit (a first-step allowance of 0 is off)."""
        return self.first_step_timeout_s if self._steps == 0 else self.step_timeout_s

    def stalled(self, now: float) -> str | None:
        """Why the process must end at ``now`` (the step in flight is over its limit), else None."""
        idle, limit = now - self._last, self.limit()
        if limit <= 0 or idle <= limit:
            return None
        what, waited = current_activity()
        first = "the first optimizer step" if self._steps == 0 else f"an optimizer step after step {self._step}"
        return (
            f"no optimizer step completed in {idle:.0f} s ({first}; limit {limit:g} s); "
            f"last waiting for {what} (for {waited:.0f} s)"
        )

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            reason = self.stalled(time.monotonic())
            if reason:
                self.on_stall(reason)
                return


def first_step_timeout(step_timeout_s: float, first_step_timeout_s: float | None) -> float:
    """The first step's allowance: as set (0 = no limit on the first step), else (None) the contract's default for
    this step timeout."""
    if first_step_timeout_s is None:
        return defaults.first_step_timeout(step_timeout_s)
    return float(first_step_timeout_s)


def server_check_timeout(args) -> float | None:
    """How long generation waits for an unreachable rollout server before the watchdog's exit; None when the
    watchdog is off (``step_timeout_seconds`` 0: nothing ends the process, generation waits as TRL does)."""
    if float(getattr(args, "step_timeout_seconds", 0) or 0) <= 0:
        return None
    return float(args.server_timeout_seconds)


def wait_for_starting_server(url: str, args) -> None:
    """Before training: wait for a server the trainer needs (the teacher's student endpoint) to start serving —
    within the first step's allowance and then the watchdog's exit, with the watchdog on (its 0: no limit);
    within ``server_timeout_seconds`` and then a ``RuntimeError`` naming the URL, with it off (a wrong URL must not
    hang a local run)."""
    step_timeout = float(getattr(args, "step_timeout_seconds", 0) or 0)
    if step_timeout > 0:
        allowance = first_step_timeout(step_timeout, getattr(args, "first_step_timeout_seconds", None))
        wait_for_server(url, allowance if allowance > 0 else math.inf)
        return

    def refuse(message: str) -> None:
        raise RuntimeError(message)

    wait_for_server(url, float(getattr(args, "server_timeout_seconds", defaults.SERVER_TIMEOUT_S)), on_stall=refuse)


def watchdog_callbacks(args) -> list[TrainerCallback]:
    """The watchdog when ``args.step_timeout_seconds`` > 0 (Atlas configs); none otherwise."""
    timeout = float(getattr(args, "step_timeout_seconds", 0) or 0)
    if timeout <= 0:
        return []
    return [StepWatchdog(timeout, first_step_timeout(timeout, getattr(args, "first_step_timeout_seconds", None)))]


# --------------------------------------------------------------------------- servers


def rollout_server_url(args) -> str | None:
    """The rollout server a trainer generates with (use_vllm, vllm_mode server), else None."""
    if not getattr(args, "use_vllm", False) or getattr(args, "vllm_mode", None) != "server":
        return None
    base = getattr(args, "vllm_server_base_url", None)
    if base:
        return str(base).rstrip("/")
    return f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def wait_for_server(url: str, limit_s: float, poll_s: float = 1.0, on_stall: Callable[[str], None] = exit_stalled):
    """Block until ``url`` (a server's health endpoint) answers 2xx, for at most ``limit_s`` seconds; past that,
    the watchdog exit naming the URL (an unreachable rollout server would otherwise hang generation, or TRL's
    weight sync, forever)."""
    deadline = time.monotonic() + limit_s
    last_error = "no answer yet"
    with waiting_for(f"the server at {url}"):
        while True:
            try:
                with urllib.request.urlopen(url, timeout=max(0.5, min(poll_s * 5, limit_s))) as answer:
                    if 200 <= answer.status < 300:
                        return
                    last_error = f"HTTP {answer.status}"
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last_error = str(getattr(exc, "reason", exc))
            if time.monotonic() >= deadline:
                on_stall(f"the server at {url} did not answer for {limit_s:g} s (last: {last_error})")
                return
            time.sleep(poll_s)
