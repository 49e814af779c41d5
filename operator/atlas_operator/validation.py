"""Validation of a run: parse a manifest into a :class:`~atlas_operator.spec.Run` with every problem named by its
full spec path. The CRD's CEL rules (atlas_operator/cel_rules.py) are evaluated here too, with the same
expressions the API server runs at ``kubectl apply`` (and the same messages); what CEL cannot see
(spec.training.extra, and the generation batch of a run that sets extra) is checked here only."""

from __future__ import annotations

import dataclasses
from typing import Any

from atlas_contract import checks, defaults
from atlas_contract.errors import InvalidFields
from atlas_contract.names import API_VERSION, BACKENDS, MAX_RUN_NAME
from atlas_operator import cel_rules
from atlas_operator.schema import camel, parse, to_object
from atlas_operator.spec import (
    SPEC_TYPES,
    AtlasTeacherSpec,
    Run,
    RunSpec,
    TeachingSpec,
    TrainingSpec,
    resolve_rollout,
)


def parse_run(manifest: dict[str, Any], namespace: str | None = None, default_backend: str | None = None) -> Run:
    """A manifest (or a kopf body) → :class:`Run`; raises :class:`InvalidFields` with every problem.
    ``default_backend`` (the operator's setting) applies when spec.backend is unset."""
    problems: list[str] = []
    if not isinstance(manifest, dict):
        raise InvalidFields([f"manifest: expected a mapping, got {type(manifest).__name__}"])
    kind = manifest.get("kind")
    if kind not in SPEC_TYPES:
        raise InvalidFields([f"kind: expected {' or '.join(SPEC_TYPES)}, got {kind!r}"])
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION}, got {manifest.get('apiVersion')!r}")
    meta = manifest.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str):  # what it must be beyond a string is a rule of cel_rules
        problems.append(f"metadata.name: expected a DNS label of at most {MAX_RUN_NAME} characters, got {name!r}")
        name = str(name or "")
    spec = parse(SPEC_TYPES[kind], manifest.get("spec"), "spec", problems)
    backend = spec.backend or default_backend or BACKENDS[0]
    extra_set = _extra_set(manifest)
    problems += _rule_problems(kind, name, spec, backend, extra_set, problems)
    # Unset rollout fields take their mode's values (SFT generates nothing: no server unless one is asked for).
    resolve_rollout(spec.rollout, spec.algorithm)
    student = getattr(spec, "student", None)
    if student is not None and student.rollout.gpus is None:  # unset: every GPU the server shards over
        student.rollout.gpus = student.rollout.tensor_parallel_size
    run = Run(
        kind=kind,
        name=name,
        namespace=namespace or meta.get("namespace") or "default",
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        spec=spec,
        labels=dict(meta.get("labels") or {}),
        backend=backend,
    )
    # Semantic checks run on what did parse (a wrong field falls back to its default); a field the
    # schema already rejected is not reported twice.
    reported = {p.split(":")[0] for p in problems}
    try:
        semantic = validate_run(run, extra_set)
    except Exception as exc:  # noqa: BLE001 - a check that breaks must give Invalid, never a dead reconcile
        semantic = [f"spec: cannot be validated ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"]
    problems += [p for p in semantic if p.split(":")[0] not in reported]
    if problems:
        raise InvalidFields(problems)
    return run


def _extra_set(manifest: dict[str, Any]) -> bool:
    """spec.training.extra is in the manifest (even empty): what the CRD's rules see of it (has())."""
    spec = manifest.get("spec")
    training = spec.get("training") if isinstance(spec, dict) else None
    return isinstance(training, dict) and training.get("extra") is not None


def _rule_problems(
    kind: str, name: str, spec: RunSpec, backend: str, extra_set: bool, reported: list[str]
) -> list[str]:
    """The CRD's CEL rules, evaluated by the operator on the parsed spec (with the backend it will use: the API
    server cannot know the operator's default); a field the schema already rejected is not reported twice."""

    seen = {p.split(":")[0] for p in reported}
    obj = {**to_object(spec, hide_unknown=True), "backend": backend}
    if not extra_set:  # the parsed spec has extra {} when unset; the API server's object has no extra
        obj.get("training", {}).pop("extra", None)
    found = cel_rules.problems(kind, name, obj)
    return [p for p in found if p.split(":")[0] not in seen]


def validate_run(run: Run, extra_set: bool = True) -> list[str]:
    """Checks beyond the schema and the CRD's CEL rules (atlas_operator/cel_rules.py): what CEL cannot see,
    spec.training.extra, each naming the field and what was expected. ``extra_set``: the manifest sets
    spec.training.extra, which enters the generation batch (the CRD's rule checks the batch of a run without it)."""
    spec, problems = run.spec, []
    res, training = spec.resources, spec.training
    if spec.algorithm in ("grpo", "teacher") and extra_set:  # reads spec.training.extra, which CEL cannot
        problems += _batch_problems(training, res.nodes * res.processes())
    problems += checks.weight_problems(spec.reward.weights, name=lambda field: f"spec.reward.{field}")
    if isinstance(spec, AtlasTeacherSpec) and spec.student is None:  # the CRD's `required`
        problems.append("spec.student: required for AtlasTeacher (the frozen student model)")
    for name in sorted(set(training.extra) & set(OPERATOR_OWNED_TRAINER_FIELDS)):
        problems.append(
            f"spec.training.extra.{name}: the operator sets it ({OPERATOR_OWNED_TRAINER_FIELDS[name]}); "
            "remove it from extra"
        )
    for name, value in sorted(training.extra.items()):  # the ones whose kind and range the contract knows
        if name in defaults.LIMITS and name not in OPERATOR_OWNED_TRAINER_FIELDS:
            kinds = (int,) if name in ("steps_per_generation", "generation_batch_size") else (int, float)
            problem = checks.setting_problem(name, value, kinds)
            if problem:
                problems.append(f"spec.training.extra.{name}: {problem}")
    extra_clash = sorted(set(spec.training.extra) & {f.name for f in dataclasses.fields(TrainingSpec)})
    for name in extra_clash:
        problems.append(f"spec.training.extra.{name}: set it as spec.training.{camel(name)} instead")
    for name in sorted(set(training.extra) & set(EXTRA_ELSEWHERE)):
        problems.append(f"spec.training.extra.{name}: {EXTRA_ELSEWHERE[name]}")
    if training.lora is not None:  # what the trainer's contract checks, which the schema and CEL rules checked first
        problems += training.lora.settings()[1]
    return problems


# Trainer arguments that are no config field, with the spec field that sets what they would.
EXTRA_ELSEWHERE = {
    "peft_config": "set spec.training.lora instead (the trainer builds PEFT's LoraConfig from it, TRL's peft_config)",
}


# Trainer fields the operator writes into run.yaml itself (render.config_map), and where a user sets them.
OPERATOR_OWNED_TRAINER_FIELDS = {
    "output_dir": "from spec.checkpoint.path and the run's name",
    "run_name": "from the run's name",
    "save_strategy": "every spec.checkpoint.saveSteps steps",
    "save_steps": "set spec.checkpoint.saveSteps instead",
    "report_to": "metrics go to Prometheus through the run's metrics Service, and to MLflow or W&B with spec.tracking",
    "metrics_port": "the port the run's metrics Service targets",
    "metrics_host": "the address the run's metrics Service reaches",
    "use_vllm": "from spec.rollout",
    "vllm_mode": "from spec.rollout",
    "vllm_server_base_url": "from spec.rollout",
    "vllm_group_port": "from spec.rollout",
    "vllm_gpu_memory_utilization": "set spec.rollout.gpuMemoryUtilization instead",
    "vllm_tensor_parallel_size": "set spec.rollout.tensorParallelSize instead",
    "vllm_enable_sleep_mode": "set spec.rollout.enableSleepMode instead",
    "vllm_max_model_length": "set spec.rollout.maxModelLen instead",
    # spec.teaching's fields (the student's temperature, which it lacks, is set here, in spec.training.extra).
    **{f.name: f"set spec.teaching.{camel(f.name)} instead" for f in dataclasses.fields(TeachingSpec)},
}


def _batch_problems(training: TrainingSpec, processes: int) -> list[str]:
    """TRL's generation-batch rule (atlas_contract.checks), on the values this run will really use."""
    values = {**defaults.training_defaults("grpo"), **{k: v for k, v in vars(training).items() if v is not None}}
    extra = training.extra
    problem = checks.generation_batch_problem(
        values["num_generations"],
        values["per_device_train_batch_size"],
        processes,
        values["gradient_accumulation_steps"],
        steps_per_generation=_whole(extra.get("steps_per_generation")),
        generation_batch_size=_whole(extra.get("generation_batch_size")),
        name=lambda field: (
            f"spec.training.{camel(field)}" if hasattr(training, field) else f"spec.training.extra.{field}"
        ),
    )
    return [problem] if problem else []


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
