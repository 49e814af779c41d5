"""Defaults an operator run gets for the trainer and teaching fields its spec leaves unset.

The operator writes these into every run's ``run.yaml`` (so a run does what its CRD says, whatever
TRL's or the recipes' defaults are), the CRD descriptions that ``kubectl explain`` shows are generated
from them, and ``atlas_core``'s teaching fields take their defaults from ``TEACHING``. A test builds the
real GRPOConfig / SFTConfig from a rendered run and checks each value, for every field of both kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    # The step watchdog, on for every run rendered from a manifest (see FIRST_STEP_MIN_S below); a recipe or the
    # Python API leaves it off unless set.
    "step_timeout_seconds": 1800.0,
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

# The step watchdog (atlas_core.training.watchdog): seconds without a completed optimizer step before a trainer
# process prints its stacks and exits with names.WATCHDOG_EXIT_CODE, for its job to restart it (0 = off). The
# first step gets a longer allowance: loading the model, compiling, the first generation. Cluster runs get
# TRAINING_COMMON's step_timeout_seconds.
FIRST_STEP_MIN_S = 3600.0
# How long generation waits for an unreachable rollout server (vllm_mode server) before the same exit.
SERVER_TIMEOUT_S = 300.0
# spec.terminationGracePeriodSeconds of the trainer pods: how long Kubernetes waits after SIGTERM before SIGKILL.
# The trainer finishes the step in flight, then saves the model and optimizer state: 10 minutes covers a step of
# a few minutes and a save of a multi-node ZeRO state to a network volume (docs/runbook.md, "Preemption", says
# how to choose).
TERMINATION_GRACE_S = 600


# The vLLM servers' resources (spec.rollout and spec.student.rollout: cpu, memory, cacheSize) when a run leaves them
# unset: every server requests CPU, memory and ephemeral storage, so none is BestEffort (the first pod the kubelet
# evicts under memory pressure, placed wherever it fits nothing). The operator never reads a model (it opens no PVC
# and no bucket), so these are constants, not the model's size: sized per GPU of the server for the 7-8B models of
# the examples, where a larger model sets its own (docs/kubernetes.md, "The servers' resources").
SERVER_CPU_PER_GPU = 4  # requested, no limit: vLLM's API server, its engine core and one worker per GPU, each busy
SERVER_MEMORY_GI_PER_GPU = 32  # GiB requested and the limit: a worker's CUDA and torch state, the weights' page cache
# The server's cache volume (an emptyDir at /var/cache/atlas: HOME, the hub cache, vLLM's compile caches) is bounded
# (its sizeLimit) and requested as ephemeral storage: SERVER_MODEL_CACHE_GI where the server fetches its model into
# it (an S3 or hub model and no spec.checkpoint.pvc: 64 GiB holds a 30B model in bf16), else SERVER_CACHE_GI.
SERVER_MODEL_CACHE_GI = 64
SERVER_CACHE_GI = 8
SERVER_TMP_MI = 1024  # the servers' /tmp (an emptyDir: their root filesystem is read-only), its sizeLimit
SERVER_LOGS_MI = 1024  # a server's own logs (the kubelet rotates at 50 MiB by default), beyond the cache and /tmp
# The server's initializer (the init container that fetches an S3 or hub model first): requests and limits.
INITIALIZER_CPU = "1"  # requested, no limit
INITIALIZER_MEMORY = "2Gi"  # requested and the limit: a download streams to the volume
INITIALIZER_EPHEMERAL_STORAGE = "2Gi"  # requested and the limit: its /tmp and its logs (it writes to the volumes)


def first_step_timeout(step_timeout_s: float) -> float:
    """The first step's allowance for a step timeout: four times it, and at least an hour."""
    return max(4 * float(step_timeout_s), FIRST_STEP_MIN_S)


# The evaluation after training (AtlasTeacher spec.evaluation; run.yaml's `evaluation`): the two-pass
# protocol on held-out problems. Unset dataset.source = the run's own spec.dataset.source; unset limit =
# every problem of the split.
EVALUATION: dict[str, Any] = {
    "split": "test",
    "samples": 4,  # student answers per problem, alone and guided
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
        return f"Default: {_as_documented(grpo)}. GRPO only (AtlasTeacher, AtlasTraining grpo)."
    if grpo == sft:
        return f"Default: {_as_documented(grpo)}."
    return f"Default: {_as_documented(grpo)} (grpo, AtlasTeacher), {_as_documented(sft)} (sft)."


def _as_documented(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


# ------------------------------------------------------------------ limits


@dataclass(frozen=True)
class Limit:
    """The range a numeric setting must lie in: the CRD's minimum/maximum and the trainer's check."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False

    def problem(self, value: float) -> str | None:
        """``expected …`` when ``value`` is outside (None when inside)."""
        if self.minimum is not None:
            if self.exclusive_minimum and not value > self.minimum:
                return f"expected a number > {_as_documented(self.minimum)}"
            if not self.exclusive_minimum and not value >= self.minimum:
                return f"expected a number >= {_as_documented(self.minimum)}"
        if self.maximum is not None:
            if self.exclusive_maximum and not value < self.maximum:
                return f"expected a number < {_as_documented(self.maximum)}"
            if not self.exclusive_maximum and not value <= self.maximum:
                return f"expected a number <= {_as_documented(self.maximum)}"
        return None

    def schema(self) -> dict[str, Any]:
        """The keyword arguments of the operator's ``spec_field`` for this limit."""
        bounds = {"minimum": self.minimum, "maximum": self.maximum, "exclusive_minimum": self.exclusive_minimum}
        return {**bounds, "exclusive_maximum": True} if self.exclusive_maximum else bounds


POSITIVE, AT_LEAST_ONE, NON_NEGATIVE = Limit(0, exclusive_minimum=True), Limit(1), Limit(0)
# Student answers per problem (K) and problems per evaluation at most: far above any real evaluation (ATLAS
# uses K <= 16 and a few thousand problems), far below what overflows a count.
MAX_EVALUATION_SAMPLES, MAX_EVALUATION_PROBLEMS = 1024, 10_000_000
# Trainer and teaching settings (snake_case): the one statement of each range, for the spec and run.yaml.
LIMITS: dict[str, Limit] = {
    "learning_rate": POSITIVE,
    "num_train_epochs": POSITIVE,
    "max_steps": AT_LEAST_ONE,
    "per_device_train_batch_size": AT_LEAST_ONE,
    "gradient_accumulation_steps": AT_LEAST_ONE,
    "beta": NON_NEGATIVE,
    "num_generations": Limit(2),  # GRPO compares completions
    "max_completion_length": AT_LEAST_ONE,
    "temperature": POSITIVE,
    "top_p": Limit(0, 1, exclusive_minimum=True),
    "num_iterations": AT_LEAST_ONE,
    "epsilon": NON_NEGATIVE,
    "warmup_steps": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "logging_steps": AT_LEAST_ONE,
    "save_steps": AT_LEAST_ONE,
    "step_timeout_seconds": NON_NEGATIVE,
    "first_step_timeout_seconds": NON_NEGATIVE,
    "server_timeout_seconds": POSITIVE,
    "steps_per_generation": AT_LEAST_ONE,
    "generation_batch_size": AT_LEAST_ONE,
    "max_probe_tokens": AT_LEAST_ONE,
    "max_guidance_tokens": Limit(10),
    "efficiency_horizon": POSITIVE,
    "degradation_penalty": NON_NEGATIVE,
    "student_samples": AT_LEAST_ONE,
    "student_max_tokens": AT_LEAST_ONE,
    "student_temperature": NON_NEGATIVE,
    # The evaluation (run.yaml `evaluation.samples` / `evaluation.limit`, spec.evaluation, atlas eval -k / --limit):
    # bounded so that a typo is refused up front instead of overflowing after training.
    "evaluation_samples": Limit(1, MAX_EVALUATION_SAMPLES),
    "evaluation_limit": Limit(1, MAX_EVALUATION_PROBLEMS),
    "evaluation_batch_size": AT_LEAST_ONE,  # problems generated together (atlas eval --batch-size)
    "teacher_temperature": NON_NEGATIVE,  # the evaluated teacher's sampling (0: greedy, the default)
    # LoRA (spec.training.lora, run.yaml trainer.lora; atlas_contract/lora.py)
    "lora_r": AT_LEAST_ONE,
    "lora_alpha": POSITIVE,
    "lora_dropout": Limit(0, 1, exclusive_maximum=True),
}
# LoRA's settings when a run names lora without them: TRL's ModelConfig defaults (lora_r 16, lora_alpha 32,
# lora_dropout 0.05), every linear layer but the output head as PEFT's "all-linear" picks them.
LORA: dict[str, Any] = {"r": 16, "alpha": 32.0, "dropout": 0.05, "target_modules": "all-linear"}
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo")
REWARD_SCALINGS = ("group", "batch", "none")
