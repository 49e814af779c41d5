"""Defaults an operator run gets for the trainer and teaching fields its spec leaves unset.

The operator writes these into every run's ``run.yaml`` (so a run does what its CRD says, whatever
TRL's or the recipes' defaults are), the CRD descriptions that ``kubectl explain`` shows are generated
from them, and ``atlas_core``'s teaching fields take their defaults from ``TEACHING``. A test builds the
real GRPOConfig / SFTConfig from a rendered run and checks each value, for every field of both kinds.
"""

from __future__ import annotations

from typing import Any

# spec.training fields (snake_case) → default, for every algorithm.
TRAINING_COMMON: dict[str, Any] = {
    "num_train_epochs": 3.0,
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "lr_scheduler_type": "linear",
    "warmup_steps": 0.0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "logging_steps": 1,  # every step: the operator mirrors each step into .status.progress
    "seed": 0,
    "gradient_checkpointing": True,
}
# GRPO (AtlasTraining grpo and AtlasTeacher): TRL 1.16's GRPOConfig values.
TRAINING_GRPO: dict[str, Any] = {
    "learning_rate": 1e-6,
    "beta": 0.0,
    "num_generations": 8,
    "max_completion_length": 512,
    "temperature": 1.0,
    "top_p": 1.0,
    "num_iterations": 1,
    "epsilon": 0.2,
    "loss_type": "dapo",
    "scale_rewards": "group",
}
# SFT (AtlasTraining algorithm sft): TRL's SFTConfig learning rate.
TRAINING_SFT: dict[str, Any] = {"learning_rate": 2e-5}
# Fields that only GRPO has: setting one for an SFT run is an error, not silently ignored.
GRPO_ONLY = tuple(sorted(set(TRAINING_GRPO) - set(TRAINING_SFT)))

# The teaching protocol (AtlasTeacher spec.teaching; atlas_core's TeachingArguments).
TEACHING: dict[str, Any] = {
    "max_probe_tokens": 50,
    "max_guidance_tokens": 200,
    "efficiency_horizon": 200.0,
    "degradation_penalty": 2.0,
    "student_samples": 2,
    "student_max_tokens": 256,
    "student_temperature": 0.7,
}


def training_defaults(algorithm: str) -> dict[str, Any]:
    """The spec.training defaults of an algorithm (grpo, teacher or sft)."""
    if algorithm == "sft":
        return {**TRAINING_COMMON, **TRAINING_SFT}
    return {**TRAINING_COMMON, **TRAINING_GRPO}


def describe_training_default(field: str) -> str:
    """How a CRD description states a training field's default (per algorithm where they differ)."""
    grpo, sft = training_defaults("grpo").get(field), training_defaults("sft").get(field)
    if field in GRPO_ONLY:
        return f"Default: {_shown(grpo)}. GRPO only (AtlasTeacher, AtlasTraining grpo)."
    if grpo == sft:
        return f"Default: {_shown(grpo)}."
    return f"Default: {_shown(grpo)} (grpo, AtlasTeacher), {_shown(sft)} (sft)."


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)
