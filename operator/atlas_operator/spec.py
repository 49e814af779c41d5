"""The API types of ``AtlasTraining`` and ``AtlasTeacher`` (atlas.arc.computer/v1alpha1).

The one source of truth: the CRDs in ``crds/`` are generated from these dataclasses
(``python -m atlas_operator.generate``), and the operator and ``atlas render`` parse manifests
with them. Every field documents its meaning and default. ``validate_run`` adds the checks a
schema cannot express (batch divisibility, parallelism, references).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from atlas_operator.schema import camel, parse, spec_field

GROUP = "atlas.arc.computer"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KINDS = {"AtlasTraining": "atlastrainings", "AtlasTeacher": "atlasteachers"}
SHORT_NAMES = {"AtlasTraining": ["atr"], "AtlasTeacher": ["ateach"]}
DEEPSPEED_PRESETS = ("zero1", "zero2", "zero3", "zero3-offload")
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# <name>-rollout / -student / -metrics must stay valid Service names (63 characters).
MAX_RUN_NAME = 63 - len("-student")


@dataclass
class DatasetSpec:
    """Where the training prompts come from."""

    source: str = spec_field(
        "hf://org/name (needs hub access or a mounted HF cache), a .jsonl/.json/.csv/.parquet file or "
        "save_to_disk folder on the checkpoint volume, or builtin://arithmetic (the bundled task)",
        required=True,
    )
    split: str = spec_field("dataset split", "train")


@dataclass
class LocalObjectReference:
    name: str = spec_field("name of the object in the run's namespace", required=True)


@dataclass
class ConfigMapKeyRef:
    name: str = spec_field("ConfigMap in the run's namespace", required=True)
    key: str = spec_field("key holding the RIM config YAML", "reward.yaml")


@dataclass
class RewardSpec:
    """How completions are scored: verifiable functions and/or RIM judges."""

    config: str | None = spec_field(
        "RIM judges: a reward_system config name (interpretation, interpretation_offline); unset = no judges"
    )
    config_map_ref: ConfigMapKeyRef | None = spec_field(
        "RIM judges from your own config in a ConfigMap (instead of config)"
    )
    funcs: list[str] | None = spec_field(
        "verifiable reward functions (exact_match, boxed_format); unset = exact_match when no judges are "
        "configured (AtlasTraining), none for AtlasTeacher (the student's answers are checked against ground_truth)",
    )
    weights: list[float] | None = spec_field("one weight per reward (funcs, then RIM); unset = all 1.0")


@dataclass
class TrainingSpec:
    """GRPOConfig / SFTConfig fields in camelCase; unset fields keep the trainer's defaults."""

    learning_rate: float | None = spec_field(
        "peak learning rate (trainer default 1e-6)", minimum=0, exclusive_minimum=True
    )
    num_train_epochs: float | None = spec_field(
        "passes over the dataset (default 3)", minimum=0, exclusive_minimum=True
    )
    max_steps: int | None = spec_field("optimizer steps; overrides numTrainEpochs when set", minimum=1)
    per_device_train_batch_size: int | None = spec_field(
        "completions per process per micro-batch (default 8)", minimum=1
    )
    gradient_accumulation_steps: int | None = spec_field("micro-batches per optimizer step (default 1)", minimum=1)
    beta: float | None = spec_field("KL coefficient against the reference model; 0 = no KL (default 0)", minimum=0)
    num_generations: int | None = spec_field("completions per prompt, GRPO's group size (default 8)", minimum=2)
    max_completion_length: int | None = spec_field("tokens per completion (default 512)", minimum=1)
    temperature: float | None = spec_field("sampling temperature (default 1.0)", minimum=0, exclusive_minimum=True)
    top_p: float | None = spec_field("nucleus sampling (default 1.0)", minimum=0, maximum=1, exclusive_minimum=True)
    num_iterations: int | None = spec_field("policy updates per generation batch, GRPO's mu (default 1)", minimum=1)
    epsilon: float | None = spec_field("clipping epsilon (default 0.2)", minimum=0)
    loss_type: str | None = spec_field("GRPO loss (default dapo)", enum=("grpo", "bnpo", "dr_grpo", "dapo", "cispo"))
    scale_rewards: str | None = spec_field("reward scaling (default group)", enum=("group", "batch", "none"))
    lr_scheduler_type: str | None = spec_field("learning-rate schedule (default linear)")
    warmup_steps: float | None = spec_field("warm-up steps, or a fraction of all steps when < 1 (default 0)", minimum=0)
    weight_decay: float | None = spec_field("AdamW weight decay (default 0)", minimum=0)
    max_grad_norm: float | None = spec_field("gradient clipping (default 1.0)", minimum=0)
    logging_steps: int | None = spec_field("steps between logged metrics (default 10)", minimum=1)
    seed: int | None = spec_field("random seed (default 42)")
    gradient_checkpointing: bool | None = spec_field("recompute activations to save memory (default true)")
    bf16: bool | None = spec_field("bf16 mixed precision (default: on with GPUs, off on CPU)")
    extra: dict[str, Any] = spec_field(
        "any other GRPOConfig/SFTConfig field, snake_case, passed to the trainer as is "
        "(checked when the trainer starts)",
        {},
    )


@dataclass
class Toleration:
    key: str | None = spec_field("taint key")
    operator: str | None = spec_field("Exists or Equal", enum=("Exists", "Equal"))
    value: str | None = spec_field("taint value")
    effect: str | None = spec_field(
        "NoSchedule, PreferNoSchedule or NoExecute", enum=("NoSchedule", "PreferNoSchedule", "NoExecute")
    )
    toleration_seconds: int | None = spec_field("how long a NoExecute taint is tolerated")


@dataclass
class ResourcesSpec:
    """Trainer topology and pod placement."""

    nodes: int = spec_field("trainer pods (PyTorchJob Master + nodes-1 Workers)", 1, minimum=1)
    gpus_per_node: int = spec_field("nvidia.com/gpu per trainer pod; 0 = CPU", 1, minimum=0)
    processes_per_node: int | None = spec_field(
        "training processes per pod (default: gpusPerNode, 1 on CPU)", minimum=1
    )
    cpu: str | None = spec_field("CPU request and limit per trainer pod, e.g. '32'")
    memory: str | None = spec_field("memory request and limit per trainer pod, e.g. 512Gi")
    shm_size: str = spec_field("size of the /dev/shm memory volume (NCCL, dataloaders)", "16Gi")
    node_selector: dict[str, str] = spec_field("node labels the trainer and rollout pods must match", {})
    tolerations: list[Toleration] = spec_field("taints the trainer and rollout pods tolerate", [])

    def processes(self) -> int:
        return self.processes_per_node or max(self.gpus_per_node, 1)


@dataclass
class RolloutSpec:
    """vLLM servers that generate completions (`trl vllm-serve`, weights synced after each step)."""

    replicas: int = spec_field("servers; 0 = generate inside the trainer", 1, minimum=0)
    gpus: int = spec_field("GPUs per server (tensorParallelSize x data parallel)", 1, minimum=1)
    tensor_parallel_size: int = spec_field("tensor parallel size; must divide gpus", 1, minimum=1)
    image: str | None = spec_field("vLLM image (default: the operator's rollout image)")
    gpu_memory_utilization: float | None = spec_field(
        "vLLM --gpu-memory-utilization (default 0.9)", minimum=0, maximum=1
    )
    max_model_len: int | None = spec_field("vLLM --max-model-len (default: the model's)", minimum=1)
    cpu: str | None = spec_field("CPU request and limit per server")
    memory: str | None = spec_field("memory request and limit per server")
    args: list[str] = spec_field("extra command-line arguments for the server", [])


@dataclass
class CheckpointSpec:
    """Where checkpoints, the final model and metrics.jsonl go; a run resumes from the newest checkpoint."""

    pvc: str | None = spec_field(
        "PersistentVolumeClaim to keep checkpoints on (ReadWriteMany for nodes > 1); unset = an emptyDir, "
        "lost with the pod, and a spec change cannot restart from a checkpoint"
    )
    path: str = spec_field(
        "mount path in the trainer pods; the run writes to <path>/<run name>", "/checkpoints", pattern=r"/.*"
    )
    save_steps: int = spec_field("steps between checkpoints", 50, minimum=1)


@dataclass
class StudentSpec:
    """The frozen student the teacher is rewarded for improving."""

    model: str = spec_field("HF id or path of the student model", required=True)
    rollout: RolloutSpec = spec_field(
        "vLLM servers for the student (`vllm serve`, OpenAI API); replicas 0 = load it in every trainer process",
        RolloutSpec,
    )


@dataclass
class TeachingSpec:
    """The adaptive teaching protocol (probe → guidance → student) and its reward."""

    max_probe_tokens: int = spec_field("tokens of the diagnostic probe", 50, minimum=1)
    max_guidance_tokens: int = spec_field("tokens of the teaching guidance", 200, minimum=10)
    efficiency_horizon: float = spec_field(
        "guidance length at which the efficiency bonus reaches 0", 200.0, minimum=0, exclusive_minimum=True
    )
    degradation_penalty: float = spec_field("subtracted when guidance makes the student worse", 2.0, minimum=0)
    student_samples: int | None = spec_field("student answers per task, baseline and guided (default 2)", minimum=1)
    student_max_tokens: int | None = spec_field("tokens per student answer (default 1024)", minimum=1)


@dataclass
class EnvVar:
    name: str = spec_field("variable name", required=True)
    value: str | None = spec_field("literal value (never a secret: use valueFrom)")
    value_from: dict[str, Any] | None = spec_field("a Kubernetes EnvVarSource, e.g. secretKeyRef")


@dataclass
class RunSpec:
    """Spec shared by AtlasTraining and AtlasTeacher."""

    model: str = spec_field("HF id or path of the policy to train (the teacher for AtlasTeacher)", required=True)
    dataset: DatasetSpec = spec_field("training prompts", required=True)
    image: str | None = spec_field("trainer image (default: the operator's trainer image)")
    image_pull_secrets: list[LocalObjectReference] = spec_field("Secrets for pulling the images", [])
    service_account_name: str | None = spec_field("ServiceAccount of the trainer and rollout pods")
    reward: RewardSpec = spec_field("reward functions and RIM judges", RewardSpec)
    training: TrainingSpec = spec_field("trainer hyper-parameters (GRPOConfig fields, camelCase)", TrainingSpec)
    resources: ResourcesSpec = spec_field("trainer topology: nodes, GPUs, CPU, memory, placement", ResourcesSpec)
    deepspeed: str = spec_field("DeepSpeed preset (accelerate/deepspeed_*.yaml)", "zero3", enum=DEEPSPEED_PRESETS)
    rollout: RolloutSpec = spec_field(
        "vLLM rollout servers for the policy; replicas 0 = generate in the trainer", RolloutSpec
    )
    checkpoint: CheckpointSpec = spec_field("checkpoint volume and frequency", CheckpointSpec)
    env: list[EnvVar] = spec_field("extra environment for the trainer pods (API keys by secretKeyRef)", [])
    suspend: bool = spec_field("true suspends the PyTorchJob and scales the rollouts to 0; false resumes", False)


@dataclass
class AtlasTrainingSpec(RunSpec):
    """GRPO (or SFT) of a model on a verifiable or RIM-judged task."""

    algorithm: str = spec_field("training algorithm", "grpo", enum=("grpo", "sft"))


@dataclass
class AtlasTeacherSpec(RunSpec):
    """GRPO of a teacher rewarded by how much its guidance improves a frozen student."""

    student: StudentSpec | None = spec_field("the frozen student", required=True)
    teaching: TeachingSpec = spec_field("teaching protocol and reward", TeachingSpec)

    @property
    def algorithm(self) -> str:
        return "teacher"


SPEC_TYPES = {"AtlasTraining": AtlasTrainingSpec, "AtlasTeacher": AtlasTeacherSpec}


@dataclass
class Run:
    """A parsed run: what rendering works from."""

    kind: str
    name: str
    namespace: str
    uid: str | None
    generation: int | None
    spec: AtlasTrainingSpec | AtlasTeacherSpec
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


class InvalidRun(Exception):
    """A manifest that cannot run; ``problems`` lists every reason, one line each."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_run(manifest: dict[str, Any], namespace: str | None = None) -> Run:
    """A manifest (or a kopf body) → :class:`Run`; raises :class:`InvalidRun` with every problem."""
    problems: list[str] = []
    if not isinstance(manifest, dict):
        raise InvalidRun([f"manifest: expected a mapping, got {type(manifest).__name__}"])
    kind = manifest.get("kind")
    if kind not in SPEC_TYPES:
        raise InvalidRun([f"kind: expected {' or '.join(SPEC_TYPES)}, got {kind!r}"])
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(f"apiVersion: expected {API_VERSION}, got {manifest.get('apiVersion')!r}")
    meta = manifest.get("metadata") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not re.fullmatch(DNS_LABEL, name) or len(name) > MAX_RUN_NAME:
        problems.append(
            f"metadata.name: expected a DNS label of at most {MAX_RUN_NAME} characters "
            f"(lowercase letters, digits, '-'), got {name!r}"
        )
        name = str(name or "")
    spec = parse(SPEC_TYPES[kind], manifest.get("spec"), "spec", problems)
    run = Run(
        kind=kind,
        name=name,
        namespace=namespace or meta.get("namespace") or "default",
        uid=meta.get("uid"),
        generation=meta.get("generation"),
        spec=spec,
        labels=dict(meta.get("labels") or {}),
    )
    # Semantic checks run on what did parse (a wrong field falls back to its default); a field the
    # schema already rejected is not reported twice.
    reported = {p.split(":")[0] for p in problems}
    problems += [p for p in validate_run(run) if p.split(":")[0] not in reported]
    if problems:
        raise InvalidRun(problems)
    return run


REWARD_FUNCTIONS = ("exact_match", "boxed_format")
REWARD_CONFIGS = ("interpretation", "interpretation_offline")


def validate_run(run: Run) -> list[str]:
    """Checks beyond the schema, each naming the field and what was expected."""
    spec, problems = run.spec, []
    res, training = spec.resources, spec.training
    if res.gpus_per_node and res.processes_per_node and res.processes_per_node > res.gpus_per_node:
        problems.append(
            f"spec.resources.processesPerNode: expected at most gpusPerNode ({res.gpus_per_node}) processes "
            f"(one per GPU), got {res.processes_per_node}"
        )
    if spec.algorithm in ("grpo", "teacher"):
        problems += _batch_problems(training, res.nodes * res.processes())
    problems += _rollout_problems(spec.rollout, "spec.rollout", policy=True)
    if spec.algorithm == "sft" and spec.rollout.replicas:
        problems.append(
            f"spec.rollout.replicas: expected 0 for algorithm sft (SFT generates nothing), got {spec.rollout.replicas}"
        )
    reward = spec.reward
    if reward.config and reward.config_map_ref:
        problems.append("spec.reward: set config or configMapRef, not both")
    if reward.config and reward.config not in REWARD_CONFIGS:
        problems.append(
            f"spec.reward.config: expected one of {', '.join(REWARD_CONFIGS)} "
            f"(or use configMapRef for your own), got {reward.config!r}"
        )
    for func in reward.funcs or []:
        if func not in REWARD_FUNCTIONS:
            problems.append(f"spec.reward.funcs: unknown reward {func!r} (available: {', '.join(REWARD_FUNCTIONS)})")
    if reward.weights is not None:
        expected = len(reward_funcs(run)) + (1 if has_judges(run) else 0)
        if len(reward.weights) != expected:
            problems.append(
                f"spec.reward.weights: expected {expected} weights (one per reward function, then RIM), "
                f"got {len(reward.weights)}"
            )
    if isinstance(spec, AtlasTeacherSpec):
        if spec.student is None:
            problems.append("spec.student: required for AtlasTeacher (the frozen student model)")
        else:
            problems += _rollout_problems(spec.student.rollout, "spec.student.rollout", policy=False)
    extra_clash = sorted(set(spec.training.extra) & {f.name for f in dataclasses.fields(TrainingSpec)})
    for name in extra_clash:
        problems.append(f"spec.training.extra.{name}: set it as spec.training.{camel(name)} instead")
    if spec.algorithm == "grpo" and not reward_funcs(run) and not has_judges(run):
        problems.append("spec.reward: expected at least one reward function (funcs) or RIM judges (config)")
    return problems


def _batch_problems(training: TrainingSpec, processes: int) -> list[str]:
    """TRL's rule: every generation batch holds whole groups of numGenerations completions."""
    per_device = training.per_device_train_batch_size or 8
    accumulation = training.gradient_accumulation_steps or 1
    generations = training.num_generations or 8
    steps = training.extra.get("steps_per_generation") or accumulation
    batch = training.extra.get("generation_batch_size") or per_device * processes * steps
    if isinstance(batch, int) and batch % generations:
        return [
            f"spec.training.numGenerations: {generations} does not divide the generation batch of {batch} "
            f"completions (perDeviceTrainBatchSize {per_device} x {processes} processes x {steps} "
            f"gradient accumulation steps)"
        ]
    return []


def _rollout_problems(rollout: RolloutSpec, where: str, policy: bool) -> list[str]:
    problems = []
    if rollout.gpus % rollout.tensor_parallel_size:
        problems.append(
            f"{where}.tensorParallelSize: {rollout.tensor_parallel_size} does not divide {where}.gpus ({rollout.gpus})"
        )
    if policy and rollout.replicas > 1:
        problems.append(
            f"{where}.replicas: expected 0 or 1 (the trainer syncs weights into one trl vllm-serve server; "
            f"scale it with {where}.gpus = tensorParallelSize x data parallel), got {rollout.replicas}"
        )
    return problems


def has_judges(run: Run) -> bool:
    return bool(run.spec.reward.config or run.spec.reward.config_map_ref)


def reward_funcs(run: Run) -> list[str]:
    """The verifiable reward functions in effect (see RewardSpec.funcs)."""
    if run.spec.reward.funcs is not None:
        return list(run.spec.reward.funcs)
    if run.kind == "AtlasTeacher" or has_judges(run):
        return []
    return ["exact_match"] if run.spec.algorithm == "grpo" else []
