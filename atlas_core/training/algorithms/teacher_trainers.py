"""TeacherGRPOTrainer: GRPO on a teacher whose reward is how much its guidance helps a frozen student.

Per generation batch (TRL's loop, hooked in two places):

1. ``_generate_and_score_completions`` — before TRL generates, every task is diagnosed
   (:meth:`TeacherGRPOTrainer.diagnostic_probe`, batched): the student describes its approach and
   answers the task ``student_samples`` times; the baseline score is measured from those answers.
   Each prompt is replaced by the teacher prompt for its measured capability, so TRL generates the
   guidance from — and computes its log-probs on — exactly that prompt;
2. :meth:`compute_rewards` — the guidance is extracted from each teacher completion (the answer
   withheld), the student answers again with it, and ``compute_teaching_reward`` turns the two
   scores and the guidance length into the teacher's reward.

Student answers are scored by ``reward_funcs`` when given (e.g. ``RIMReward``), weighted by
``args.reward_weights``; otherwise by exact match against the dataset's ``ground_truth``.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from atlas_core.tasks.arithmetic import completion_text, extract_answer, normalize_answer
from atlas_core.training import teaching
from atlas_core.training.algorithms.grpo import GRPOTrainer
from atlas_core.training.student import Student, load_student

logger = logging.getLogger(__name__)


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


class TeacherGRPOTrainer(GRPOTrainer):
    """GRPO for the teacher of the adaptive dual-agent protocol (see the module docstring).

    Args:
        student_model: a path or hub id (loaded frozen: no gradients, eval mode; on CPU with
            ``args.student_offload``), a ``PreTrainedModel``, or the URL of an OpenAI-compatible
            endpoint (the run's ``<name>-student`` vLLM Service).
        reward_funcs: scorers of the *student's* answers (callables, ``RIMReward``); optional when
            the dataset has a ``ground_truth`` column (exact match).
        Everything else as :class:`~atlas_core.training.algorithms.grpo.GRPOTrainer`; the teaching
        fields of ``GRPOConfig`` (``max_probe_tokens``, ``efficiency_horizon``, ...) apply.
    """

    reward_column_name = "teaching_reward"

    def __init__(
        self, model: Any = None, reward_funcs=None, args=None, train_dataset=None, *, student_model=None, **kw
    ):
        if student_model is None:
            raise ValueError("student_model: required (a path, a hub id, an OpenAI-compatible URL or a model)")
        scorers = list(reward_funcs) if isinstance(reward_funcs, list) else ([reward_funcs] if reward_funcs else [])
        columns = getattr(train_dataset, "column_names", None) or []
        if not scorers and train_dataset is not None and "ground_truth" not in columns:
            raise ValueError(
                "reward_funcs: needed to score the student's answers when the dataset has no ground_truth column"
            )
        weights = list(getattr(args, "reward_weights", None) or [1.0] * len(scorers))
        if len(weights) != len(scorers):
            raise ValueError(f"reward_weights: expected {len(scorers)} weights (one per reward_funcs), got {weights}")
        if args is not None:
            args.reward_weights = None  # they weigh the student scorers, not TRL's single teaching-reward column
        self.answer_scorers = scorers
        self.scorer_weights = weights
        super().__init__(model=model, reward_funcs=None, args=args, train_dataset=train_dataset, **kw)
        device = None if self.args.student_offload else self.accelerator.device
        self.student: Student = load_student(student_model, device=device, offload=self.args.student_offload)

    # ------------------------------------------------------------------ public protocol

    def diagnostic_probe(self, task: str, max_tokens: int = 50, **context: Any) -> DiagnosticResult:
        """Probe the student on ``task``: its approach (≤ ``max_tokens``) and measured capability.

        ``context`` may carry the task's ``ground_truth``; without it the training dataset's row for
        the same task is used, and failing that (no scorer either) the capability is estimated from
        the agreement of the student's answers, which ``identified_gaps`` then says.

        Raises:
            TypeError: ``task`` is not a string, or ``max_tokens`` not an integer.
            ValueError: ``task`` is empty or ``max_tokens < 1``.
            RuntimeError: the student model failed.
        """
        if not isinstance(task, str):
            raise TypeError(f"task: expected a string, got {type(task).__name__}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens: expected an integer, got {type(max_tokens).__name__}")
        if not task.strip():
            raise ValueError("task: must not be empty")
        if max_tokens < 1:
            raise ValueError(f"max_tokens: expected at least 1, got {max_tokens}")
        if "ground_truth" not in context:
            known = self._dataset_ground_truth().get(task)
            if known is not None:
                context = {**context, "ground_truth": known}
        return self._diagnose([task], [context], max_tokens)[0]

    def generate_guidance(self, task: str, diagnostic: DiagnosticResult, max_tokens: int = 200) -> str:
        """Teacher guidance for ``task``, with the template ``diagnostic.capability_level`` calls for.

        Raises:
            TypeError: ``task`` is not a string, ``diagnostic`` not a DiagnosticResult, ``max_tokens`` not an int.
            ValueError: ``diagnostic`` is None or ``max_tokens < 10``.
            RuntimeError: the teacher model failed to generate.
        """
        if not isinstance(task, str):
            raise TypeError(f"task: expected a string, got {type(task).__name__}")
        if diagnostic is None:
            raise ValueError("diagnostic: required (the result of diagnostic_probe)")
        if not isinstance(diagnostic, DiagnosticResult):
            raise TypeError(f"diagnostic: expected a DiagnosticResult, got {type(diagnostic).__name__}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise TypeError(f"max_tokens: expected an integer, got {type(max_tokens).__name__}")
        if max_tokens < 10:
            raise ValueError(f"max_tokens: expected at least 10, got {max_tokens}")
        return self._guidance([task], [diagnostic], max_tokens)[0]

    def compute_teaching_reward(self, baseline_score: float, enhanced_score: float, teaching_length: int) -> float:
        """Reward of one guidance, with d = enhanced − baseline and L = guidance tokens:
        d > 0 → d + max(0, 1 − L / efficiency_horizon); d = 0 → 0; d < 0 → d − degradation_penalty.

        Raises:
            TypeError: an input is not a number (``teaching_length`` not an integer).
            ValueError: a score outside [0, 1] or ``teaching_length < 0``.
        """
        for name, value in (("baseline_score", baseline_score), ("enhanced_score", enhanced_score)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
            if not 0.0 <= value <= 1.0:  # also rejects NaN
                raise ValueError(f"{name}: expected a value in [0, 1], got {value}")
        if isinstance(teaching_length, bool) or not isinstance(teaching_length, int):
            raise TypeError(f"teaching_length: expected an integer, got {type(teaching_length).__name__}")
        if teaching_length < 0:
            raise ValueError(f"teaching_length: expected a value >= 0, got {teaching_length}")
        delta = float(enhanced_score) - float(baseline_score)
        if math.isclose(delta, 0.0, abs_tol=1e-9):
            return 0.0
        if delta > 0:
            return delta + max(0.0, 1.0 - teaching_length / self.args.efficiency_horizon)
        return delta - self.args.degradation_penalty

    def teaching_step(self, batch: dict[str, list]) -> list[float]:
        """One teaching interaction for a batch, every phase batched: probe and baseline in one student
        call each, guidance in one teacher call, enhanced answers in one student call.

        ``batch``: ``{"prompts": [...]}`` (or ``"prompt"``) plus optional columns such as ``ground_truth``.
        Returns one teaching reward per prompt.
        """
        prompts = batch.get("prompts", batch.get("prompt"))
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("batch: expected a non-empty list under 'prompts'")
        tasks = [teaching.task_text(p) for p in prompts]
        contexts = _row_contexts(batch, len(tasks), skip=("prompts", "prompt"))
        diagnostics = self._diagnose(tasks, contexts, self.args.max_probe_tokens)
        guidances = self._guidance(tasks, diagnostics, self.args.max_guidance_tokens)
        rewards, _ = self._teaching_rewards(tasks, contexts, [d.baseline_score for d in diagnostics], guidances)
        return rewards

    # ------------------------------------------------------------------ GRPO hooks

    def _generate_and_score_completions(self, inputs):
        tasks = [teaching.task_text(x["prompt"]) for x in inputs]
        unique = list(dict.fromkeys(tasks))
        first_row = {task: x for task, x in zip(reversed(tasks), reversed(inputs), strict=True)}
        contexts = [{k: v for k, v in first_row[t].items() if k != "prompt"} for t in unique]
        try:
            diagnoses = self._diagnose(unique, contexts, self.args.max_probe_tokens)
        except RuntimeError as exc:  # the student is down: this batch is unscorable, training goes on
            logger.warning("teacher: diagnosis failed, this batch gets no teaching reward: %s", exc)
            diagnoses = [DiagnosticResult(0.0, 0.0, [f"student unavailable: {exc}"], baseline_score=math.nan)] * len(
                unique
            )
        diagnosed = dict(zip(unique, diagnoses, strict=True))
        teacher_inputs = []
        for row, task in zip(inputs, tasks, strict=True):
            d = diagnosed[task]
            teacher_inputs.append(
                {
                    **row,
                    "prompt": teaching.teacher_messages(task, d.probe_response, d.capability_level),
                    "task": task,
                    "baseline_score": d.baseline_score,
                    "capability_level": d.capability_level,
                }
            )
        return super()._generate_and_score_completions(teacher_inputs)

    def compute_rewards(self, completions, prompts, **kwargs):
        """The teaching reward of each teacher completion (see ``compute_teaching_reward``)."""
        tasks = kwargs.get("task") or [teaching.task_text(p) for p in prompts]
        contexts = _row_contexts(kwargs, len(tasks), skip=("task", "baseline_score", "capability_level"))
        baselines = kwargs.get("baseline_score")
        guidances = [self._within_budget(teaching.extract_guidance(completion_text(c))) for c in completions]
        try:
            if baselines is None:  # called outside the loop: diagnose first
                baselines = [d.baseline_score for d in self._diagnose(tasks, contexts, self.args.max_probe_tokens)]
            rewards, stats = self._teaching_rewards(tasks, contexts, baselines, guidances, log=True)
        except (RuntimeError, ValueError) as exc:
            # A failing student, a missing ground truth or a failed diagnosis (NaN baseline) must not stop
            # training: NaN rewards mark the completions unscorable, and TRL gives them no advantage.
            logger.warning("teacher: no teaching reward for this batch: %s", exc)
            self._log_metric("teaching/unscored_batches", 1.0)
            return torch.full((len(completions),), float("nan"))
        self._log_metric("teaching/unscored_batches", 0.0)
        for name, value in stats.items():
            self._log_metric(name, value)
        return torch.tensor(rewards, dtype=torch.float32)

    def _within_budget(self, guidance: str) -> str:
        """The guidance cut to ``max_guidance_tokens`` tokens: what the student reads and the efficiency
        bonus counts (the completion itself is bounded by ``max_completion_length``, which also holds the
        teacher's thinking)."""
        ids = self.processing_class(guidance, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.args.max_guidance_tokens:
            return guidance
        return self.processing_class.decode(ids[: self.args.max_guidance_tokens], skip_special_tokens=True)

    # ------------------------------------------------------------------ batched phases

    def _diagnose(self, tasks: list[str], contexts: list[dict], max_tokens: int) -> list[DiagnosticResult]:
        samples = self.args.student_samples
        probes = self.student.generate(
            [teaching.probe_messages(t) for t in tasks], max_tokens, 1, self.args.student_temperature
        )
        answers = self.student.generate(
            [teaching.baseline_messages(t) for t in tasks],
            self.args.student_max_tokens,
            samples,
            self.args.student_temperature,
        )
        flat_scores = self.score_answers(
            [t for t in tasks for _ in range(samples)],
            [a.text for group in answers for a in group],
            [c for c in contexts for _ in range(samples)],
        )
        judge = self._diagnostic_judge()
        judged = (
            judge.evaluate_batch(tasks, [p[0].text for p in probes], [dict(c) for c in contexts]) if judge else None
        )
        results = []
        for i in range(len(tasks)):
            group = answers[i]
            scores = [s for s in flat_scores[i * samples : (i + 1) * samples] if s is not None]
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
                )
            )
        return results

    def _guidance(self, tasks: list[str], diagnostics: list[DiagnosticResult], max_tokens: int) -> list[str]:
        """Teacher (policy) guidance for each task, in one batched generate call."""
        from trl.models import unwrap_model_for_generation

        tokenizer = self.processing_class
        texts = [
            tokenizer.apply_chat_template(
                teaching.teacher_messages(t, d.probe_response, d.capability_level),
                tokenize=False,
                add_generation_prompt=True,
            )
            for t, d in zip(tasks, diagnostics, strict=True)
        ]
        padding_side, tokenizer.padding_side = tokenizer.padding_side, "left"
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.accelerator.device
        )
        tokenizer.padding_side = padding_side
        try:
            with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as model, torch.no_grad():
                output = model.generate(
                    **batch,
                    max_new_tokens=max_tokens,
                    do_sample=True,
                    temperature=self.args.temperature,
                    pad_token_id=tokenizer.pad_token_id,
                )
        except Exception as exc:  # noqa: BLE001 - reported as the documented RuntimeError
            raise RuntimeError(f"teacher failed to generate guidance: {type(exc).__name__}: {exc}") from exc
        new = output[:, batch["input_ids"].shape[1] :]
        return [teaching.extract_guidance(tokenizer.decode(row, skip_special_tokens=True)) for row in new]

    def _teaching_rewards(self, tasks, contexts, baselines, guidances, log: bool = False):
        """Student answers with each guidance, scored; returns (rewards, teaching/* statistics)."""
        samples = self.args.student_samples
        shown = [teaching.withhold_answer(g, c.get("ground_truth")) for g, c in zip(guidances, contexts, strict=True)]
        answers = self.student.generate(
            [teaching.enhanced_messages(t, g) for t, g in zip(tasks, shown, strict=True)],
            self.args.student_max_tokens,
            samples,
            self.args.student_temperature,
        )
        flat = self.score_answers(
            [t for t in tasks for _ in range(samples)],
            [a.text for group in answers for a in group],
            [c for c in contexts for _ in range(samples)],
            per_item=samples if log else None,
        )
        if any(score is None for score in flat):
            raise ValueError("ground_truth: needed to score the student's answers (or pass reward_funcs)")
        enhanced = [statistics.mean(flat[i * samples : (i + 1) * samples]) for i in range(len(tasks))]
        lengths = [len(self.processing_class(g, add_special_tokens=False)["input_ids"]) for g in guidances]
        rewards = [
            self.compute_teaching_reward(float(b), float(e), n)
            for b, e, n in zip(baselines, enhanced, lengths, strict=True)
        ]
        deltas = [e - b for b, e in zip(baselines, enhanced, strict=True)]
        stats = {
            "teaching/reward": statistics.mean(rewards),
            "teaching/student_accuracy": statistics.mean(enhanced),
            "teaching/baseline_accuracy": statistics.mean(baselines),
            "teaching/accuracy_delta": statistics.mean(deltas),
            "teaching/improvement_rate": sum(d > 1e-9 for d in deltas) / len(deltas),
            "teaching/degradation_rate": sum(d < -1e-9 for d in deltas) / len(deltas),
            "teaching/guidance_tokens_mean": statistics.mean(lengths),
            "teaching/guidance_tokens_std": statistics.pstdev(lengths),
        }
        return rewards, stats

    def score_answers(self, tasks, answers, contexts, per_item: int | None = None) -> list[float | None]:
        """Scores in [0, 1] of student answers: ``reward_funcs`` (weighted mean) or exact match
        (``None`` where there is no ground truth to match).

        With ``per_item``, per-sample information a scorer logs (RIM's ``rim_rewards`` /
        ``rim_explanations``) is folded to one value per teacher completion and logged.
        """
        if not self.answer_scorers:
            return [
                None
                if c.get("ground_truth") is None
                else float(extract_answer(a) == normalize_answer(str(c["ground_truth"])))
                for a, c in zip(answers, contexts, strict=True)
            ]
        columns = {k: [c.get(k) for c in contexts] for k in set().union(*contexts)} if contexts else {}
        extra = {}
        if per_item:
            extra["log_extra"] = lambda name, values: self._log_completion_extra(name, _fold(values, per_item))
        total = [0.0] * len(answers)
        for scorer, weight in zip(self.answer_scorers, self.scorer_weights, strict=True):
            values = scorer(prompts=tasks, completions=answers, **columns, **extra)
            total = [
                t + weight * (0.0 if v is None or not math.isfinite(v) else v)
                for t, v in zip(total, values, strict=True)
            ]
        weight_sum = sum(self.scorer_weights) or 1.0
        return [min(1.0, max(0.0, t / weight_sum)) for t in total]

    def _dataset_ground_truth(self) -> dict[str, Any]:
        """task text → ground truth of the training dataset (built once, for standalone probes)."""
        if not hasattr(self, "_ground_truth_index"):
            dataset = self.train_dataset
            index = {}
            if dataset is not None and "ground_truth" in getattr(dataset, "column_names", []):
                for prompt, truth in zip(dataset["prompt"], dataset["ground_truth"], strict=True):
                    index.setdefault(teaching.task_text(prompt), truth)
            self._ground_truth_index = index
        return self._ground_truth_index

    def _diagnostic_judge(self):
        from atlas_core.reward.interpretation import RIMReward

        for scorer in self.answer_scorers:
            if isinstance(scorer, RIMReward) and "diagnostic" in scorer.config.judges:
                return scorer
        return None


def _row_contexts(columns: dict[str, Any], n: int, skip: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per-row dicts of the list-valued columns of length ``n`` (dataset columns such as ground_truth)."""
    kept = {k: v for k, v in columns.items() if k not in skip and isinstance(v, list) and len(v) == n}
    return [{k: v[i] for k, v in kept.items()} for i in range(n)]


def _observed_gaps(extracted: list[str | None], ground_truth: Any) -> list[str]:
    gaps = []
    if any(e is None for e in extracted):
        gaps.append("gave no final answer")
    if ground_truth is not None:
        expected = normalize_answer(str(ground_truth))
        for found in dict.fromkeys(e for e in extracted if e is not None and e != expected):
            gaps.append(f"answered {found} where {expected} was expected")
    return gaps


def _fold(values: list, per_item: int) -> list:
    """One value per teacher completion from ``per_item`` student samples: mean of numbers, joined text."""
    groups = [values[i : i + per_item] for i in range(0, len(values), per_item)]
    if all(isinstance(v, (int, float)) for v in values):
        return [statistics.mean(g) for g in groups]
    return [" || ".join(str(v) for v in g) for g in groups]
