"""TeacherGRPOTrainer: GRPO on a teacher whose reward is how much its guidance helps a frozen student.

Per generation batch (TRL's loop, hooked in two places):

1. ``generate_and_score_hook`` (TRL's batch generation, through atlas_core/training/algorithms/trl_hooks.py) —
   before TRL generates, every task is diagnosed
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
from typing import Any, cast

import torch
from transformers import PreTrainedTokenizerBase

from atlas_contract.teaching import TeachingSettings
from atlas_core.answers import completion_text
from atlas_core.teaching.prompts import extract_guidance, task_text, teacher_messages
from atlas_core.teaching.protocol import (
    DiagnosticResult,
    TeachingProtocol,
    diagnostic_judge_of,
)
from atlas_core.teaching.student import EndpointStudent, Student, load_student
from atlas_core.training.algorithms.grpo import GRPOTrainer
from atlas_core.training.algorithms.grpo_config import GRPOConfig
from atlas_core.training.watchdog import wait_for_starting_server

__all__ = ["DiagnosticResult", "TeacherGRPOTrainer"]

logger = logging.getLogger(__name__)


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
    args: GRPOConfig  # Atlas's: its teaching fields (TRL's own GRPOConfig has none)

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
        if isinstance(self.student, EndpointStudent):
            # A student server still loading its model (vLLM: minutes on GPUs, about one on 2 CPU cores) is waited
            # for here, within the first step's allowance: else the first steps would train on unscorable batches.
            wait_for_starting_server(f"{self.student.base_url}/models", self.args)

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
        return self.protocol.teaching_reward(baseline_score, enhanced_score, teaching_length)

    def teaching_step(self, batch: dict[str, list]) -> list[float]:
        """One teaching interaction for a batch, every phase batched: probe and baseline in one student
        call each, guidance in one teacher call, enhanced answers in one student call.

        ``batch``: ``{"prompts": [...]}`` (or ``"prompt"``) plus optional columns such as ``ground_truth``.
        Returns one teaching reward per prompt.
        """
        prompts = batch.get("prompts", batch.get("prompt"))
        if not isinstance(prompts, list) or not prompts:
            raise ValueError("batch: expected a non-empty list under 'prompts'")
        tasks = [task_text(p) for p in prompts]
        contexts = _row_contexts(batch, len(tasks), skip=("prompts", "prompt"))
        diagnostics = self._diagnose(tasks, contexts, self.args.max_probe_tokens)
        guidances = self._guidance(tasks, diagnostics, self.args.max_guidance_tokens)
        rewards, _ = self.teaching_rewards(tasks, contexts, [d.baseline_score for d in diagnostics], guidances)
        return rewards

    # ------------------------------------------------------------------ GRPO hooks

    def generate_and_score_hook(self, inputs):
        tasks = [task_text(x["prompt"]) for x in inputs]
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
                    "prompt": teacher_messages(task, d.probe_response, d.capability_level),
                    "task": task,
                    "baseline_score": d.baseline_score,
                    "capability_level": d.capability_level,
                }
            )
        return self.trl_generate_and_score(teacher_inputs)

    def compute_rewards(self, completions, prompts, **kwargs):
        """The teaching reward of each teacher completion (see ``compute_teaching_reward``)."""
        tasks = kwargs.get("task") or [task_text(p) for p in prompts]
        contexts = _row_contexts(kwargs, len(tasks), skip=("task", "baseline_score", "capability_level"))
        baselines = kwargs.get("baseline_score")
        guidances = [self._within_budget(extract_guidance(completion_text(c))) for c in completions]
        try:
            if baselines is None:  # called outside the loop: diagnose first
                baselines = [d.baseline_score for d in self._diagnose(tasks, contexts, self.args.max_probe_tokens)]
            rewards, stats = self.teaching_rewards(tasks, contexts, baselines, guidances, log=True)
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
        ids = self._teacher_tokenizer(guidance, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.args.max_guidance_tokens:
            return guidance
        # one sequence of ids decodes to one str (transformers' annotation also covers a batch's list)
        return cast(str, self._teacher_tokenizer.decode(ids[: self.args.max_guidance_tokens], skip_special_tokens=True))

    # ------------------------------------------------------------------ batched phases

    @property
    def _teacher_tokenizer(self) -> PreTrainedTokenizerBase:
        """The teacher's processing_class: a tokenizer (the teacher is a text model)."""
        return cast(PreTrainedTokenizerBase, self.processing_class)

    @property
    def protocol(self) -> TeachingProtocol:
        """The protocol this trainer runs (built per use: ``student`` and ``args`` may be replaced)."""
        return TeachingProtocol(
            self.student,
            TeachingSettings.of(self.args),
            self.answer_scorers,
            self.scorer_weights,
            diagnostic_judge_of(self.answer_scorers),
        )

    def _diagnose(self, tasks: list[str], contexts: list[dict], max_tokens: int) -> list[DiagnosticResult]:
        return self.protocol.diagnose(tasks, contexts, max_tokens)

    def _guidance(self, tasks: list[str], diagnostics: list[DiagnosticResult], max_tokens: int) -> list[str]:
        """Teacher (policy) guidance for each task, in one batched generate call."""
        from trl.models import unwrap_model_for_generation

        tokenizer = self._teacher_tokenizer
        texts = [
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            for messages in TeachingProtocol.teacher_prompts(tasks, diagnostics)
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
        # each row is one sequence of ids: it decodes to one str (transformers' annotation also covers a batch's list)
        return [extract_guidance(cast(str, tokenizer.decode(row, skip_special_tokens=True))) for row in new]

    def teaching_rewards(self, tasks, contexts, baselines, guidances, log: bool = False):
        """Student answers with each guidance, scored; returns (rewards, teaching/* statistics)."""
        samples = self.args.student_samples
        log_extra = None
        if log:
            log_extra = lambda name, values: self._log_completion_extra(name, _fold(values, samples))  # noqa: E731
        guided = self.protocol.guided(tasks, contexts, guidances, log_extra=log_extra)
        enhanced = [g.score for g in guided]
        lengths = [len(self._teacher_tokenizer(g, add_special_tokens=False)["input_ids"]) for g in guidances]
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
        """Scores in [0, 1] of student answers (:meth:`TeachingProtocol.score_answers`). With ``per_item``,
        per-sample information a scorer logs (RIM's ``rim_rewards`` / ``rim_explanations``) is folded to one
        value per teacher completion and logged."""
        log_extra = None
        if per_item:
            log_extra = lambda name, values: self._log_completion_extra(name, _fold(values, per_item))  # noqa: E731
        return self.protocol.score_answers(tasks, answers, contexts, log_extra=log_extra)

    def _dataset_ground_truth(self) -> dict[str, Any]:
        """task text → ground truth of the training dataset (built once, for standalone probes)."""
        if not hasattr(self, "_ground_truth_index"):
            dataset = self.train_dataset
            index: dict[str, Any] = {}
            if dataset is not None and "ground_truth" in getattr(dataset, "column_names", []):
                for prompt, truth in zip(dataset["prompt"], dataset["ground_truth"], strict=True):
                    index.setdefault(task_text(prompt), truth)
            self._ground_truth_index = index
        return self._ground_truth_index


def _row_contexts(columns: dict[str, Any], n: int, skip: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per-row dicts of the list-valued columns of length ``n`` (dataset columns such as ground_truth)."""
    kept = {k: v for k, v in columns.items() if k not in skip and isinstance(v, list) and len(v) == n}
    return [{k: v[i] for k, v in kept.items()} for i in range(n)]


def _fold(values: list, per_item: int) -> list:
    """One value per teacher completion from ``per_item`` student samples: mean of numbers, joined text."""
    groups = [values[i : i + per_item] for i in range(0, len(values), per_item)]
    if all(isinstance(v, (int, float)) for v in values):
        return [statistics.mean(g) for g in groups]
    return [" || ".join(str(v) for v in g) for g in groups]
