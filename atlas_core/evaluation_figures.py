"""The figures of a teaching evaluation: accuracy alone and guided, the delta with its paired-bootstrap 95%
interval, non-degradation, and the same by diagnosed capability. Computed from the per-problem records
(``problems.jsonl`` lines) that :func:`atlas_core.evaluation.evaluate_teaching` writes; ``eval.json`` is a
:class:`TeachingEvaluation`'s ``to_dict()``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from atlas_core.answers import extract_answer

#: Capability bands of the report, by the protocol's template thresholds.
CAPABILITY_BANDS = {"walkthrough": "weak", "hints": "moderate", "minimal": "strong"}
BOOTSTRAP_RESAMPLES = 2000


@dataclass
class Figures:
    """The figures of a set of problems (all of them, or one capability band)."""

    problems: int
    """Problems evaluated."""
    student_accuracy: float | None
    """Mean accuracy of the student alone (per problem: the share of its ``samples`` answers scored right)."""
    guided_accuracy: float | None
    """Mean accuracy of the student with the teacher's guidance."""
    accuracy_delta: float | None
    """guided − alone, as a fraction (0.157 = +15.7 points)."""
    accuracy_delta_low: float | None
    """Lower end of the paired bootstrap 95% interval of the delta."""
    accuracy_delta_high: float | None
    """Upper end of that interval."""
    non_degradation_rate: float | None
    """Share of problems where guided ≥ alone."""
    improvement_rate: float | None
    """Share of problems where guided > alone."""
    mean_degradation: float | None
    """Mean of alone − guided over the degraded problems (None when none degraded)."""
    completion_rate_alone: float | None
    """Share of the student's answers alone from which an answer could be extracted."""
    completion_rate_guided: float | None
    """The same, with guidance."""
    guidance_tokens_mean: float | None
    """Mean length of the guidance the student read (see ``TeachingEvaluation.token_unit``)."""
    student_tokens_alone_mean: float | None
    """Mean tokens of a student answer alone."""
    student_tokens_guided_mean: float | None
    """Mean tokens of a student answer with guidance."""
    teaching_reward_mean: float | None
    """Mean teaching reward (the training formula) of the guidance."""


@dataclass
class TeachingEvaluation(Figures):
    """Every figure of an evaluation, overall and by diagnosed capability (weak / moderate / strong)."""

    by_capability: dict[str, Figures] = field(default_factory=dict)
    """The same figures for the problems diagnosed weak (< 0.3), moderate and strong (> 0.7)."""
    teacher: str = ""
    student: str = ""
    dataset: str = ""
    split: str = ""
    scorer: str = "exact_match"
    samples: int = 0
    seed: int = 0
    token_unit: str = "tokens"
    """``tokens`` (the teacher's tokenizer) or ``words`` (an endpoint teacher without a local tokenizer)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """What ``.status.result.evaluation`` carries (``atlas_contract.results``)."""
        from atlas_contract.results import evaluation_summary

        return evaluation_summary(self.to_dict())


def figures(records: list[dict[str, Any]], seed: int = 0) -> Figures:
    """The figures of per-problem records (``problems.jsonl`` lines)."""
    n = len(records)
    if not n:
        return Figures(0, *([None] * 14))
    alone = [r["accuracy_alone"] for r in records]
    guided = [r["accuracy_guided"] for r in records]
    deltas = [g - a for a, g in zip(alone, guided, strict=True)]
    degraded = [-d for d in deltas if d < -1e-9]
    low, high = paired_bootstrap(alone, guided, seed)

    def answered(key: str) -> float:
        texts = [t for r in records for t in r[key]]
        return sum(extract_answer(t) is not None for t in texts) / len(texts)

    return Figures(
        problems=n,
        student_accuracy=statistics.mean(alone),
        guided_accuracy=statistics.mean(guided),
        accuracy_delta=statistics.mean(deltas),
        accuracy_delta_low=low,
        accuracy_delta_high=high,
        non_degradation_rate=sum(d >= -1e-9 for d in deltas) / n,
        improvement_rate=sum(d > 1e-9 for d in deltas) / n,
        mean_degradation=statistics.mean(degraded) if degraded else None,
        completion_rate_alone=answered("answers_alone"),
        completion_rate_guided=answered("answers_guided"),
        guidance_tokens_mean=statistics.mean(r["guidance_tokens"] for r in records),
        student_tokens_alone_mean=statistics.mean(t for r in records for t in r["tokens_alone"]),
        student_tokens_guided_mean=statistics.mean(t for r in records for t in r["tokens_guided"]),
        teaching_reward_mean=statistics.mean(r["teaching_reward"] for r in records),
    )


def paired_bootstrap(
    alone: Sequence[float], guided: Sequence[float], seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """95% interval of mean(guided − alone), resampling problems with replacement (pairs kept together)."""
    import numpy as np

    deltas = np.asarray(guided, dtype=float) - np.asarray(alone, dtype=float)
    rng = np.random.default_rng(seed)
    means = deltas[rng.integers(0, len(deltas), size=(resamples, len(deltas)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def _points(fraction: float | None) -> float | None:
    return None if fraction is None else 100 * fraction


def _cell(value: float | None, spec: str) -> str:
    """A figure as ``spec`` formats it, or "-" where there is none (an evaluation of no problems has no figures)."""
    return "-" if value is None else format(value, spec)


def comparison_lines(reports: dict[str, TeachingEvaluation], label_width: int = 28) -> list[str]:
    """Teachers side by side in plain text, as the benches print them: accuracy alone and guided, the delta in points
    with its 95% interval, non-degradation and guidance tokens; then each one's split by diagnosed capability."""
    lines = [
        f"{'':{label_width}}{'alone':>9}{'guided':>9}{'delta pts':>11}{'95% CI':>18}{'non-degr.':>11}{'guid. tok':>11}"
    ]
    for label, r in reports.items():
        low, high = _points(r.accuracy_delta_low), _points(r.accuracy_delta_high)
        interval = "-" if low is None or high is None else f"[{low:+.1f}, {high:+.1f}]"
        lines.append(
            f"{label:{label_width}}{_cell(r.student_accuracy, '.1%'):>9}{_cell(r.guided_accuracy, '.1%'):>9}"
            f"{_cell(_points(r.accuracy_delta), '+.1f'):>11}{interval:>18}{_cell(r.non_degradation_rate, '.1%'):>11}"
            f"{_cell(r.guidance_tokens_mean, '.1f'):>11}"
        )
    for label, r in reports.items():
        bands = ", ".join(
            f"{band} {f.problems}: {f.student_accuracy:.0%}→{f.guided_accuracy:.0%}"
            for band, f in r.by_capability.items()
            if f.problems
        )
        lines.append(f"  by capability, {label}: {bands}")
    return lines
