"""A teacher's warm-up demonstrations kept only where they help this student (rejection sampling).

The fixed warm-up (``builtin://teacher-multistep``, atlas_core.training.demonstrations) draws its guidance without
looking at the student. This one asks the frozen student itself, through the teaching protocol
(atlas_core.teaching.protocol), on training problems:

* the student is diagnosed as in training and evaluation (its probe, its answers alone); a problem it already
  solves gets the empty guidance, the only one that can never make it worse (non-degradation);
* on a problem it fails, the task's candidate guidances are shown to it one after another, masked as the protocol
  masks them; the first with which it answers better than alone becomes the demonstration (the candidates come
  most preferred first, and a candidate is tried only on the problems the earlier ones did not fix);
* a problem no candidate helps is dropped: the teacher is never shown guidance that did not work.

Each kept problem becomes a row in the teacher's format (the prompt the protocol gives the teacher, with the
student's probe and capability; the completion ``<thinking>…</thinking><teaching>…</teaching>``), ready for SFT.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from atlas_core.teaching import prompts
from atlas_core.teaching.protocol import TeachingProtocol
from atlas_core.training.demonstrations import teacher_completion


@dataclass
class RejectionSamplingReport:
    """What the warm-up's sampling found, for the log and the bench's record."""

    problems: int = 0
    solved_alone: int = 0
    fixed: int = 0
    dropped: int = 0
    student_calls: int = 0
    #: how many demonstrations each candidate (by its position in the task's list) won
    winners: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"winners": {str(k): v for k, v in sorted(self.winners.items())}}


def rejection_sampled_demonstrations(
    protocol: TeachingProtocol,
    rows: list[dict[str, Any]],
    candidates: Callable[[dict[str, Any]], list[str]],
    thinking: Callable[[dict[str, Any]], str],
) -> tuple[list[dict[str, Any]], RejectionSamplingReport]:
    """Teacher SFT rows (``{"prompt", "completion"}`` chat messages) for ``rows`` (problems with ``prompt`` and
    ``ground_truth``), and a report. ``candidates(row)`` lists the guidances to try, most preferred first;
    ``thinking(row)`` is the demonstration's ``<thinking>`` text."""
    tasks = [prompts.task_text(r["prompt"]) for r in rows]
    contexts = [{k: v for k, v in r.items() if k != "prompt"} for r in rows]
    diagnostics = protocol.diagnose(tasks, contexts)
    report = RejectionSamplingReport(problems=len(rows), student_calls=2)
    chosen: dict[int, str] = {}
    pending = []
    for i, d in enumerate(diagnostics):
        if d.baseline_score >= 1.0:
            chosen[i] = ""
            report.solved_alone += 1
        else:
            pending.append(i)
    options = {i: candidates(rows[i]) for i in pending}
    position = 0
    while pending:
        trying = [i for i in pending if position < len(options[i])]
        if not trying:
            break
        answers = protocol.guided(
            [tasks[i] for i in trying], [contexts[i] for i in trying], [options[i][position] for i in trying]
        )
        report.student_calls += 1
        for i, guided in zip(trying, answers, strict=True):
            if guided.score > diagnostics[i].baseline_score:
                chosen[i] = options[i][position]
                report.winners[position] += 1
        pending = [i for i in trying if i not in chosen]
        position += 1
    report.fixed = sum(report.winners.values())
    report.dropped = len(rows) - len(chosen)
    demonstrations = [
        {
            "prompt": protocol.teacher_prompts([tasks[i]], [diagnostics[i]])[0],
            "completion": [{"role": "assistant", "content": teacher_completion(thinking(rows[i]), chosen[i])}],
        }
        for i in sorted(chosen)
    ]
    return demonstrations, report
