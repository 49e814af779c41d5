"""The run's ConfigMap, rendered: run.yaml (typed by atlas_contract/run_config.py; the trainer reads it with
atlas_core/training/load_config.py), accelerate.yaml and reward.yaml."""

from __future__ import annotations

from typing import Any

import yaml

from atlas_contract import defaults
from atlas_contract.names import (
    ACCELERATE_CONFIG_FILE,
    CONFIG_DIR,
    REWARD_CONFIG_FILE,
    RUN_CONFIG_FILE,
    TRAINER_METRICS_PORT,
    VLLM_PORT,
    WEIGHT_SYNC_PORT,
    ChildNames,
)
from atlas_contract.run_config import (
    DatasetConfig,
    EvaluationDataset,
    EvaluationSettings,
    OutputSettings,
    RewardConfig,
    RunConfig,
)
from atlas_operator.presets import accelerate_config
from atlas_operator.render.metadata import child_metadata
from atlas_operator.render.pod_spec import REWARD_REF_DIR
from atlas_operator.render.tracking import report_to, tracking_record
from atlas_operator.spec import AtlasTeacherSpec, Run, TrainingSpec, reward_funcs


def output_dir(run: Run) -> str:
    return f"{run.spec.checkpoint.path.rstrip('/')}/{run.name}"


def checkpoint_warning(run: Run, restart_replaces_pods: bool) -> str | None:
    """Why restarts cannot resume, or None. Without spec.checkpoint.pvc every trainer pod writes to its own
    emptyDir. ``restart_replaces_pods``: the backend restarts a failed run by making every pod anew (its restarts
    start from step 0); otherwise a failed pod restarts in place and keeps its emptyDir, but rank 0 alone writes the
    trainer state, so only a multi-node run cannot resume."""
    nodes = run.spec.resources.nodes
    if run.spec.checkpoint.pvc:
        return None
    if restart_replaces_pods:
        return (
            "spec.checkpoint.pvc: not set, so the trainer keeps its checkpoints on its pods' emptyDir, and a "
            f"{run.backend} restart (spec.maxRestarts) replaces every pod: training starts again from step 0; set "
            "spec.checkpoint.pvc to a PersistentVolumeClaim (ReadWriteMany when nodes > 1)"
        )
    if nodes < 2:
        return None
    return (
        f"spec.checkpoint.pvc: not set, so each of the {nodes} trainer pods keeps its checkpoints on its own "
        "emptyDir and a restart cannot resume (every rank stops and says why); set spec.checkpoint.pvc to a "
        "ReadWriteMany PersistentVolumeClaim that every node shares"
    )


def _server_host(run: Run, component: str, server_hostnames: bool) -> str:
    """A server's address from the trainer pods: its Service, or (``server_hostnames``: a backend that runs the
    servers as pods of its job) its pod's stable hostname."""
    owned = ChildNames(run.name)
    return owned.host(component) if server_hostnames else f"{getattr(owned, component)}.{run.namespace}.svc"


def student_endpoint(run: Run, server_hostnames: bool = False) -> str:
    return f"http://{_server_host(run, 'student', server_hostnames)}:{VLLM_PORT}/v1"


def rollout_endpoint(run: Run, server_hostnames: bool = False) -> str:
    return f"http://{_server_host(run, 'rollout', server_hostnames)}:{VLLM_PORT}"


def run_config(run: Run, trainer_image: str | None = None, server_hostnames: bool = False) -> dict[str, Any]:
    """The run configuration the trainer pods load (`atlas_core.cli.train recipe=run.yaml`); ``server_hostnames``:
    the servers are reached at their pods' hostnames (the run's backend says: atlas_operator/backends/)."""
    return typed_run_config(run, trainer_image, server_hostnames).to_dict()


def typed_run_config(run: Run, trainer_image: str | None = None, server_hostnames: bool = False) -> RunConfig:
    """run.yaml as the contract types it (atlas_contract/run_config.py), built from the run's spec (``trainer_image``:
    the operator's, named in the tracking params when the spec names none)."""
    spec = run.spec
    trainer = trainer_config(run, server_hostnames)
    student = None
    if isinstance(spec, AtlasTeacherSpec) and spec.student:
        student = student_endpoint(run, server_hostnames) if spec.student.rollout.replicas else spec.student.model
        trainer.update(vars(spec.teaching))  # the CRD's teaching fields are named as the contract's TeachingSettings
    return RunConfig(
        algorithm=spec.algorithm,
        model=spec.model,
        run_name=run.name,
        output_dir=output_dir(run),
        resume="auto",  # one decision for all ranks (atlas_core.training.resume)
        dataset=DatasetConfig(source=spec.dataset.source, split=spec.dataset.split),
        reward=RewardConfig(
            funcs=tuple(reward_funcs(run)),
            config=reward_config_path(run),
            weights=None if spec.reward.weights is None else tuple(spec.reward.weights),
        ),
        trainer=trainer,
        student=student,
        evaluation=evaluation_settings(run),
        output=OutputSettings(spec.output.uri, spec.output.merge) if spec.output else None,
        tracking=tracking_record(run, trainer_image),
    )


def trainer_config(run: Run, server_hostnames: bool = False) -> dict[str, Any]:
    """run.yaml's ``trainer``: the algorithm's defaults, spec.training, and what the operator owns."""
    spec = run.spec
    trainer = {**defaults.training_defaults(spec.algorithm), **training_fields(spec.training)}
    lora = lora_settings(spec.training)
    if lora is not None:
        trainer["lora"] = lora
    trainer.update(
        save_strategy="steps",
        save_steps=spec.checkpoint.save_steps,
        metrics_port=TRAINER_METRICS_PORT,
        metrics_host="0.0.0.0",  # scraped by Prometheus and the operator through <name>-metrics
        report_to=report_to(run),
    )
    if spec.resources.gpus_per_node == 0:
        trainer["bf16"] = False
    else:
        trainer.setdefault("bf16", True)
    trainer.update(rollout_fields(run, server_hostnames))
    return trainer


def rollout_fields(run: Run, server_hostnames: bool = False) -> dict[str, Any]:
    """The trainer's vLLM settings for spec.rollout: a server to call (mode server), vLLM in every trainer process
    (mode colocate), or none (the trainer generates)."""
    rollout = run.spec.rollout
    if run.spec.algorithm == "sft":
        return {}
    if rollout.mode == "colocate":
        fields = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": rollout.gpu_memory_utilization,
            "vllm_tensor_parallel_size": rollout.tensor_parallel_size,
            "vllm_enable_sleep_mode": bool(rollout.enable_sleep_mode),
        }
        if rollout.max_model_len is not None:
            fields["vllm_max_model_length"] = rollout.max_model_len
        return fields
    if not rollout.replicas:
        return {}
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": rollout_endpoint(run, server_hostnames),
        "vllm_group_port": WEIGHT_SYNC_PORT,
    }


def evaluation_settings(run: Run) -> EvaluationSettings | None:
    """run.yaml's ``evaluation`` (AtlasTeacher spec.evaluation; None when unset): what the trainer's Master
    evaluates after training. The source is passed as spec.dataset.source is (the trainer resolves both alike)."""
    evaluation = getattr(run.spec, "evaluation", None)
    if evaluation is None:
        return None
    return EvaluationSettings(
        dataset=EvaluationDataset(
            source=evaluation.dataset.source or run.spec.dataset.source, split=evaluation.dataset.split
        ),
        samples=evaluation.samples,
        limit=evaluation.limit,
    )


def training_fields(training: TrainingSpec) -> dict[str, Any]:
    """spec.training (camelCase fields that are set, plus extra) → trainer kwargs (snake_case); lora apart."""
    fields = {
        name: value for name, value in vars(training).items() if name not in ("extra", "lora") and value is not None
    }
    fields.update(training.extra)
    return fields


def lora_settings(training: TrainingSpec) -> dict[str, Any] | None:
    """run.yaml's ``trainer.lora`` (atlas_contract/lora.py): spec.training.lora with every setting filled in,
    snake_case, ``target_modules`` ``all-linear`` or a list of names; None when the run trains every weight."""
    if training.lora is None:
        return None
    settings, problems = training.lora.settings()
    if problems:  # parse_run refuses such a run first (the schema, the CEL rules and validate_run)
        raise ValueError("; ".join(problems))
    assert settings is not None, "a mapping parses to settings or to problems (atlas_contract/lora.py)"
    return settings.to_dict()


def reward_config_path(run: Run) -> str | None:
    if run.spec.reward.config_map_ref:
        return f"{REWARD_REF_DIR}/{run.spec.reward.config_map_ref.key}"
    if run.spec.reward.config:
        return f"{CONFIG_DIR}/{REWARD_CONFIG_FILE}"
    return None


def config_map(
    run: Run, reward_yaml: str | None = None, trainer_image: str | None = None, server_hostnames: bool = False
) -> dict[str, Any]:
    """``<name>-config``: the run configuration, the Accelerate config and (named RIM config) the reward config.

    ``reward_yaml`` is the text of ``reward_system/<spec.reward.config>.yaml`` (read by the caller, so
    this stays pure)."""
    res = run.spec.resources
    mixed = "no" if res.gpus_per_node == 0 or run.spec.training.bf16 is False else "bf16"
    accelerate = accelerate_config(
        run.spec.deepspeed, num_machines=res.nodes, num_processes=res.nodes * res.processes(), mixed_precision=mixed
    )
    data = {
        RUN_CONFIG_FILE: yaml_text(
            run_config(run, trainer_image, server_hostnames),
            f"Run configuration of {run.kind} {run.namespace}/{run.name}",
        ),
        ACCELERATE_CONFIG_FILE: yaml_text(accelerate, f"Accelerate config: DeepSpeed preset {run.spec.deepspeed}"),
    }
    if run.spec.reward.config and reward_yaml is not None:
        data[REWARD_CONFIG_FILE] = reward_yaml
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(run, ChildNames(run.name).config_map, "trainer"),
        "data": data,
    }


# libyaml's emitter when PyYAML has it: the ConfigMap is rendered on every reconciliation.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(document: dict[str, Any], title: str) -> str:
    text = yaml.dump(document, Dumper=_DUMPER, sort_keys=False)
    return f"# {title} (rendered by atlas-operator; edit the run, not this file)\n" + text
