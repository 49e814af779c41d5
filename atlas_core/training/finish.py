"""After training, on rank 0: evaluate a trained teacher (run configuration ``evaluation``) and report the
run's result where Kubernetes carries it to ``.status.result`` (``$ATLAS_RESULT_FILE``, the trainer
container's termination message; ``atlas_contract.results``)."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from atlas_contract import rules
from atlas_contract.defaults import EVALUATION
from atlas_contract.names import ENV_RESULT_FILE, EVAL_DIR
from atlas_contract.results import result_message

logger = logging.getLogger(__name__)

EVALUATION_KEYS = {"dataset": {"source", "split"}, "samples": None, "limit": None}


def evaluation_problems(cfg: DictConfig) -> list[str]:
    """Every problem of the run configuration's ``evaluation`` section (``null`` = no evaluation)."""
    section = cfg.get("evaluation")
    if section is None:
        return []
    if not OmegaConf.is_dict(section):
        return [f"evaluation: expected a mapping (dataset, samples, limit) or null, got {section!r}"]
    problems = []
    if cfg.algorithm != "teacher":
        problems.append(f"evaluation: only a teacher run evaluates its teaching (algorithm is '{cfg.algorithm}')")
    for key in section:
        if key not in EVALUATION_KEYS:
            problems.append(f"evaluation.{key}: unknown configuration key (known: {', '.join(EVALUATION_KEYS)})")
    dataset = section.get("dataset")
    if dataset is not None:
        if not OmegaConf.is_dict(dataset):
            problems.append(f"evaluation.dataset: expected a mapping (source, split), got {dataset!r}")
        else:
            for key in dataset:
                if key not in EVALUATION_KEYS["dataset"]:
                    problems.append(f"evaluation.dataset.{key}: unknown configuration key (known: source, split)")
            for key in ("source", "split"):
                value = dataset.get(key)
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    problems.append(f"evaluation.dataset.{key}: expected a non-empty string, got {value!r}")
    for key in ("samples", "limit"):
        value = section.get(key)
        if value is None:
            continue  # samples: the default; limit: every problem
        problem = rules.setting_problem(f"evaluation_{key}", value, (int,))
        if problem:
            problems.append(f"evaluation.{key}: {problem}")
    if not problems:
        problems += evaluation_dataset_problems(cfg)
    return problems


def evaluation_dataset_problems(cfg: DictConfig) -> list[str]:
    """The evaluation's dataset, checked at start-up as it will load after training (atlas_contract.datasets's
    rules, then the data itself: a file's splits, a builtin's problem count). A hub dataset is checked when
    it loads (it needs the network)."""
    from atlas_contract import datasets
    from atlas_core.training.data import DatasetSourceError

    request = evaluation_request(cfg)
    if request is None or OmegaConf.is_missing(cfg.dataset, "source"):
        return []
    training = str(cfg.dataset.source)
    if request["source"] == training and datasets.dataset_problems(training, str(cfg.dataset.split), cfg.algorithm):
        return []  # the run's own source is wrong: its dataset.source check names it once
    problems = datasets.evaluation_problems(request["source"], request["split"])
    if problems or request["source"].startswith(datasets.HUB_SCHEME):
        return problems
    try:
        load_evaluation_dataset(cfg, request)
    except DatasetSourceError as exc:
        return str(exc).splitlines()
    except (TypeError, ValueError):  # dataset.num_samples/seed/max_operand of the wrong kind: named by their check
        return []
    return []


def load_evaluation_dataset(cfg: DictConfig, request: dict[str, Any]):
    """The problems the evaluation after training answers (``evaluation.dataset.*`` named in errors)."""
    from atlas_core.training import data

    return data.load_evaluation_dataset(
        request["source"],
        request["split"],
        request["limit"],
        default_problems=int(cfg.dataset.num_samples),
        seed=int(cfg.dataset.seed),
        max_operand=int(cfg.dataset.max_operand),
    )


def evaluation_request(cfg: DictConfig) -> dict[str, Any] | None:
    """source, split, samples, limit of the evaluation, with the defaults applied; None = no evaluation."""
    section = cfg.get("evaluation")
    if section is None:
        return None
    dataset = section.get("dataset") or {}
    return {
        "source": str(dataset.get("source") or cfg.dataset.source),
        "split": str(dataset.get("split") or EVALUATION["split"]),
        "samples": int(section.get("samples") or EVALUATION["samples"]),
        "limit": None if section.get("limit") is None else int(section.limit),
    }


def evaluation_settings(args: Any, samples: int, limit: int | None = None):
    """Evaluation settings that run the protocol exactly as a teacher run's configuration ``args`` trained it
    (probe and answer budgets, student temperature, reward constants; the teacher's whole completion
    bounded by ``max_completion_length``), the teacher decoding greedily."""
    from atlas_core.evaluation import EvaluationSettings

    return EvaluationSettings(
        samples=samples,
        limit=limit,
        seed=int(args.seed),
        max_probe_tokens=args.max_probe_tokens,
        max_guidance_tokens=args.max_guidance_tokens,
        teacher_max_tokens=args.max_completion_length,
        student_max_tokens=args.student_max_tokens,
        student_temperature=args.student_temperature,
        efficiency_horizon=args.efficiency_horizon,
        degradation_penalty=args.degradation_penalty,
    )


def evaluate_trained_teacher(cfg: DictConfig, args: Any):
    """The two-pass evaluation of the teacher saved in ``output_dir`` against the run's student, with the
    run's protocol settings; files in ``<output_dir>/evaluation`` (an interrupted one resumes)."""
    from atlas_core.evaluation import evaluate_teaching
    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.tasks.arithmetic import REWARD_FUNCTIONS
    from atlas_core.training.student import load_student

    request = evaluation_request(cfg)
    dataset = load_evaluation_dataset(cfg, request)
    scorers = [REWARD_FUNCTIONS[name] for name in cfg.reward.funcs or []]
    if cfg.reward.get("config"):
        from atlas_core.reward.interpretation import RIMReward

        scorers.append(RIMReward(str(cfg.reward.config)))
    weights = None if cfg.reward.weights is None else [float(w) for w in cfg.reward.weights]
    settings = evaluation_settings(args, request["samples"], request["limit"])
    import torch

    device = "cuda" if torch.cuda.is_available() else None  # rank 0's GPU is free once training is over
    teacher = load_student(str(cfg.output_dir), device=device, role="teacher")
    student = load_student(resolve_model_path(str(cfg.student)), device=device)
    return evaluate_teaching(
        teacher,
        student,
        dataset,
        settings,
        output_dir=Path(cfg.output_dir) / EVAL_DIR,
        scorers=scorers,
        weights=weights,
        names={
            "teacher": str(cfg.output_dir),
            "student": str(cfg.student),
            "dataset": request["source"],
            "split": request["split"],
            "scorer": ", ".join(
                [*(cfg.reward.funcs or []), *([str(cfg.reward.config)] if cfg.reward.get("config") else [])]
            )
            or "exact_match",
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
