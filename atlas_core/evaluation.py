"""ATLAS's two-pass evaluation of a teacher: its student alone vs with its guidance, on held-out problems.

:func:`evaluate_teaching` runs the training-time protocol (:mod:`atlas_core.training.protocol`), with a
frozen teacher, over a dataset split, in batches:

1. the student is probed and answers alone, ``samples`` times per problem (the diagnosis);
2. the teacher writes guidance with the template the diagnosed capability calls for;
3. the reference answer is masked in it, the student answers ``samples`` times with it;
4. both are scored (exact match, or the given scorers) and the teaching reward is computed.

Per problem: accuracy alone and guided (the mean of the ``samples`` scores); *non-degraded* when guided ≥
alone. Every finished batch is appended to ``problems.jsonl`` in the output folder, and a run that stopped
(an endpoint down mid-way) resumes from it. :class:`TeachingEvaluation` holds every figure; ``eval.json`` is
its ``to_dict()``.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from atlas_contract.defaults import EVALUATION
from atlas_contract.names import EVAL_PROBLEMS_FILE, EVAL_REPORT_FILE
from atlas_contract.teaching import TEACHING_FIELDS, TeachingSettings
from atlas_core.tasks.arithmetic import extract_answer
from atlas_core.training import teaching
from atlas_core.training.protocol import TeachingProtocol, diagnostic_judge_of
from atlas_core.training.student import Student

#: Capability bands of the report, by the protocol's template thresholds.
CAPABILITY_BANDS = {"walkthrough": "weak", "hints": "moderate", "minimal": "strong"}
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class EvaluationRunSettings:
    """How one evaluation runs: the teaching protocol (:class:`TeachingSettings`, the contract's one definition, its
    defaults ``atlas_contract.defaults.TEACHING``) and what only an evaluation has. ``atlas eval`` builds one from its
    options (atlas_core/cli/eval_plan.py), a teacher run from its run configuration (atlas_core/training/finish.py)."""

    # In an evaluation, samples stands for the protocol's student_samples (protocol_settings).
    samples: int = EVALUATION["samples"]
    """Student answers per problem, alone and guided (K)."""
    limit: int | None = None
    """Evaluate at most this many problems (the first of the split); None = all."""
    seed: int = 0
    """Seed of the sampling and of the bootstrap."""
    batch_size: int = 32
    """Problems per protocol batch (and per line flush of ``problems.jsonl``)."""
    teacher_max_tokens: int = 256
    """Token budget of the teacher's whole completion (thinking and guidance)."""
    teacher_temperature: float = 0.0
    """Sampling temperature of the teacher; 0 = greedy."""
    teaching: TeachingSettings = field(default_factory=TeachingSettings)
    """The teaching protocol: probe, guidance and answer budgets, the student's temperature, the reward constants."""

    def problems(self) -> list[str]:
        """Every out-of-range setting, named by its field (a teaching one by its own name): each range is the
        contract's (atlas_contract.defaults.LIMITS), the one the CRD's spec.teaching and spec.evaluation state."""
        from atlas_contract.rules import setting_problem

        found = []
        for name, limit in SETTING_LIMITS.items():
            value = getattr(self, name)
            if name == "limit" and value is None:
                continue  # every problem
            accepted = (int,) if name in INTEGER_SETTINGS else (int, float)
            problem = setting_problem(limit, value, accepted)
            if problem:
                found.append(f"{name}: {problem}")
        return found + self.teaching.problems()

    def protocol_settings(self) -> TeachingSettings:
        """The protocol as this evaluation runs it: ``samples`` answers per problem."""
        return replace(self.teaching, student_samples=self.samples)

    def flat(self) -> dict[str, Any]:
        """Every setting by name, the teaching ones beside the others (as ``atlas eval``'s options name them)."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "teaching"}
        return {**values, **self.teaching.to_dict()}

    @classmethod
    def from_flat(cls, **values: Any) -> EvaluationRunSettings:
        """The settings of :meth:`flat`'s form (any subset: the rest at their defaults)."""
        teaching = {name: values.pop(name) for name in TEACHING_FIELDS if name in values}
        return cls(**values, teaching=TeachingSettings(**teaching))


# Each setting of EvaluationRunSettings but seed and teaching → its range in atlas_contract.defaults.LIMITS (the
# teaching settings check their own, under their own names).
SETTING_LIMITS = {
    "samples": "evaluation_samples",
    "limit": "evaluation_limit",
    "batch_size": "evaluation_batch_size",
    "teacher_max_tokens": "max_completion_length",
    "teacher_temperature": "teacher_temperature",
}
INTEGER_SETTINGS = frozenset({"samples", "limit", "batch_size", "teacher_max_tokens"})


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


class EvaluationError(RuntimeError):
    """A model or endpoint failed mid-way; finished problems are in ``problems.jsonl``."""

    def __init__(self, message: str, done: int, total: int):
        super().__init__(message)
        self.done, self.total = done, total


def evaluate_teaching(
    teacher: Student,
    student: Student,
    dataset: Sequence[dict[str, Any]],
    settings: EvaluationRunSettings | None = None,
    *,
    output_dir: str | Path | None = None,
    scorers: Sequence[Callable[..., list[float]]] = (),
    weights: Sequence[float] | None = None,
    meter: GuidanceMeter | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    names: dict[str, str] | None = None,
) -> TeachingEvaluation:
    """Evaluate ``teacher`` on ``student`` over ``dataset`` (rows with ``prompt`` and, unless ``scorers``
    are given, ``ground_truth``).

    ``teacher`` and ``student`` are chat models (:func:`atlas_core.training.student.load_student`: a local
    model or an OpenAI-compatible endpoint). ``meter`` measures and cuts guidance (default: the local
    teacher's tokenizer, else words).
    With ``output_dir``, ``problems.jsonl`` gets a line per problem as batches finish (a second call
    resumes from it) and ``eval.json`` the result. ``on_progress(done, total)`` follows the batches.

    Raises:
        ValueError: bad settings, or rows that cannot be scored (named).
        EvaluationError: a model failed mid-way (the finished problems are kept).
    """
    settings = settings or EvaluationRunSettings()
    problems = settings.problems()
    if problems:
        raise ValueError("\n".join(problems))
    rows = list(dataset)[: settings.limit] if settings.limit else list(dataset)
    if not rows:
        raise ValueError("dataset: no problems to evaluate")
    if not scorers:
        missing = [i for i, r in enumerate(rows) if r.get("ground_truth") in (None, "")]
        if missing:
            raise ValueError(
                f"dataset: {len(missing)} problem(s) have no ground_truth (first: row {missing[0]}); "
                "give a scorer (reward functions or a RIM config)"
            )
    names = names or {}
    meter = meter or GuidanceMeter(getattr(teacher, "tokenizer", None))
    protocol = TeachingProtocol(student, settings.protocol_settings(), scorers, weights, diagnostic_judge_of(scorers))
    path = Path(output_dir) / EVAL_PROBLEMS_FILE if output_dir is not None else None
    key = fingerprint(settings, names)
    records = resumable_records(path, rows, key)
    if on_progress:
        on_progress(len(records), len(rows))
    for start in range(len(records), len(rows), settings.batch_size):
        batch = rows[start : start + settings.batch_size]
        try:
            new = _evaluate_batch(protocol, teacher, batch, start, settings, meter, key)
        except (RuntimeError, OSError) as exc:
            raise EvaluationError(
                f"{' '.join(str(exc).split())[:300]} ({len(records)} of {len(rows)} problems done"
                f"{', kept in ' + str(path) if path else ''})",
                len(records),
                len(rows),
            ) from exc
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as out:
                for record in new:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
        records += new
        if on_progress:
            on_progress(len(records), len(rows))
    report = TeachingEvaluation(
        **asdict(figures(records, settings.seed)),
        by_capability={
            band: figures([r for r in records if r["capability"] == band], settings.seed)
            for band in CAPABILITY_BANDS.values()
        },
        teacher=names.get("teacher", getattr(teacher, "name", "")),
        student=names.get("student", getattr(student, "name", "")),
        dataset=names.get("dataset", ""),
        split=names.get("split", ""),
        scorer=names.get("scorer", "exact_match" if not scorers else "scorers"),
        samples=settings.samples,
        seed=settings.seed,
        token_unit=meter.unit,
    )
    if output_dir is not None:
        (Path(output_dir) / EVAL_REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _evaluate_batch(protocol, teacher, batch, start, settings, meter, key) -> list[dict[str, Any]]:
    tasks = [teaching.task_text(r["prompt"]) for r in batch]
    contexts = [{k: v for k, v in r.items() if k != "prompt"} for r in batch]
    diagnostics = protocol.diagnose(tasks, contexts)
    completions = teacher.generate(
        protocol.teacher_prompts(tasks, diagnostics), settings.teacher_max_tokens, 1, settings.teacher_temperature
    )
    budget = settings.teaching.max_guidance_tokens
    guidances = [meter.cut(teaching.extract_guidance(c[0].text), budget) for c in completions]
    guided = protocol.guided(tasks, contexts, guidances)
    records = []
    for i, (task, d, g) in enumerate(zip(tasks, diagnostics, guided, strict=True)):
        if any(s is None for s in d.baseline_scores):
            raise ValueError("ground_truth: needed to score the student's answers (or pass reward_funcs)")
        length = meter.count(guidances[i])
        alone = statistics.mean(d.baseline_scores)
        records.append(
            {
                "index": start + i,
                "fingerprint": key,
                "task": task,
                "ground_truth": contexts[i].get("ground_truth"),
                "capability": CAPABILITY_BANDS[teaching.template_for(d.capability_level)],
                "capability_level": d.capability_level,
                "probe": d.probe_response,
                "guidance": g.shown_guidance,
                "guidance_tokens": length,
                "answers_alone": [a.text for a in d.baseline_answers],
                "scores_alone": d.baseline_scores,
                "tokens_alone": [a.tokens for a in d.baseline_answers],
                "answers_guided": [a.text for a in g.answers],
                "scores_guided": g.scores,
                "tokens_guided": [a.tokens for a in g.answers],
                "accuracy_alone": alone,
                "accuracy_guided": g.score,
                "teaching_reward": protocol.teaching_reward(alone, g.score, length),
            }
        )
    return records


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


class GuidanceMeter:
    """Measures and cuts guidance as training does: in the teacher's tokens (words when there is no local
    tokenizer, e.g. an endpoint teacher)."""

    def __init__(self, tokenizer: Any = None):
        self.tokenizer = tokenizer
        self.unit = "tokens" if tokenizer is not None else "words"

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def cut(self, text: str, budget: int) -> str:
        if self.tokenizer is None:
            return " ".join(text.split()[:budget]) if len(text.split()) > budget else text
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return text if len(ids) <= budget else self.tokenizer.decode(ids[:budget], skip_special_tokens=True)


def fingerprint(settings: EvaluationRunSettings, names: dict[str, str]) -> str:
    """What ``problems.jsonl`` lines must share to be resumed: the models, the data and every setting
    but ``limit`` and ``batch_size`` (and the teaching student_samples, which ``samples`` stands for)."""
    skipped = ("limit", "batch_size", "student_samples")
    blob = {k: v for k, v in settings.flat().items() if k not in skipped}
    blob.update({k: names.get(k, "") for k in ("teacher", "student", "dataset", "split", "scorer")})
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:16]


def resumable_records(path: Path | None, rows: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The records an earlier call left for these problems and settings; ValueError when the file belongs to
    another evaluation (the user chooses: another output folder, or remove it)."""
    if path is None or not path.exists():
        return []
    records, cut = [], False
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                cut = True
                break  # a line cut by a crash: that problem is evaluated again
            raise ValueError(f"output: {path} line {number} is not JSON; remove the file to start over") from None
        index = len(records)
        if index >= len(rows):
            break  # a smaller limit: these problems are done; the file keeps the rest for a larger one
        if (
            record.get("fingerprint") != key
            or record.get("index") != index
            or record.get("task") != teaching.task_text(rows[index]["prompt"])
        ):
            raise ValueError(
                f"output: {path} holds another evaluation (other models, data or settings at line {number}); "
                "use another output folder or remove the file"
            )
        records.append(record)
    if cut:  # drop the cut line, so that the next problem is appended on a line of its own
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return records
