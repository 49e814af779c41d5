"""Run one training job from a validated run configuration.

The same function serves ``python -m atlas_core.cli.train`` (what trainer pods run),
``atlas train`` and each stage of ``atlas demo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atlas_contract.names import METRICS_LOG_FILE
from atlas_contract.run_config import RunConfig
from atlas_contract.stops import StopReport
from atlas_core.training.callbacks import RunIdentityCallback
from atlas_core.training.load_config import InvalidFields, trainer_config_class
from atlas_core.training.lora import ResumedAdapterCheck, name_adapter_base
from atlas_core.training.preemption import stop_of
from atlas_core.training.resume import (
    IDENTITY_TRAINER_FIELDS,
    WEIGHT_FILES,
    agree_on_checkpoint,
    resume_policy,
    run_identity,
)

if TYPE_CHECKING:
    from atlas_core.training.algorithms.grpo import RewardFunc

METRICS_FILE = METRICS_LOG_FILE


@dataclass
class FinishedRun:
    """What a finished run left behind."""

    output_dir: Path
    global_step: int
    resumed_from: str | None
    process_index: int = 0
    num_processes: int = 1
    already_finished: bool = False  # the run had reached its last step before: nothing was trained
    stopped: StopReport | None = None  # stopped on SIGTERM, with a checkpoint at this step (no final model yet)
    local_process_index: int = 0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    args: Any = None  # the trainer's configuration (GRPOConfig / SFTConfig) the run used
    tracking: Any = None  # rank 0's MLflow logger (atlas_core/training/tracking.py), when MLflow is on


def build_trainer(run: RunConfig, callbacks: list | None = None):
    """The trainer ``run`` describes, ready to ``train()``; raises InvalidFields on bad input."""
    from atlas_core.answers import REWARD_FUNCTIONS
    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.training.callbacks import JsonlMetricsCallback
    from atlas_core.training.lora import merge_problem

    algorithm, reward = run.algorithm, run.reward
    dataset = _training_dataset(run)
    model = resolve_model_path(run.model)
    args = _trainer_args(run, model)
    if args.lora is not None and run.output is not None and run.output.merge:
        problem = merge_problem(model)
        if problem:
            raise InvalidFields([problem])
    callbacks = [JsonlMetricsCallback(Path(run.output_dir) / METRICS_FILE), *(callbacks or [])]
    try:
        if algorithm in ("grpo", "teacher"):
            funcs: list[RewardFunc] = [REWARD_FUNCTIONS[name] for name in reward.funcs]
            if reward.config:
                from atlas_core.reward.interpretation import RIMReward

                funcs.append(RIMReward(reward.config))
        if algorithm == "grpo":
            from atlas_core.training.algorithms.grpo import GRPOTrainer

            return GRPOTrainer(model=model, reward_funcs=funcs, args=args, train_dataset=dataset, callbacks=callbacks)
        if algorithm == "teacher":
            from atlas_core.training.algorithms.teacher_trainers import TeacherGRPOTrainer

            assert run.student is not None  # the contract requires a student of algorithm teacher

            return TeacherGRPOTrainer(
                model=model,
                reward_funcs=funcs or None,
                args=args,
                train_dataset=dataset,
                callbacks=callbacks,
                student_model=resolve_model_path(run.student),
            )
        from atlas_core.training.algorithms.sft import SFTTrainer

        return SFTTrainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)
    except OSError as exc:  # from_pretrained: missing files, no network for a hub id, unreadable weights
        reason = " ".join(str(exc).split())[:300]
        raise InvalidFields([f"model: cannot load '{run.model}': {reason}"]) from None
    except (ValueError, TypeError) as exc:  # the trainers name the argument at fault
        raise InvalidFields([" ".join(str(exc).split())]) from None


def _training_dataset(run: RunConfig):
    """The training problems; with exact-match scoring, each needs a ``ground_truth``."""
    from atlas_core.training.data import DatasetSourceError, load_run_dataset

    data, algorithm = run.dataset, run.algorithm
    # train.yaml gives each of these (RunConfig's None is "unset", before the composition)
    assert data.split is not None and data.num_samples is not None
    assert data.max_operand is not None and data.seed is not None
    try:
        dataset = load_run_dataset(
            data.source,
            split=data.split,
            algorithm=algorithm,
            num_samples=int(data.num_samples),
            max_operand=int(data.max_operand),
            seed=int(data.seed),
            guided_fraction=float(data.guided_fraction or 0.0),
        )
    except DatasetSourceError as exc:
        raise InvalidFields(str(exc).splitlines()) from None
    # exact_match scores against ground_truth: the policy's answers (grpo) or the student's (teacher, by
    # default when no reward is named).
    funcs = run.reward.funcs
    needs_truth = "exact_match" in funcs and algorithm in ("grpo", "teacher")
    needs_truth |= algorithm == "teacher" and not funcs and not run.reward.config
    if needs_truth and "ground_truth" not in dataset.column_names:
        raise InvalidFields(
            [
                f"dataset.source: '{data.source}' has no 'ground_truth' column, which exact-match scoring "
                f"needs (columns: {', '.join(dataset.column_names)})"
            ]
        )
    return dataset


def _trainer_args(run: RunConfig, model: str):
    """The GRPOConfig / SFTConfig of the run: its trainer fields (a teacher's teaching settings among them)."""
    kwargs = dict(run.trainer)
    kwargs.setdefault("run_name", run.run_name)
    if run.algorithm in ("grpo", "teacher") and run.reward.weights is not None:
        kwargs["reward_weights"] = [float(w) for w in run.reward.weights]
    try:
        return trainer_config_class(run.algorithm)(output_dir=run.output_dir, model_name_or_path=model, **kwargs)
    except (ValueError, TypeError) as exc:
        raise InvalidFields([f"trainer: {' '.join(str(exc).split())}"]) from None


def run_training(run: RunConfig, callbacks: list | None = None, quiet: bool = False) -> FinishedRun:
    """Train per ``run``, resuming as ``run.resume`` says (the newest checkpoint every rank can load); saves the
    final model (and tokenizer) into ``output_dir``. ``quiet`` drops the trainer's own console output
    (its progress bar and printed logs) for callers that show progress themselves."""
    from atlas_core.training.tracking import install_tracking

    trainer = build_trainer(run, callbacks)
    mlflow = install_tracking(trainer, run)
    if quiet:
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    # One decision for every rank, made together before any step (atlas_core.training.resume).
    identity = run_identity(run.run_name, training_settings(run, trainer.args))
    agreement = agree_on_checkpoint(
        run.output_dir, resume_policy(run.resume), deepspeed=trainer.is_deepspeed_enabled, identity=identity
    )
    stopped = None
    try:
        finished_at = finished_step(agreement.checkpoint, trainer.args.max_steps)
        if finished_at is not None and trainer.accelerator.is_main_process:
            assert agreement.checkpoint is not None  # finished_step found the run's end in it
            publish_final_model(agreement.checkpoint, run.output_dir)  # a stop on SIGTERM at the last step
            name_adapter_base(run.output_dir, run.model)
        if finished_at is None:
            trainer.add_callback(RunIdentityCallback(identity))
            if agreement.checkpoint and getattr(trainer.args, "lora", None):
                trainer.add_callback(ResumedAdapterCheck(agreement.checkpoint))
            trainer.train(resume_from_checkpoint=agreement.checkpoint)
            stopped = stop_of(trainer)
            if stopped is None:  # a stop leaves its checkpoint; the final model is saved when training ends
                trainer.save_model(run.output_dir)
                if trainer.accelerator.is_local_main_process:  # an adapter names the run's model, not our copy
                    name_adapter_base(run.output_dir, run.model)
    finally:
        agreement.release()
    if finished_at is None:
        log_history = list(trainer.state.log_history)
    else:
        assert agreement.checkpoint is not None  # finished_step found the run's end in it
        log_history = _logged(agreement.checkpoint)
    return FinishedRun(
        output_dir=Path(run.output_dir),
        global_step=trainer.state.global_step if finished_at is None else finished_at,
        resumed_from=agreement.checkpoint,
        process_index=trainer.accelerator.process_index,
        num_processes=trainer.accelerator.num_processes,
        log_history=log_history,
        already_finished=finished_at is not None,
        stopped=stopped,
        local_process_index=trainer.accelerator.local_process_index,
        args=trainer.args,
        tracking=mlflow.logger if mlflow is not None else None,
    )


def training_settings(run: RunConfig, args) -> dict[str, Any]:
    """What a checkpoint must share with this run to be resumed (see resume.IDENTITY_TRAINER_FIELDS)."""
    reward = run.reward
    settings = {
        "algorithm": run.algorithm,
        "model": run.model,
        "student": run.student,
        "dataset.source": run.dataset.source,
        "dataset.split": run.dataset.split,
        "reward.funcs": list(reward.funcs),
        "reward.config": reward.config,
        "reward.weights": None if reward.weights is None else list(reward.weights),
    }
    for name in IDENTITY_TRAINER_FIELDS:
        if hasattr(args, name):
            settings[f"trainer.{name}"] = getattr(args, name)
    return settings


# What save_model writes (weights, config, tokenizer) is in every checkpoint too; these files are the checkpoint's.
_CHECKPOINT_ONLY = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin", "latest")


def publish_final_model(checkpoint: str, output_dir: str | Path) -> bool:
    """The final model of a run that stopped on SIGTERM just after its last step: that step's checkpoint was saved
    but no final model (atlas_core/training/preemption.py), so the re-run, which trains nothing, copies the model
    from the checkpoint into ``output_dir`` — weights last, each file renamed into place, so a copy cut short is
    done again. False when ``output_dir`` already has a model."""
    import shutil

    from atlas_contract.names import RUN_IDENTITY_FILE

    out = Path(output_dir)
    if any((out / name).exists() for name in WEIGHT_FILES):
        return False
    files = [
        f
        for f in Path(checkpoint).iterdir()
        if f.is_file()
        and f.name not in (*_CHECKPOINT_ONLY, RUN_IDENTITY_FILE)
        and not (f.name.startswith("rng_state") or f.name.startswith("zero_to_fp32"))
    ]
    for source in sorted(files, key=lambda f: (f.name.startswith(("model", "pytorch_model", "adapter_model")), f.name)):
        partial = out / f".{source.name}.partial"
        shutil.copyfile(source, partial)
        partial.replace(out / source.name)
    return True


def _logged(checkpoint: str) -> list[dict[str, Any]]:
    """The log history a finished run's last checkpoint kept (its result is reported again on a re-run)."""
    import json

    return list(json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("log_history") or [])


def finished_step(checkpoint: str | None, max_steps: int) -> int | None:
    """The checkpoint's step when it is already the end of the run (re-running a finished run trains
    nothing), else None. The end is ``max_steps`` when set, else what the checkpoint's run planned."""
    if checkpoint is None:
        return None
    import json

    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    step, planned = int(state["global_step"]), int(state.get("max_steps") or 0)
    end = max_steps if max_steps and max_steps > 0 else planned
    return step if end and step >= end else None
