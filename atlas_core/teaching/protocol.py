"""The adaptive teaching protocol, batched: the one implementation training and evaluation both run.

For a batch of tasks: :meth:`TeachingProtocol.diagnose` has the student describe its approach (the
probe) and answer alone ``student_samples`` times, which measures its capability;
:func:`atlas_core.teaching.prompts.teacher_messages` picks the template for that capability;
:meth:`TeachingProtocol.guided` masks the reference answer in the teacher's guidance and has the
student answer again with it; :meth:`TeachingProtocol.teaching_reward` turns the two scores and the
guidance length into the teacher's reward.

``TeacherGRPOTrainer`` runs it with its policy as the teacher (TRL generates the guidance);
:func:`atlas_core.evaluation.evaluate_teaching` runs it with a frozen teacher.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from atlas_contract.teaching import TeachingSettings
from atlas_core.answers import extract_answer, normalize_answer
from atlas_core.teaching import prompts
from atlas_core.teaching.student import Student, StudentAnswer


@dataclass
class DiagnosticResult:
    """What the diagnostic probe measured about the student on one task."""

    capability_level: float
    """Student capability in [0, 1]: the RIM diagnostic judge's score when configured, else the mean score of
    the student's baseline answers."""
    confidence_score: float
    """Agreement between the student's baseline answers in [0, 1] (1 = all gave the same answer)."""
    identified_gaps: list[str] = field(default_factory=list)
    """What went wrong: wrong or missing answers, and the diagnostic judge's analysis when configured."""
    response_quality: dict[str, float] = field(default_factory=dict)
    """answer_rate, baseline_accuracy, mean_answer_tokens of the baseline answers."""
    probe_tokens: int = 0
    """Tokens the student spent on the probe."""
    probe_response: str = ""
    """The student's description of its approach."""
    baseline_score: float = 0.0
    """Mean score of the baseline answers (the ``baseline_score`` of the teaching reward)."""
    baseline_answers: list[StudentAnswer] = field(default_factory=list, repr=False)
    """The student's answers alone."""
    baseline_scores: list[float | None] = field(default_factory=list, repr=False)
    """Their scores (``None`` where nothing could score them)."""


@dataclass
class GuidedAnswers:
    """The student's answers with the teacher's guidance, for one task."""

    shown_guidance: str
    """The guidance as the student read it (reference answer masked)."""
    answers: list[StudentAnswer]
    scores: list[float]

    @property
    def score(self) -> float:
        return statistics.mean(self.scores)


Scorer = Callable[..., list[float]]


class TeachingProtocol:
    """Diagnose, teach, and score a student's answers alone and with guidance (see the module docstring).

    Args:
        student: the frozen student (:mod:`atlas_core.teaching.student`).
        settings: the protocol's knobs (the contract's one definition of them, atlas_contract/teaching.py).
        scorers: scorers of the student's answers (TRL reward functions, ``RIMReward``), weighted by
            ``weights``; none → exact match against each task's ``ground_truth``.
        diagnostic_judge: a ``RIMReward`` with a ``diagnostic`` judge, whose score becomes the capability.
    """

    def __init__(
        self,
        student: Student,
        settings: TeachingSettings,
        scorers: Sequence[Scorer] = (),
        weights: Sequence[float] | None = None,
        diagnostic_judge: Any = None,
    ):
        self.student = student
        self.settings = settings
        self.scorers = list(scorers)
        self.weights = list(weights) if weights is not None else [1.0] * len(self.scorers)
        if len(self.weights) != len(self.scorers):
            raise ValueError(
                f"reward_weights: expected {len(self.scorers)} weights (one per scorer), got {self.weights}"
            )
        self.diagnostic_judge = diagnostic_judge

    # ------------------------------------------------------------------ phases

    def diagnose(self, tasks: list[str], contexts: list[dict], max_tokens: int | None = None) -> list[DiagnosticResult]:
        """Probe the student on each task and measure its answers alone: one student call for the probes,
        one for the answers (``student_samples`` each)."""
        s = self.settings
        samples = s.student_samples
        probes = self.student.generate(
            [prompts.probe_messages(t) for t in tasks], max_tokens or s.max_probe_tokens, 1, s.student_temperature
        )
        answers = self.student.generate(
            [prompts.baseline_messages(t) for t in tasks], s.student_max_tokens, samples, s.student_temperature
        )
        flat_scores = self.score_answers(
            [t for t in tasks for _ in range(samples)],
            [a.text for group in answers for a in group],
            [c for c in contexts for _ in range(samples)],
        )
        judge = self.diagnostic_judge
        judged = (
            judge.evaluate_batch(tasks, [p[0].text for p in probes], [dict(c) for c in contexts]) if judge else None
        )
        results = []
        for i in range(len(tasks)):
            group = answers[i]
            group_scores = flat_scores[i * samples : (i + 1) * samples]
            scores = [x for x in group_scores if x is not None]
            extracted = [extract_answer(a.text) for a in group]
            top = Counter(extracted).most_common(1)[0][1]
            agreement = (top - 1) / (samples - 1) if samples > 1 else 0.0
            gaps = _observed_gaps(extracted, contexts[i].get("ground_truth"))
            if scores:
                baseline = statistics.mean(scores)
            else:  # nothing to score against: self-consistency is the only measurement left
                baseline = agreement * (sum(e is not None for e in extracted) / samples)
                gaps.append("no reference answer: capability estimated from the agreement of the student's answers")
            capability = judged[i].judge_scores["diagnostic"] if judged else baseline
            if judged:
                gaps.append(judged[i].judge_explanations["diagnostic"])
            results.append(
                DiagnosticResult(
                    capability_level=float(capability),
                    confidence_score=agreement,
                    identified_gaps=gaps,
                    response_quality={
                        "answer_rate": sum(e is not None for e in extracted) / samples,
                        "baseline_accuracy": baseline,
                        "mean_answer_tokens": statistics.mean(a.tokens for a in group),
                    },
                    probe_tokens=probes[i][0].tokens,
                    probe_response=probes[i][0].text,
                    baseline_score=baseline,
                    baseline_answers=list(group),
                    baseline_scores=list(group_scores),
                )
            )
        return results

    @staticmethod
    def teacher_prompts(tasks: list[str], diagnostics: list[DiagnosticResult]) -> list[list[dict[str, str]]]:
        """The teacher's conversation for each task: the template its diagnosed capability calls for."""
        return [
            prompts.teacher_messages(t, d.probe_response, d.capability_level)
            for t, d in zip(tasks, diagnostics, strict=True)
        ]

    def guided(
        self, tasks: list[str], contexts: list[dict], guidances: list[str], log_extra: Callable | None = None
    ) -> list[GuidedAnswers]:
        """The student answers each task again with its guidance, the reference answer masked (one student
        call); raises ``ValueError`` when an answer cannot be scored (no ground truth and no scorer)."""
        s = self.settings
        samples = s.student_samples
        shown = [prompts.withhold_answer(g, c.get("ground_truth")) for g, c in zip(guidances, contexts, strict=True)]
        answers = self.student.generate(
            [prompts.enhanced_messages(t, g) for t, g in zip(tasks, shown, strict=True)],
            s.student_max_tokens,
            samples,
            s.student_temperature,
        )
        flat = self.score_answers(
            [t for t in tasks for _ in range(samples)],
            [a.text for group in answers for a in group],
            [c for c in contexts for _ in range(samples)],
            log_extra=log_extra,
        )
        if any(score is None for score in flat):
            raise ValueError("ground_truth: needed to score the student's answers (or pass reward_funcs)")
        return [
            GuidedAnswers(shown[i], list(answers[i]), list(cast(list[float], flat)[i * samples : (i + 1) * samples]))
            for i in range(len(tasks))
        ]

    def teaching_reward(self, baseline_score: float, enhanced_score: float, teaching_length: int) -> float:
        """d = enhanced − baseline, L = guidance tokens: d > 0 → d + max(0, 1 − L / efficiency_horizon);
        d = 0 → 0; d < 0 → d − degradation_penalty."""
        delta = float(enhanced_score) - float(baseline_score)
        if math.isclose(delta, 0.0, abs_tol=1e-9):
            return 0.0
        if delta > 0:
            return delta + max(0.0, 1.0 - teaching_length / self.settings.efficiency_horizon)
        return delta - self.settings.degradation_penalty

    def score_answers(
        self, tasks: list[str], answers: list[str], contexts: list[dict], log_extra: Callable | None = None
    ) -> list[float | None]:
        """Scores in [0, 1] of student answers: the scorers' weighted mean, or exact match (``None`` where
        there is no ground truth to match). ``log_extra(name, values)`` receives what a scorer logs per
        answer (RIM's ``rim_rewards`` / ``rim_explanations``)."""
        if not self.scorers:
            return [
                None
                if c.get("ground_truth") is None
                else float(extract_answer(a) == normalize_answer(str(c["ground_truth"])))
                for a, c in zip(answers, contexts, strict=True)
            ]
        columns = {k: [c.get(k) for c in contexts] for k in set().union(*contexts)} if contexts else {}
        extra = {"log_extra": log_extra} if log_extra else {}
        total = [0.0] * len(answers)
        for scorer, weight in zip(self.scorers, self.weights, strict=True):
            values = scorer(prompts=tasks, completions=answers, **columns, **extra)
            total = [
                t + weight * (0.0 if v is None or not math.isfinite(v) else v)
                for t, v in zip(total, values, strict=True)
            ]
        weight_sum = sum(self.weights) or 1.0
        return [min(1.0, max(0.0, t / weight_sum)) for t in total]


def diagnostic_judge_of(scorers: Sequence[Any]) -> Any:
    """The first ``RIMReward`` among ``scorers`` with a ``diagnostic`` judge, else None."""
    from atlas_core.reward.interpretation import RIMReward

    for scorer in scorers:
        if isinstance(scorer, RIMReward) and "diagnostic" in scorer.config.judges:
            return scorer
    return None


def _observed_gaps(extracted: list[str | None], ground_truth: Any) -> list[str]:
    gaps = []
    if any(e is None for e in extracted):
        gaps.append("gave no final answer")
    if ground_truth is not None:
        expected = normalize_answer(str(ground_truth))
        for found in dict.fromkeys(e for e in extracted if e is not None and e != expected):
            gaps.append(f"answered {found} where {expected} was expected")
    return gaps
