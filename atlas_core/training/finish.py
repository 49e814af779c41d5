"""After training, on rank 0: evaluate a trained teacher (run configuration ``evaluation``) and report the
run's result where Kubernetes carries it to ``.status.result`` (``$ATLAS_RESULT_FILE``, the trainer
container's termination message; ``atlas_contract.results``)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas_contract.names import ENV_RESULT_FILE, EVAL_DIR
from atlas_contract.results import result_message
from atlas_contract.run_config import RunConfig
from atlas_contract.teaching import TeachingSettings

if TYPE_CHECKING:
    from atlas_core.evaluation import EvaluationRunSettings

logger = logging.getLogger(__name__)


def evaluation_dataset_problems(run: RunConfig) -> list[str]:
    """The evaluation's dataset, checked at start-up as it will load after training (atlas_contract.datasets's
    rules, then the data itself: a file's splits, a builtin's problem count). A hub dataset is checked when
    it loads (it needs the network). The section's own fields are the contract's to check (RunConfig.from_dict)."""
    from atlas_contract import datasets
    from atlas_core.training.data import DatasetSourceError

    if run.evaluation is None or not run.dataset.source:
        return []
    source, split = run.evaluation_source(), run.evaluation.dataset.split
    training = run.dataset.source
    if source == training and datasets.dataset_problems(training, run.dataset.split, run.algorithm):
        return []  # the run's own source is wrong: its dataset.source check names it once
    problems = datasets.evaluation_problems(source, split)
    if problems or source.startswith(datasets.HUB_SCHEME):
        return problems
    try:
        load_evaluation_dataset(run)
    except DatasetSourceError as exc:
        return str(exc).splitlines()
    except (TypeError, ValueError):  # dataset.num_samples/seed/max_operand of the wrong kind: named by their check
        return []
    return []


def load_evaluation_dataset(run: RunConfig):
    """The problems the evaluation after training answers (``evaluation.dataset.*`` named in errors)."""
    from atlas_core.training import data

    return data.load_evaluation_dataset(
        run.evaluation_source(),
        run.evaluation.dataset.split,
        run.evaluation.limit,
        default_problems=int(run.dataset.num_samples),
        seed=int(run.dataset.seed),
        max_operand=int(run.dataset.max_operand),
        training_source=run.dataset.source,
    )


def evaluation_settings(
    teaching: TeachingSettings, args: Any, samples: int, limit: int | None = None
) -> EvaluationRunSettings:
    """Evaluation settings that run the protocol exactly as a teacher run trained with it (``teaching``; the
    teacher's whole completion bounded by ``args.max_completion_length``, sampling seeded by ``args.seed``), the
    teacher decoding greedily."""
    from atlas_core.evaluation import EvaluationRunSettings

    return EvaluationRunSettings(
        samples=samples,
        limit=limit,
        seed=int(args.seed),
        teacher_max_tokens=args.max_completion_length,
        teaching=teaching,
    )


def evaluate_trained_teacher(run: RunConfig, args: Any):
    """The two-pass evaluation of the teacher saved in ``output_dir`` against the run's student, with the
    run's teaching settings; files in ``<output_dir>/evaluation`` (an interrupted one resumes)."""
    from atlas_core.answers import REWARD_FUNCTIONS
    from atlas_core.evaluation import evaluate_teaching
    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.teaching.student import load_student

    dataset = load_evaluation_dataset(run)
    reward = run.reward
    scorers = [REWARD_FUNCTIONS[name] for name in reward.funcs]
    if reward.config:
        from atlas_core.reward.interpretation import RIMReward

        scorers.append(RIMReward(reward.config))
    weights = None if reward.weights is None else [float(w) for w in reward.weights]
    settings = evaluation_settings(run.teaching, args, run.evaluation.samples, run.evaluation.limit)
    import torch

    device = "cuda" if torch.cuda.is_available() else None  # rank 0's GPU is free once training is over
    teacher = load_student(run.output_dir, device=device, role="teacher")
    student = load_student(resolve_model_path(run.student), device=device)
    return evaluate_teaching(
        teacher,
        student,
        dataset,
        settings,
        output_dir=Path(run.output_dir) / EVAL_DIR,
        scorers=scorers,
        weights=weights,
        names={
            "teacher": run.output_dir,
            "student": run.student,
            "dataset": run.evaluation_source(),
            "split": run.evaluation.dataset.split,
            "scorer": ", ".join([*reward.funcs, *([reward.config] if reward.config else [])]) or "exact_match",
        },
    )


def last_reward(log_history: list[dict[str, Any]]) -> float | None:
    """The last logged reward of the run (GRPO: the reward; teacher: the teaching reward); None for SFT."""
    for record in reversed(log_history):
        value = record.get("reward")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def write_result(
    step: int, reward: float | None, evaluation: dict[str, Any] | None, evaluation_error: str | None = None
) -> Path | None:
    """Write the result to ``$ATLAS_RESULT_FILE`` when set (a pod's termination message); the path written."""
    target = os.environ.get(ENV_RESULT_FILE)
    if not target:
        return None
    path = Path(target)
    try:
        path.write_text(result_message(step, reward, evaluation, evaluation_error))
    except OSError as exc:  # the result is a report, not the run: never fail a finished run over it
        logger.warning("could not write the run's result to %s: %s", path, exc)
        return None
    return path
