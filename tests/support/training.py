"""A GRPO configuration for a few CPU steps on the tiny model."""

from __future__ import annotations

from pathlib import Path


def tiny_grpo_args(tmp_path: Path, model_dir: Path | None, **overrides):
    """A GRPOConfig for a few CPU steps on the tiny model (tests override what they exercise)."""
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    values = dict(
        output_dir=str(tmp_path / "out"),
        model_name_or_path=None if model_dir is None else str(model_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=3,
        learning_rate=1e-3,
        beta=0.04,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)
