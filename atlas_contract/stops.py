"""A trainer's report of a stop on SIGTERM (Kueue preemption, a node drain, a spot reclaim).

Each node's first process writes it as its container's termination message when every rank has saved a
checkpoint at the step in flight (atlas_core.training.preemption); the operator reads it from the pod to
report the saved step in the run's status, an Event and ``atlas_training_preemption_saves_total``. One
format, written and parsed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from atlas_contract.names import CHECKPOINT_PREFIX, STOP_MARK

_REPORT = re.compile(
    re.escape(STOP_MARK)
    + r" (?P<signal>[A-Z0-9]+): saved "
    + re.escape(CHECKPOINT_PREFIX)
    + r"(?P<step>\d+) \(step \d+\) in (?P<seconds>\d+(?:\.\d+)?) s"
)


@dataclass(frozen=True)
class StopReport:
    step: int  # the checkpoint every rank saved, at the step in flight when the signal came
    seconds: float  # from the signal to the saved checkpoint
    signal: str = "SIGTERM"

    def message(self) -> str:
        return (
            f"{STOP_MARK} {self.signal}: saved {CHECKPOINT_PREFIX}{self.step} (step {self.step}) in "
            f"{self.seconds:.1f} s; the job resumes from it when restarted"
        )


def parse_stop_report(text: str | None) -> StopReport | None:
    """The stop report in a termination message, or None when it holds none."""
    for line in (text or "").splitlines():
        match = _REPORT.match(line.strip())
        if match:
            return StopReport(int(match["step"]), float(match["seconds"]), match["signal"])
    return None
