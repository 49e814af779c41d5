"""GRPO configuration: TRL's ``GRPOConfig`` plus the fields Atlas adds.

Every TRL and ``transformers.TrainingArguments`` field keeps its meaning and default;
see TRL's documentation for those. :class:`AtlasArguments` are Atlas's own, shared with
``SFTConfig``.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field, fields, make_dataclass
from typing import TYPE_CHECKING

from trl import GRPOConfig as _TRLGRPOConfig

from atlas_contract import checks
from atlas_contract.defaults import SERVER_TIMEOUT_S, TEACHING
from atlas_contract.lora import LoraSettings
from atlas_contract.names import ENV_KIND, ENV_NAMESPACE, ENV_RUN, TRAINER_METRICS_PORT
from atlas_contract.teaching import TeachingSettings

if TYPE_CHECKING:
    # AtlasArguments is mixed into TRL's configs (TrainingArguments) and reads and sets their fields (bf16, use_cpu,
    # output_dir, ...): mypy sees it as one; at run time its base stays object, so the configs' MROs are TRL's + it.
    from transformers import TrainingArguments as _ConfigFields
else:
    _ConfigFields = object


@dataclass
class AtlasArguments(_ConfigFields):
    r"""Fields Atlas adds to TRL's configurations.

    Parameters:
        model_name_or_path (`str`, *optional*):
            Hugging Face id or local path of the policy. Used when the trainer is given no ``model``.
            ``builtin://tiny-llama`` builds the offline tiny model locally.
        metrics_port (`int`, *optional*, defaults to `0`):
            Port of the Prometheus ``/metrics`` endpoint that rank 0 serves while training
            (``atlas_training_*`` gauges). ``0`` turns it off. Recipes and trainer pods use
            ``atlas_contract.names.TRAINER_METRICS_PORT`` (9400).
        metrics_host (`str`, *optional*, defaults to `"0.0.0.0"`):
            Address the metrics endpoint binds to. ``atlas demo`` uses ``127.0.0.1``.
        metrics_namespace (`str`, *optional*):
            ``namespace`` label of the exported metrics. Defaults to ``$ATLAS_NAMESPACE``, else ``"local"``.
        metrics_run (`str`, *optional*):
            ``run`` label. Defaults to ``$ATLAS_RUN``, else ``run_name``, else the name of ``output_dir``.
        metrics_kind (`str`, *optional*):
            ``kind`` label (``AtlasTraining`` / ``AtlasTeacher`` in the cluster). Defaults to ``$ATLAS_KIND``,
            else ``"local"``.
        attn_implementation (`str`, *optional*):
            Attention kernel for a model loaded from a name or path (``"sdpa"``, ``"eager"``,
            ``"flash_attention_2"`` on GPUs with flash-attn); read when the trainer is built, so it may be set
            after the config is.
        step_timeout_seconds (`float`, *optional*, defaults to `0`):
            The step watchdog: when no optimizer step completes within this many seconds, the process prints
            every thread's stack and what it was waiting for, and exits with code 75 (``WATCHDOG_EXIT_CODE``) for
            its job to restart it. ``0`` turns it off (cluster runs get 1800, ``spec.training.stepTimeoutSeconds``).
        first_step_timeout_seconds (`float`, *optional*):
            The allowance of the first step (model loading, compilation, the first generation). Unset: four
            times ``step_timeout_seconds``, and at least 3600; ``0``: no limit on the first step.
        server_timeout_seconds (`float`, *optional*, defaults to `300`):
            With a rollout server (``vllm_mode="server"``) and the watchdog on: how long generation waits for the
            server's ``/health`` before the process exits as the watchdog does, naming the server's URL. With
            ``step_timeout_seconds`` 0 nothing is checked and generation waits as TRL does. Also, with the watchdog
            off, how long a teacher waits before training for its student endpoint to serve (then a
            ``RuntimeError``; with the watchdog on, that wait is the first step's allowance).
        lora (`dict`, *optional*):
            Train a LoRA adapter of the policy instead of every weight: ``{r, alpha, dropout, target_modules}``
            (``atlas_contract.lora``; unset keys at r 16, alpha 32, dropout 0.05, ``"all-linear"``), handed to TRL as
            its ``peft_config``. ``None`` (the default) trains every weight. TRL's own ``peft_config`` keyword of the
            trainer works too (not both).
    """

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Hugging Face id or local path of the policy; builtin://tiny-llama for the tiny model."},
    )
    metrics_port: int = field(
        default=0,
        metadata={
            "help": f"Port of rank 0's Prometheus /metrics endpoint; 0 turns it off (pods use {TRAINER_METRICS_PORT})."
        },
    )
    metrics_host: str = field(default="0.0.0.0", metadata={"help": "Address the metrics endpoint binds to."})
    metrics_namespace: str | None = field(
        default=None, metadata={"help": "namespace label of the metrics ($ATLAS_NAMESPACE, else 'local')."}
    )
    metrics_run: str | None = field(
        default=None, metadata={"help": "run label of the metrics ($ATLAS_RUN, else run_name or output_dir name)."}
    )
    metrics_kind: str | None = field(
        default=None, metadata={"help": "kind label of the metrics ($ATLAS_KIND, else 'local')."}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention kernel of a model loaded by name: sdpa, eager, flash_attention_2."}
    )
    step_timeout_seconds: float = field(
        default=0.0,
        metadata={"help": "Seconds without an optimizer step before the process exits with its stacks (0 = off)."},
    )
    first_step_timeout_seconds: float | None = field(
        default=None,
        metadata={"help": "The first step's allowance (unset: 4 x step_timeout_seconds, at least 3600; 0 = no limit)."},
    )
    server_timeout_seconds: float = field(
        default=SERVER_TIMEOUT_S,
        metadata={"help": "Seconds generation waits for an unreachable rollout server before the process exits."},
    )
    lora: dict | None = field(
        default=None,
        metadata={"help": "LoRA adapter {r, alpha, dropout, target_modules} instead of full fine-tuning (None)."},
    )

    def _default_to_hardware(self) -> None:
        """On a machine without a GPU/XPU: leave an unset ``bf16`` off and set ``use_cpu``.

        TRL turns bf16 on when unset, which transformers rejects without an accelerator. And
        under ``accelerate launch`` (DDP or DeepSpeed) only ``use_cpu`` makes Accelerate pick the
        gloo backend on a CPU-only torch; without it each process silently trains alone (DDP) or
        DeepSpeed's batch-size check fails. So a laptop run needs no hardware flags at all.
        An explicit ``bf16`` is kept.
        """
        import torch

        if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
            return
        if self.bf16 is None and not self.fp16:
            self.bf16 = False
        self.use_cpu = True

    # Fields transformers resolves once, in __post_init__, into others the Trainer reads instead.
    _RESOLVED = ("gradient_checkpointing", "activation_checkpointing", "bf16", "fp16")

    def _remember_resolved(self) -> None:
        self._resolved_at_init = {name: getattr(self, name, None) for name in self._RESOLVED}

    def resync_resolved_fields(self) -> None:
        """Apply settings changed after construction (as the trainers reference does: ``args.bf16 = True``)
        that transformers only resolves when the config is built: ``gradient_checkpointing`` into
        ``activation_checkpointing``, ``bf16``/``fp16`` into ``mixed_precision``. The trainers call this
        before building the Trainer."""
        before = getattr(self, "_resolved_at_init", None)
        if before is None:
            return
        changed = {name for name in self._RESOLVED if getattr(self, name, None) != before[name]}
        if "gradient_checkpointing" in changed and "activation_checkpointing" not in changed:
            self.activation_checkpointing = self.gradient_checkpointing
        elif "activation_checkpointing" in changed:
            self.gradient_checkpointing = self.activation_checkpointing
        if changed & {"bf16", "fp16"}:
            self.mixed_precision = (
                "fp16" if self.fp16 else "bf16" if self.bf16 else os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
            )
        self._remember_resolved()

    def _resolve_atlas_fields(self) -> None:
        for name in ("step_timeout_seconds", "first_step_timeout_seconds", "server_timeout_seconds"):
            value = getattr(self, name)
            if value is None and name == "first_step_timeout_seconds":
                continue
            problem = checks.setting_problem(name, value, (int, float))
            if problem:
                raise ValueError(f"{name}: {problem}")
        lora, problems = LoraSettings.parse(self.lora, "lora")
        if problems:
            raise ValueError("; ".join(problems))
        self.lora = None if lora is None else lora.to_dict()
        port = self.metrics_port
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"metrics_port: expected 0 (off) or a TCP port up to 65535, got {port!r}")
        self.metrics_namespace = self.metrics_namespace or os.environ.get(ENV_NAMESPACE) or "local"
        self.metrics_run = (
            self.metrics_run
            or os.environ.get(ENV_RUN)
            or self.run_name
            or os.path.basename(os.path.normpath(self.output_dir or "atlas"))
        )
        self.metrics_kind = self.metrics_kind or os.environ.get(ENV_KIND) or "local"
        self._remember_resolved()

    def metric_labels(self) -> dict[str, str]:
        """Labels every ``atlas_training_*`` / ``atlas_teaching_*`` sample of this run carries."""
        namespace, run, kind = self.metrics_namespace, self.metrics_run, self.metrics_kind
        assert namespace is not None and run is not None and kind is not None  # set by _resolve_atlas_fields
        return {"namespace": namespace, "run": run, "kind": kind}


def _check_teaching_fields(self) -> None:
    """A teaching value of the wrong kind or out of range (atlas_contract.defaults.LIMITS) refuses the config."""
    problems = TeachingSettings.of(self).problems()
    if problems:
        raise ValueError("; ".join(problems))


def _teaching_arguments() -> type:
    """The contract's TeachingSettings as GRPOConfig fields (TRL reads flat dataclass fields: same names, defaults
    and help, generated so that none is copied by hand), and student_offload, which only a training run has."""
    hints = typing.get_type_hints(TeachingSettings)
    specs: list[tuple] = [
        (f.name, hints[f.name], field(default=f.default, metadata=dict(f.metadata))) for f in fields(TeachingSettings)
    ]
    specs.append(("student_offload", bool, field(default=False, metadata={"help": "Keep a local student on the CPU."})))
    doc = (TeachingSettings.__doc__ or "").rstrip() + _STUDENT_OFFLOAD_DOC
    namespace = {"__doc__": doc, "__module__": __name__, "_check_teaching_fields": _check_teaching_fields}
    return make_dataclass("TeachingArguments", specs, namespace=namespace)


_STUDENT_OFFLOAD_DOC = """
        student_offload (`bool`, *optional*, defaults to `False`):
            Keep a local student on the CPU instead of the trainer's device.
"""
# Fields of the teaching protocol, used by ``TeacherGRPOTrainer`` (ignored by ``GRPOTrainer``).
if TYPE_CHECKING:
    # What mypy sees of the class _teaching_arguments generates (make_dataclass is opaque to it): TeachingSettings'
    # fields, settable, and student_offload; tests/unit/test_run_contract.py checks that the two agree.

    @dataclass
    class TeachingArguments:
        max_probe_tokens: int = TEACHING["max_probe_tokens"]
        max_guidance_tokens: int = TEACHING["max_guidance_tokens"]
        efficiency_horizon: float = TEACHING["efficiency_horizon"]
        degradation_penalty: float = TEACHING["degradation_penalty"]
        student_samples: int = TEACHING["student_samples"]
        student_max_tokens: int = TEACHING["student_max_tokens"]
        student_temperature: float = TEACHING["student_temperature"]
        student_offload: bool = False

        def _check_teaching_fields(self) -> None: ...
else:
    TeachingArguments = _teaching_arguments()


@dataclass
class GRPOConfig(_TRLGRPOConfig, AtlasArguments, TeachingArguments):
    r"""TRL's [`~trl.GRPOConfig`] with Atlas's model and telemetry fields (see :class:`AtlasArguments`) and the
    teaching protocol's fields (see :class:`TeachingArguments`)."""

    def __post_init__(self):
        self._default_to_hardware()
        # Whether TRL derives the generation batch from the batch size and accumulation steps (neither
        # given); the trainer then derives it again, so that setting those after construction works.
        self._derived_generation_batch = self.generation_batch_size is None and self.steps_per_generation is None
        super().__post_init__()
        self._resolve_atlas_fields()
        self._check_teaching_fields()

    def rederive_generation_batch(self) -> None:
        """Recompute TRL's generation batch from the current batch fields (they may have been set after
        construction, as the trainers reference does) and check that whole prompt groups fit."""
        self.resync_resolved_fields()
        if not getattr(self, "_derived_generation_batch", False):
            return
        self.steps_per_generation = self.gradient_accumulation_steps
        self.generation_batch_size = self.per_device_train_batch_size * self.world_size * self.steps_per_generation
        assert self.num_generations is not None  # TRL's __post_init__ divides by it
        problem = checks.generation_batch_problem(
            self.num_generations,
            self.per_device_train_batch_size,
            self.world_size,
            self.gradient_accumulation_steps,
        )
        if problem:
            raise ValueError(problem)
