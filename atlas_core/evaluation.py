"""ATLAS's two-pass evaluation of a teacher: its student alone vs with its guidance, on held-out problems.

:func:`evaluate_teaching` runs the training-time protocol (:mod:`atlas_core.teaching.protocol`), with a
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
from atlas_core.evaluation_figures import CAPABILITY_BANDS, TeachingEvaluation, figures
from atlas_core.teaching import prompts
from atlas_core.teaching.protocol import TeachingProtocol, diagnostic_judge_of
from atlas_core.teaching.student import Student


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
    batch_size: int = 128
    """Problems per protocol batch (and per line flush of ``problems.jsonl``). A local model decodes at most
    ``LocalStudent.max_active_rows`` of a batch's rows at a time, a waiting row joining as one finishes, and an
    endpoint takes at most its ``max_concurrency`` requests at once: a large batch keeps either full
    (bench/real_speed.py: 128 problems in one batch against batches of 32)."""
    teacher_max_tokens: int = 256
    """Token budget of the teacher's whole completion (thinking and guidance)."""
    teacher_temperature: float = 0.0
    """Sampling temperature of the teacher; 0 = greedy."""
    teaching: TeachingSettings = field(default_factory=TeachingSettings)
    """The teaching protocol: probe, guidance and answer budgets, the student's temperature, the reward constants."""

    def problems(self) -> list[str]:
        """Every out-of-range setting, named by its field (a teaching one by its own name): each range is the
        contract's (atlas_contract.defaults.LIMITS), the one the CRD's spec.teaching and spec.evaluation state."""
        from atlas_contract.checks import setting_problem

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


class EvaluationError(RuntimeError):
    """A model or endpoint failed mid-way; finished problems are in ``problems.jsonl``."""

    def __init__(self, message: str, done: int, total: int):
        super().__init__(message)
        self.done, self.total = done, total


def _rows_to_evaluate(
    dataset: Sequence[dict[str, Any]], settings: EvaluationRunSettings, scored: bool
) -> list[dict[str, Any]]:
    """The rows under ``settings.limit``; ValueError names bad settings, no rows, or rows nothing can score."""
    problems = settings.problems()
    if problems:
        raise ValueError("\n".join(problems))
    rows = list(dataset)[: settings.limit] if settings.limit else list(dataset)
    if not rows:
        raise ValueError("dataset: no problems to evaluate")
    if not scored:
        missing = [i for i, r in enumerate(rows) if r.get("ground_truth") in (None, "")]
        if missing:
            raise ValueError(
                f"dataset: {len(missing)} problem(s) have no ground_truth (first: row {missing[0]}); "
                "give a scorer (reward functions or a RIM config)"
            )
    return rows


def _append_records(path: Path, records: list[dict[str, Any]]) -> None:
    """A finished batch's lines, so an interrupted evaluation resumes after it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")


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

    ``teacher`` and ``student`` are chat models (:func:`atlas_core.teaching.student.load_student`: a local
    model or an OpenAI-compatible endpoint). ``meter`` measures and cuts guidance (default: the local
    teacher's tokenizer, else words).
    With ``output_dir``, ``problems.jsonl`` gets a line per problem as batches finish (a second call
    resumes from it) and ``eval.json`` the result. ``on_progress(done, total)`` follows the batches.

    Raises:
        ValueError: bad settings, or rows that cannot be scored (named).
        EvaluationError: a model failed mid-way (the finished problems are kept).
    """
    settings = settings or EvaluationRunSettings()
    rows = _rows_to_evaluate(dataset, settings, scored=bool(scorers))
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
            _append_records(path, new)
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
    tasks = [prompts.task_text(r["prompt"]) for r in batch]
    contexts = [{k: v for k, v in r.items() if k != "prompt"} for r in batch]
    diagnostics = protocol.diagnose(tasks, contexts)
    completions = teacher.generate(
        protocol.teacher_prompts(tasks, diagnostics), settings.teacher_max_tokens, 1, settings.teacher_temperature
    )
    budget = settings.teaching.max_guidance_tokens
    guidances = [meter.cut(prompts.extract_guidance(c[0].text), budget) for c in completions]
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
                "capability": CAPABILITY_BANDS[prompts.template_for(d.capability_level)],
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
    records: list[dict[str, Any]] = []
    cut = False
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
            or record.get("task") != prompts.task_text(rows[index]["prompt"])
        ):
            raise ValueError(
                f"output: {path} holds another evaluation (other models, data or settings at line {number}); "
                "use another output folder or remove the file"
            )
        records.append(record)
    if cut:  # drop the cut line, so that the next problem is appended on a line of its own
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return records
