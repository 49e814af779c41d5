"""After training, on rank 0: evaluate a trained teacher (run configuration ``evaluation``), export the trained model
(run configuration ``output``: atlas_core/sources/export.py) and report the run's result where Kubernetes carries it
to ``.status.result`` (``$ATLAS_RESULT_FILE``, the trainer container's termination message;
``atlas_contract.results``)."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas_contract.names import ENV_RESULT_FILE, EVAL_DIR
from atlas_contract.results import result_message
from atlas_contract.run_config import EvaluationSettings, OutputSettings, RunConfig
from atlas_contract.teaching import TeachingSettings

if TYPE_CHECKING:
    from atlas_core.evaluation import EvaluationRunSettings

logger = logging.getLogger(__name__)


def evaluation_dataset_problems(run: RunConfig) -> list[str]:
    """The evaluation's dataset, checked at start-up as it will load after training (atlas_contract.datasets's
    rules, then the data itself: a file's splits, a builtin's problem count). A hub dataset is checked when
    it loads (it needs the network). The section's own fields are the contract's to check (RunConfig.from_dict)."""
    from atlas_contract import datasets
    from atlas_core.sources import remote_problems
    from atlas_core.training.data import DatasetSourceError

    if run.evaluation is None or not run.dataset.source:
        return []
    source, split = run.evaluation.source(run.dataset.source), run.evaluation.dataset.split  # evaluation_source()
    training = run.dataset.source
    if source == training:
        wrong = remote_problems(training, "dataset.source")
        if wrong is None:
            # str(): an unset split is named 'None', as load_config's own check of it does
            wrong = datasets.dataset_problems(training, str(run.dataset.split), run.algorithm)
        if wrong:
            return []  # the run's own source is wrong: its dataset.source check names it once
    problems = remote_problems(source, "evaluation.dataset.source", "the dataset")
    if problems is None:
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


def _evaluation_of(run: RunConfig) -> EvaluationSettings:
    """The run's evaluation: only a run with one is evaluated (cli/train.py and evaluation_dataset_problems check)."""
    assert run.evaluation is not None
    return run.evaluation


def _teaching_of(run: RunConfig) -> TeachingSettings:
    """The run's teaching settings: a run with an evaluation is a teacher run (RunConfig.from_dict), which has them."""
    assert run.teaching is not None
    return run.teaching


def _output_of(run: RunConfig) -> OutputSettings:
    """Where the run's model goes: only a run with an output exports (cli/train.py and cli/export.py check)."""
    assert run.output is not None
    return run.output


def _whole_number(value: int | None) -> int:
    """int(value): an unset one raises int()'s TypeError, which evaluation_dataset_problems leaves to its check."""
    return int(value)  # type: ignore[arg-type]  # None raises TypeError, deliberately (see the docstring)


def load_evaluation_dataset(run: RunConfig):
    """The problems the evaluation after training answers (``evaluation.dataset.*`` named in errors)."""
    from atlas_core.training import data

    evaluation = _evaluation_of(run)
    return data.load_evaluation_dataset(
        evaluation.source(run.dataset.source),  # run.evaluation_source()
        evaluation.dataset.split,
        evaluation.limit,
        default_problems=_whole_number(run.dataset.num_samples),
        seed=_whole_number(run.dataset.seed),
        max_operand=_whole_number(run.dataset.max_operand),
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


def _student_of(run: RunConfig) -> str:
    """The run's student: a teacher run names one (RunConfig.from_dict requires it)."""
    assert run.student is not None
    return run.student


def _evaluation_names(run: RunConfig) -> dict[str, str]:
    reward, evaluation = run.reward, _evaluation_of(run)
    return {
        "teacher": run.output_dir,
        "student": _student_of(run),
        "dataset": evaluation.source(run.dataset.source),  # run.evaluation_source()
        "split": evaluation.dataset.split,
        "scorer": ", ".join([*reward.funcs, *([reward.config] if reward.config else [])]) or "exact_match",
    }


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
    evaluation = _evaluation_of(run)
    settings = evaluation_settings(_teaching_of(run), args, evaluation.samples, evaluation.limit)
    import torch

    device = "cuda" if torch.cuda.is_available() else None  # rank 0's GPU is free once training is over
    teacher = load_student(run.output_dir, device=device, role="teacher")
    student = load_student(resolve_model_path(_student_of(run), field="student"), device=device)
    return evaluate_teaching(
        teacher,
        student,
        dataset,
        settings,
        output_dir=Path(run.output_dir) / EVAL_DIR,
        scorers=scorers,
        weights=weights,
        names=_evaluation_names(run),
    )


def finished_evaluation(run: RunConfig, args: Any) -> dict[str, Any] | None:
    """The report of an evaluation after training that is already whole in ``<output_dir>/evaluation`` (every
    problem in ``problems.jsonl`` under this run's settings, and its ``eval.json``), without loading a model: a
    re-run of a finished run (its export retried) reports it again. None when there is none, or it is not whole."""
    import json

    from atlas_contract.names import EVAL_PROBLEMS_FILE, EVAL_REPORT_FILE
    from atlas_core.evaluation import fingerprint, resumable_records

    folder = Path(run.output_dir) / EVAL_DIR
    if not (folder / EVAL_REPORT_FILE).is_file() or not (folder / EVAL_PROBLEMS_FILE).is_file():
        return None
    evaluation = _evaluation_of(run)
    settings = evaluation_settings(_teaching_of(run), args, evaluation.samples, evaluation.limit)
    rows = list(load_evaluation_dataset(run))
    rows = rows[: settings.limit] if settings.limit else rows
    try:
        records = resumable_records(folder / EVAL_PROBLEMS_FILE, rows, fingerprint(settings, _evaluation_names(run)))
        report = json.loads((folder / EVAL_REPORT_FILE).read_text(encoding="utf-8"))
    except ValueError:
        return None
    if not rows or len(records) != len(rows) or not isinstance(report, dict) or report.get("problems") != len(rows):
        return None
    return report


def evaluate_after_training(run: RunConfig, args: Any) -> dict[str, Any]:
    """The evaluation's report (``eval.json``'s fields): the whole one already on disk (a re-run), else the
    evaluation run now (resuming from its files)."""
    report = finished_evaluation(run, args)
    if report is not None:
        logger.info("evaluation: already whole in %s; reported again", Path(run.output_dir) / EVAL_DIR)
        return report
    return evaluate_trained_teacher(run, args).to_dict()


def last_kl(log_history: list[dict[str, Any]]) -> float | None:
    """The last logged KL of the policy to its reference (GRPO, teacher); None when none was logged."""
    for record in reversed(log_history):
        value = record.get("kl")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def export_trained_model(
    run: RunConfig, step: int, reward: float | None, kl: float | None, evaluation: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, str] | None]:
    """(output, export_error): ``output_dir``'s final model exported to ``run.output.uri`` with its model card
    (``{uri, files, bytes}``), or why it was not (``{reason, message}``: the model stays in ``output_dir``)."""
    from atlas_core.sources.errors import SourceError
    from atlas_core.sources.export import export_model, model_card

    uri = _output_of(run).uri
    try:
        card = model_card(run, step, reward, kl, evaluation)
        with _merged_model(run) as folder:
            return export_model(folder, uri, card), None
    except SourceError as exc:
        return None, {"reason": exc.reason, "message": exc.message}
    except Exception as exc:  # noqa: BLE001 - the model is trained and saved: reported, retried by a re-run
        from atlas_core.sources.errors import redact

        reason = redact(" ".join(str(exc).split())) or type(exc).__name__
        return None, {"reason": "ExportFailed", "message": f"{uri}: {reason}"}


@contextmanager
def _merged_model(run: RunConfig) -> Iterator[str]:
    """The folder exported: ``output_dir``; with ``output.merge`` and a LoRA adapter there, a temporary folder beside
    it holding the adapter merged into its base model (whole weights, loadable by any ``from_pretrained`` and by
    vLLM) and the adapter itself in ``EXPORT_ADAPTER_DIR``."""
    from atlas_core.models.loading import is_adapter, load_causal_lm, load_tokenizer

    folder = Path(run.output_dir)
    if not (_output_of(run).merge and is_adapter(folder)):
        yield str(folder)
        return
    import shutil
    import tempfile

    from atlas_contract.sources import EXPORT_ADAPTER_DIR
    from atlas_core.sources.export import model_files

    staging = Path(tempfile.mkdtemp(prefix=".atlas-merged-", dir=folder))
    try:
        load_causal_lm(str(folder)).save_pretrained(staging)
        load_tokenizer(str(folder)).save_pretrained(staging)
        (staging / EXPORT_ADAPTER_DIR).mkdir()
        for name in model_files(folder):
            shutil.copyfile(folder / name, staging / EXPORT_ADAPTER_DIR / name)
        yield str(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def note_pending_export(run: RunConfig, inputs: dict[str, Any], pending: bool) -> None:
    """Keep what a failed export needs in ``<output_dir>/EXPORT_PENDING_FILE`` (written whole: temp + rename), or
    remove it once the export is done: a restarted trainer pod retries the export alone from it
    (``python -m atlas_core.cli.export``)."""
    import json

    from atlas_contract.sources import EXPORT_PENDING_FILE

    path = Path(run.output_dir) / EXPORT_PENDING_FILE
    if not pending:
        path.unlink(missing_ok=True)
        return
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(inputs, sort_keys=True), encoding="utf-8")
    os.replace(staging, path)


def last_reward(log_history: list[dict[str, Any]]) -> float | None:
    """The last logged reward of the run (GRPO: the reward; teacher: the teaching reward); None for SFT."""
    for record in reversed(log_history):
        value = record.get("reward")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def finish_tracking(
    run: RunConfig,
    result: Any,
    reward: float | None,
    kl: float | None,
    evaluation: dict[str, Any] | None,
    output: dict[str, Any] | None,
) -> dict[str, str] | None:
    """Rank 0 after the evaluation and the export: the tracking run gets the evaluation table, the artifacts
    (metrics.jsonl, the curves, the model card, eval.json) and the exported model's URI, and is ended. Its
    ``{runId, url}`` for the result; None without MLflow, or when its server never answered (training is done
    either way: a tracking failure is a warning). W&B's run gets the evaluation in its summary."""
    import tempfile

    from atlas_contract.names import EVAL_REPORT_FILE, METRICS_LOG_FILE
    from atlas_core.sources.export import model_card
    from atlas_core.telemetry.curves import plot_curves
    from atlas_core.training.tracking import MLflowLogger, log_wandb_summary, metric_labels, mlflow_requested

    log_wandb_summary(evaluation)
    logger_ = result.tracking
    if logger_ is None:
        if not mlflow_requested(result.args):
            return None
        logger_ = MLflowLogger.for_run(run, metric_labels(result.args, run.run_name))  # a re-run that trained nothing
    folder = Path(run.output_dir)
    with tempfile.TemporaryDirectory(prefix="atlas-tracking-") as staging:
        card = Path(staging) / "README.md"
        card.write_text(model_card(run, result.global_step, reward, kl, evaluation), encoding="utf-8")
        artifacts = [folder / METRICS_LOG_FILE, card, folder / EVAL_DIR / EVAL_REPORT_FILE]
        curves = plot_curves(folder / METRICS_LOG_FILE, Path(staging) / "curves.png")
        artifacts += [curves] if curves else []
        return logger_.finish(evaluation, artifacts, result.global_step, (output or {}).get("uri"))


def write_result(
    step: int,
    reward: float | None,
    evaluation: dict[str, Any] | None,
    evaluation_error: str | None = None,
    output: dict[str, Any] | None = None,
    export_error: dict[str, str] | None = None,
    kl: float | None = None,
    tracking: dict[str, str] | None = None,
) -> Path | None:
    """Write the result to ``$ATLAS_RESULT_FILE`` when set (a pod's termination message); the path written."""
    target = os.environ.get(ENV_RESULT_FILE)
    if not target:
        return None
    path = Path(target)
    try:
        message = result_message(step, reward, evaluation, evaluation_error, output, export_error, kl, tracking)
        path.write_text(message)
    except OSError as exc:  # the result is a report, not the run: never fail a finished run over it
        logger.warning("could not write the run's result to %s: %s", path, exc)
        return None
    return path
