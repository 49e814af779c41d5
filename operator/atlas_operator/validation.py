"""Validation of a run: parse a manifest into a :class:`~atlas_operator.spec.Run` with every problem named by its
full spec path. The CRD's CEL rules (atlas_operator/validation_rules.py) are evaluated here too, with the same
expressions the API server runs at ``kubectl apply``; what CEL cannot see (spec.training.extra, the operator's
bundled reward configs, the datasets a run reads) is checked here only."""

from __future__ import annotations

import dataclasses
from typing import Any

from atlas_contract import datasets, defaults, rules
from atlas_contract.errors import InvalidFields
from atlas_contract.names import API_VERSION, BACKENDS, MAX_RUN_NAME, TRAINJOB_RESERVED_ENV
from atlas_operator import validation_rules
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
    if not isinstance(name, str):  # what it must be beyond a string is a rule of validation_rules
        problems.append(f"metadata.name: expected a DNS label of at most {MAX_RUN_NAME} characters, got {name!r}")
        name = str(name or "")
    spec = parse(SPEC_TYPES[kind], manifest.get("spec"), "spec", problems)
    backend = spec.backend or default_backend or BACKENDS[0]
    problems += _rule_problems(kind, name, spec, backend, problems)
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
        semantic = validate_run(run)
    except Exception as exc:  # noqa: BLE001 - a check that breaks must give Invalid, never a dead reconcile
        semantic = [f"spec: cannot be validated ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"]
    problems += [p for p in semantic if p.split(":")[0] not in reported]
    if problems:
        raise InvalidFields(problems)
    return run


def _rule_problems(kind: str, name: str, spec: RunSpec, backend: str, reported: list[str]) -> list[str]:
    """The CRD's CEL rules, evaluated by the operator on the parsed spec (with the backend it will use: the API
    server cannot know the operator's default); a field the schema already rejected is not reported twice."""

    seen = {p.split(":")[0] for p in reported}
    found = validation_rules.problems(kind, name, {**to_object(spec, hide_unknown=True), "backend": backend})
    return [p for p in found if p.split(":")[0] not in seen]


def validate_run(run: Run) -> list[str]:
    """Checks beyond the schema and the CRD's CEL rules (atlas_operator/validation_rules.py): what CEL cannot see
    (spec.training.extra, the operator's bundled reward configs), each naming the field and what was expected."""
    spec, problems = run.spec, []
    res, training = spec.resources, spec.training
    if spec.algorithm in ("grpo", "teacher"):  # reads spec.training.extra, which CEL cannot
        problems += _batch_problems(training, res.nodes * res.processes())
    problems += dataset_problems(spec)  # the datasets the run reads (atlas_contract.datasets)
    reward = spec.reward
    configs = rules.bundled_reward_configs()  # the operator's files, so not in the CRD
    if reward.config and reward.config not in configs:
        problems.append(
            f"spec.reward.config: expected one of {', '.join(configs)} "
            f"(or use configMapRef for your own), got {reward.config!r}"
        )
    problems += rules.weight_problems(reward.weights, name=lambda field: f"spec.reward.{field}")
    if isinstance(spec, AtlasTeacherSpec) and spec.student is None:  # the CRD's `required`
        problems.append("spec.student: required for AtlasTeacher (the frozen student model)")
    if run.backend == "TrainJob":  # CEL could not read spec.env at a bounded cost (valueFrom keeps unknown fields)
        reserved = [f"spec.env[{i}].name" for i, var in enumerate(spec.env) if var.name in TRAINJOB_RESERVED_ENV]
        problems += [
            f"{field}: the Kubeflow Trainer sets {', '.join(TRAINJOB_RESERVED_ENV)} on backend TrainJob (its webhook "
            "refuses a TrainJob whose trainer sets one); remove it"
            for field in reserved
        ]
    for name in sorted(set(training.extra) & set(OPERATOR_OWNED_TRAINER_FIELDS)):
        problems.append(
            f"spec.training.extra.{name}: the operator sets it ({OPERATOR_OWNED_TRAINER_FIELDS[name]}); "
            "remove it from extra"
        )
    for name, value in sorted(training.extra.items()):  # the ones whose kind and range the contract knows
        if name in defaults.LIMITS and name not in OPERATOR_OWNED_TRAINER_FIELDS:
            kinds = (int,) if name in ("steps_per_generation", "generation_batch_size") else (int, float)
            problem = rules.setting_problem(name, value, kinds)
            if problem:
                problems.append(f"spec.training.extra.{name}: {problem}")
    extra_clash = sorted(set(spec.training.extra) & {f.name for f in dataclasses.fields(TrainingSpec)})
    for name in extra_clash:
        problems.append(f"spec.training.extra.{name}: set it as spec.training.{camel(name)} instead")
    return problems


def dataset_problems(spec: RunSpec) -> list[str]:
    """Every dataset the run reads, training and evaluation, checked as far as the manifest tells
    (atlas_contract.datasets: builtins, their kinds and splits; a file on the checkpoint volume is checked by the
    trainer at start-up, before any model loads). A dataset missing altogether is the schema's problem, said once."""
    if spec.dataset is None:
        return []
    training = datasets.dataset_problems(
        spec.dataset.source, spec.dataset.split, spec.algorithm, "spec.dataset", local=False
    )
    evaluation = getattr(spec, "evaluation", None)
    if evaluation is None or (evaluation.dataset.source is None and training):
        return training  # an unset evaluation source is the training one: named once, above
    source = evaluation.dataset.source or spec.dataset.source
    return training + datasets.evaluation_problems(
        source, evaluation.dataset.split, "spec.evaluation.dataset", local=False
    )


# Trainer fields the operator writes into run.yaml itself (render.run_config), and where a user sets them.
OPERATOR_OWNED_TRAINER_FIELDS = {
    "output_dir": "from spec.checkpoint.path and the run's name",
    "run_name": "from the run's name",
    "save_strategy": "every spec.checkpoint.saveSteps steps",
    "save_steps": "set spec.checkpoint.saveSteps instead",
    "report_to": "metrics go to Prometheus through the run's metrics Service",
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
    """TRL's generation-batch rule (atlas_contract.rules), on the values this run will really use."""
    values = {**defaults.training_defaults("grpo"), **{k: v for k, v in vars(training).items() if v is not None}}
    extra = training.extra
    problem = rules.generation_batch_problem(
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
