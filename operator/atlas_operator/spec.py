"""The API types of ``AtlasTraining`` and ``AtlasTeacher`` (atlas.arc.computer/v1alpha1): spec and status.

The one source of truth: the CRDs in ``crds/`` are generated from these dataclasses
(``python -m atlas_operator.generate``), and the operator and ``atlas render`` parse manifests
with them. Every field documents its meaning; its default is stated by the schema generator from
the value that applies (``default=``, ``trainer_default`` from :mod:`atlas_contract.defaults`, or
``unset=`` where unset means something else). The cross-field rules are CEL, in the CRDs and evaluated by
``parse_run`` (:mod:`atlas_operator.cel_rules`); ``validate_run`` adds what CEL cannot see
(``spec.training.extra``, the bundled reward configs).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from atlas_contract import defaults, tracking
from atlas_contract.lora import ALL_LINEAR, MAX_TARGET_MODULES, LoraSettings
from atlas_contract.names import (
    API_VERSION,
    BACKENDS,
    GROUP,
    KINDS,
    PHASES,
    SHORT_NAMES,
    STOP_EXIT_CODE,
    VERSION,
    WATCHDOG_EXIT_CODE,
)
from atlas_contract.teaching import TEACHING_FIELDS, TeachingSettings
from atlas_operator.schema import spec_field

__all__ = ["API_VERSION", "GROUP", "KINDS", "SHORT_NAMES", "VERSION", "PHASES", "Run", "SPEC_TYPES"]

DEEPSPEED_PRESETS = ("zero1", "zero2", "zero3", "zero3-offload")
ROLLOUT_MODES = ("server", "colocate")  # spec.rollout.mode: TRL's vllm_mode values
# A Kueue LocalQueue name as Kueue's job webhook checks the queue-name label (IsDNS1123Subdomain), which as a label
# value is also at most 63 characters (the field's maxLength).
QUEUE_NAME_PATTERN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
# A DNS-1035 label: the run's name starts the names of Services (<name>-metrics, ...) and, on JobSet, of Jobs,
# which must begin with a letter.
DNS_LABEL = r"[a-z]([-a-z0-9]*[a-z0-9])?"
# A Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity): 32, 500m, 512Gi, 1.5e3.
QUANTITY_PATTERN = (
    r"(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?"
)
QUANTITY_FIELD: dict[str, Any] = {
    "pattern": QUANTITY_PATTERN,
    "pattern_doc": "a Kubernetes quantity such as 32, 500m, 16Gi or 1.5e3",
}
# Bounds of the fields the CRD's CEL rules read (atlas_operator/cel_rules.py): the API server prices a rule by
# the largest value it may meet and refuses a CRD over its budget.
MAX_REFERENCE = 1024  # a model or dataset: a hub id (at most 96), a URL or a path on the checkpoint volume
MAX_NAME = 253  # an object's name (a DNS subdomain), a ConfigMap key
MAX_REWARD_FUNCS = 16
MAX_LIST = 128  # spec.env, spec.rollout.args
MAX_MODULE_NAME = 128  # a spec.training.lora.targetModules entry: a module's name or the end of it (q_proj)


@dataclass
class DatasetSpec:
    """Where the training prompts come from."""

    source: str = spec_field(
        "hf://org/name (needs hub access or a mounted HF cache), s3://bucket/prefix (a data file or a folder of "
        "split files, fetched once per run with spec.storage's credentials), pvc://claim/path (read in place), a "
        ".jsonl/.json/.csv/.parquet file or save_to_disk folder on the checkpoint volume, or builtin://arithmetic "
        "(the bundled task)",
        required=True,
        max_length=MAX_REFERENCE,
    )
    split: str = spec_field("dataset split", "train", max_length=MAX_NAME)


@dataclass
class LocalObjectReference:
    name: str = spec_field("name of the object in the run's namespace", required=True)


@dataclass
class ConfigMapKeyRef:
    name: str = spec_field("ConfigMap in the run's namespace", required=True, max_length=MAX_NAME)
    key: str = spec_field("key holding the RIM config YAML", "reward.yaml", max_length=MAX_NAME)


@dataclass
class RewardSpec:
    """How completions are scored: verifiable functions and/or RIM judges."""

    config: str | None = spec_field(
        "RIM judges: a reward_system config name (interpretation, interpretation_offline)",
        unset="no judges",
        max_length=MAX_NAME,
    )
    config_map_ref: ConfigMapKeyRef | None = spec_field(
        "RIM judges from your own config in a ConfigMap (instead of config)"
    )
    funcs: list[str] | None = spec_field(
        "verifiable reward functions (exact_match, boxed_format)",
        unset="exact_match when no judges are configured (AtlasTraining), none for AtlasTeacher (the student's "
        "answers are checked against ground_truth)",
        max_items=MAX_REWARD_FUNCS,
        item_max_length=64,
    )
    weights: list[float] | None = spec_field(
        "one weight per reward (funcs, then RIM)", unset="every reward weighs 1.0", max_items=MAX_REWARD_FUNCS + 1
    )


@dataclass
class LoraSpec:
    """A LoRA adapter (PEFT) trained instead of the policy's weights; the settings of atlas_contract/lora.py."""

    r: int = spec_field("the adapter's rank", defaults.LORA["r"], **defaults.LIMITS["lora_r"].schema())
    alpha: float = spec_field(
        "the adapter's scale: its update is multiplied by alpha / r",
        defaults.LORA["alpha"],
        **defaults.LIMITS["lora_alpha"].schema(),
    )
    dropout: float = spec_field(
        "dropout on the adapter's input", defaults.LORA["dropout"], **defaults.LIMITS["lora_dropout"].schema()
    )
    target_modules: list[str] = spec_field(
        f"the layers adapted: [{ALL_LINEAR}] is every linear layer but the output head (PEFT's meaning), and stands "
        "alone; else module names, each adapting every module whose name is it or ends with .<it> (PEFT's rule for "
        "a list: q_proj adapts every layer's q_proj); a name that matches no module of the model stops the trainer "
        "before it loads any weight",
        [defaults.LORA["target_modules"]],
        max_items=MAX_TARGET_MODULES,
        item_max_length=MAX_MODULE_NAME,
    )

    def settings(self) -> tuple[LoraSettings | None, list[str]]:
        """The contract's settings (run.yaml's ``trainer.lora``) and the problems it finds, by their spec path."""
        raw = {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "target_modules": list(self.target_modules)}
        settings, problems = LoraSettings.parse(raw, "spec.training.lora")
        return settings, [p.replace(".target_modules:", ".targetModules:", 1) for p in problems]


@dataclass
class TrainingSpec:
    """GRPOConfig / SFTConfig fields in camelCase; unset fields keep the trainer's defaults."""

    learning_rate: float | None = spec_field(
        "peak learning rate", trainer_default=True, **defaults.LIMITS["learning_rate"].schema()
    )
    num_train_epochs: float | None = spec_field(
        "passes over the dataset", trainer_default=True, **defaults.LIMITS["num_train_epochs"].schema()
    )
    max_steps: int | None = spec_field(
        "optimizer steps; overrides numTrainEpochs when set",
        unset="numTrainEpochs decides",
        **defaults.LIMITS["max_steps"].schema(),
    )
    per_device_train_batch_size: int | None = spec_field(
        "completions per process per micro-batch",
        trainer_default=True,
        **defaults.LIMITS["per_device_train_batch_size"].schema(),
    )
    gradient_accumulation_steps: int | None = spec_field(
        "micro-batches per optimizer step",
        trainer_default=True,
        **defaults.LIMITS["gradient_accumulation_steps"].schema(),
    )
    beta: float | None = spec_field(
        "KL coefficient against the reference model; 0 = no KL",
        trainer_default=True,
        **defaults.LIMITS["beta"].schema(),
    )
    num_generations: int | None = spec_field(
        "completions per prompt, GRPO's group size", trainer_default=True, **defaults.LIMITS["num_generations"].schema()
    )
    max_completion_length: int | None = spec_field(
        "tokens per completion", trainer_default=True, **defaults.LIMITS["max_completion_length"].schema()
    )
    temperature: float | None = spec_field(
        "sampling temperature", trainer_default=True, **defaults.LIMITS["temperature"].schema()
    )
    top_p: float | None = spec_field("nucleus sampling", trainer_default=True, **defaults.LIMITS["top_p"].schema())
    num_iterations: int | None = spec_field(
        "policy updates per generation batch, GRPO's mu",
        trainer_default=True,
        **defaults.LIMITS["num_iterations"].schema(),
    )
    epsilon: float | None = spec_field("clipping epsilon", trainer_default=True, **defaults.LIMITS["epsilon"].schema())
    loss_type: str | None = spec_field("GRPO loss", trainer_default=True, enum=defaults.GRPO_LOSS_TYPES)
    scale_rewards: str | None = spec_field("reward scaling", trainer_default=True, enum=defaults.REWARD_SCALINGS)
    lr_scheduler_type: str | None = spec_field("learning-rate schedule", trainer_default=True, max_length=64)
    warmup_steps: float | None = spec_field(
        "warm-up steps, or a fraction of all steps when < 1",
        trainer_default=True,
        **defaults.LIMITS["warmup_steps"].schema(),
    )
    weight_decay: float | None = spec_field(
        "AdamW weight decay", trainer_default=True, **defaults.LIMITS["weight_decay"].schema()
    )
    max_grad_norm: float | None = spec_field(
        "gradient clipping", trainer_default=True, **defaults.LIMITS["max_grad_norm"].schema()
    )
    logging_steps: int | None = spec_field(
        "steps between logged metrics", trainer_default=True, **defaults.LIMITS["logging_steps"].schema()
    )
    seed: int | None = spec_field("random seed", trainer_default=True)
    gradient_checkpointing: bool | None = spec_field("recompute activations to save memory", trainer_default=True)
    bf16: bool | None = spec_field("bf16 mixed precision", unset="on when gpusPerNode > 0, off on CPU")
    step_timeout_seconds: float | None = spec_field(
        "the step watchdog: when no optimizer step completes in this many seconds, a trainer process prints every "
        f"thread's stack and what it was waiting for, and exits with code {WATCHDOG_EXIT_CODE}, so its job restarts "
        "it (the whole gang on JobSet) and it resumes from the newest checkpoint; a rollout server unreachable for "
        f"{defaults.SERVER_TIMEOUT_S:g} s ends it the same way. The first step gets 4 times as long, at least "
        f"{defaults.FIRST_STEP_MIN_S:g} s (extra.first_step_timeout_seconds sets it; 0 there = no limit on the "
        "first step). 0 = off, the rollout-server check included",
        trainer_default=True,
        **defaults.LIMITS["step_timeout_seconds"].schema(),
    )
    lora: LoraSpec | None = spec_field(
        "train a LoRA adapter of the policy (the teacher's, for AtlasTeacher) instead of every weight: PEFT, through "
        "TRL's peft_config. Checkpoints and the final model hold the adapter (adapter_model.safetensors, "
        "adapter_config.json); the rollout server gets the merged weights after each step. Fixed for the run's "
        "life, as its checkpoints are",
        unset="full fine-tuning (every weight trained)",
    )
    trust_remote_code: bool = spec_field(
        "run Python code shipped in spec.model's repository (a custom architecture) when the trainer loads the "
        "model and its tokenizer and when the rollout server does (vllm serve --trust-remote-code); false never "
        "runs such code. The student model, judges and datasets never run repository code (datasets 4+ has no "
        "loading scripts)",
        False,
    )
    extra: dict[str, Any] = spec_field(
        "any other GRPOConfig/SFTConfig field, snake_case, passed to the trainer (its kind and range are "
        "checked when the trainer starts); the fields the operator sets itself (output_dir, run_name, save_*, "
        "report_to, metrics_*, vllm_*, use_vllm and the teaching fields) are refused, and so are the fields above "
        "and peft_config (LoRA is spec.training.lora)",
        {},
    )


@dataclass
class Toleration:
    key: str | None = spec_field("taint key", unset="every taint key (with operator Exists)")
    operator: str | None = spec_field("Exists or Equal", unset="Equal (Kubernetes' default)", enum=("Exists", "Equal"))
    value: str | None = spec_field("taint value", unset="the empty value")
    effect: str | None = spec_field(
        "NoSchedule, PreferNoSchedule or NoExecute",
        unset="every effect",
        enum=("NoSchedule", "PreferNoSchedule", "NoExecute"),
    )
    toleration_seconds: int | None = spec_field("how long a NoExecute taint is tolerated", unset="forever")


@dataclass
class ResourcesSpec:
    """Trainer topology and pod placement."""

    nodes: int = spec_field("trainer pods (PyTorchJob Master + nodes-1 Workers)", 1, minimum=1)
    gpus_per_node: int = spec_field("nvidia.com/gpu per trainer pod; 0 = CPU", 1, minimum=0)
    processes_per_node: int | None = spec_field(
        "training processes per pod", unset="gpusPerNode (1 when gpusPerNode is 0)", minimum=1
    )
    cpu: str | None = spec_field(
        "CPU request and limit per trainer pod, e.g. '32'", unset="no CPU request or limit", **QUANTITY_FIELD
    )
    memory: str | None = spec_field(
        "memory request and limit per trainer pod, e.g. 512Gi", unset="no memory request or limit", **QUANTITY_FIELD
    )
    shm_size: str = spec_field("size of the /dev/shm memory volume (NCCL, dataloaders)", "16Gi", **QUANTITY_FIELD)
    node_selector: dict[str, str] = spec_field("node labels the trainer and rollout pods must match", {})
    tolerations: list[Toleration] = spec_field("taints the trainer and rollout pods tolerate", [])

    def processes(self) -> int:
        return self.processes_per_node or max(self.gpus_per_node, 1)


@dataclass
class RolloutSpec:
    """vLLM servers (`vllm serve`): the student's, and the base of the policy's rollout servers."""

    replicas: int = spec_field(
        "servers; 0 = generate inside the trainer (algorithm sft: 0 unless set, as SFT generates nothing)",
        1,
        minimum=0,
    )
    gpus: int | None = spec_field(
        "GPUs per server: tensorParallelSize x data parallel, and data parallelism is 1 (vllm serve "
        "--data-parallel-size > 1 errors out for dense models), so it equals tensorParallelSize",
        unset="tensorParallelSize",
        minimum=1,
    )
    tensor_parallel_size: int = spec_field(
        "GPUs one server shards the model over (vllm serve --tensor-parallel-size)", 1, minimum=1
    )
    image: str | None = spec_field("vLLM image", unset="the operator's rollout image")
    gpu_memory_utilization: float = spec_field(
        "vLLM --gpu-memory-utilization", 0.9, minimum=0, maximum=1, exclusive_minimum=True
    )
    max_model_len: int | None = spec_field("vLLM --max-model-len", unset="the model's context length", minimum=1)
    cpu: str | None = spec_field(
        "CPU request and limit per server; 0: neither (with memory 0 too, the server's pods are BestEffort: a Warning "
        "Event and ServersRequestResources=False)",
        unset=f"{defaults.SERVER_CPU_PER_GPU} per GPU of the server, requested, with no limit",
        **QUANTITY_FIELD,
    )
    memory: str | None = spec_field(
        "memory request and limit per server; 0: neither",
        unset=f"{defaults.SERVER_MEMORY_GI_PER_GPU}Gi per GPU of the server, requested and the limit",
        **QUANTITY_FIELD,
    )
    cache_size: str | None = spec_field(
        "size of each server's cache volume (an emptyDir on the node's disk at /var/cache/atlas: HOME, the hub "
        "cache, compile caches, and the model when the server fetches it): its sizeLimit; with "
        f"{(defaults.SERVER_TMP_MI + defaults.SERVER_LOGS_MI) // 1024}Gi more for /tmp and the logs, the server's "
        "ephemeral-storage request and limit; 0: unbounded, and no ephemeral storage requested",
        unset=f"{defaults.SERVER_MODEL_CACHE_GI}Gi when the server fetches its model into it (an S3 or hub model and "
        f"no spec.checkpoint.pvc), else {defaults.SERVER_CACHE_GI}Gi",
        **QUANTITY_FIELD,
    )
    args: list[str] = spec_field(
        "extra command-line arguments for the server", [], max_items=MAX_LIST, item_max_length=4096
    )


@dataclass
class PolicyRolloutSpec(RolloutSpec):
    """How the policy generates its completions: vLLM servers beside the trainer (`vllm serve` as TRL runs it,
    weights synced after each step), vLLM inside every trainer process (colocate), or the trainer's own
    generate (no vLLM)."""

    # Unset by default, unlike a student server's: the mode decides (a field's type is its CRD schema: kept).
    replicas: int | None = spec_field(  # type: ignore[assignment]  # a subclass field that may be unset
        "rollout servers (mode server); 0 = generate inside the trainer",
        unset="1; 0 with mode colocate or algorithm sft (SFT generates nothing)",
        minimum=0,
    )
    gpus: int | None = spec_field(
        "GPUs per server: tensorParallelSize x data parallel, and data parallelism is 1 (TRL's server: "
        "--data-parallel-size > 1 errors out for dense models), so it equals tensorParallelSize; mode server only",
        unset="tensorParallelSize",
        minimum=1,
    )
    gpu_memory_utilization: float | None = spec_field(  # type: ignore[assignment]  # as replicas above
        "share of each GPU vLLM takes: a server's --gpu-memory-utilization, or vllm_gpu_memory_utilization "
        "colocated (the trainer shares the GPU)",
        unset="0.9 for a server, 0.3 colocated (TRL's default)",
        minimum=0,
        maximum=1,
        exclusive_minimum=True,
    )
    mode: str | None = spec_field(
        "server: vLLM servers beside the trainer; colocate: vLLM inside every trainer process, on its GPUs (TRL's "
        "default mode; no server to schedule, for runs small enough to share the GPUs)",
        unset="server when replicas >= 1 (the default), else generation inside the trainer without vLLM",
        enum=ROLLOUT_MODES,
    )
    enable_sleep_mode: bool | None = spec_field(
        "mode colocate: vLLM sleeps while the trainer optimizes, freeing its GPU memory (vllm_enable_sleep_mode)",
        unset="false",
    )


# Fields of spec.rollout that only a server has: set with mode colocate, each is an error naming it
# (atlas_operator/cel_rules.py).
SERVER_ONLY_ROLLOUT_FIELDS = ("replicas", "gpus", "image", "cpu", "memory", "cache_size", "args")
# Defaults of spec.rollout fields left unset, by mode.
SERVER_GPU_MEMORY_UTILIZATION, COLOCATED_GPU_MEMORY_UTILIZATION = 0.9, 0.3


def resolve_rollout(rollout: PolicyRolloutSpec, algorithm: str) -> None:
    """Fill spec.rollout's unset fields for its mode (the rules on them are in atlas_operator/cel_rules.py)."""
    if rollout.mode == "colocate":
        rollout.replicas, rollout.gpus = 0, rollout.gpus or rollout.tensor_parallel_size
        if rollout.gpu_memory_utilization is None:
            rollout.gpu_memory_utilization = COLOCATED_GPU_MEMORY_UTILIZATION
        return
    if rollout.replicas is None:
        rollout.replicas = 0 if algorithm == "sft" else 1
    rollout.gpus = rollout.gpus or rollout.tensor_parallel_size  # unset: every GPU the server shards over
    if rollout.gpu_memory_utilization is None:
        rollout.gpu_memory_utilization = SERVER_GPU_MEMORY_UTILIZATION


@dataclass
class CheckpointSpec:
    """Where checkpoints, the final model and metrics.jsonl go; a run resumes from the newest checkpoint."""

    pvc: str | None = spec_field(
        "PersistentVolumeClaim to keep checkpoints on (ReadWriteMany for nodes > 1)",
        unset="an emptyDir, lost with the pod, so a spec change cannot restart from a checkpoint",
    )
    path: str = spec_field(
        "mount path in the trainer pods; the run writes to <path>/<run name>", "/checkpoints", pattern=r"/.*"
    )
    save_steps: int = spec_field("steps between checkpoints", 50, minimum=1)


@dataclass
class StudentSpec:
    """The frozen student the teacher is rewarded for improving."""

    model: str = spec_field(
        "the student model: a hub id or hf://org/name, s3://bucket/prefix, pvc://claim/path, builtin://… or a path "
        "(spec.model's forms); fetched once per run by the server that loads it",
        required=True,
        max_length=MAX_REFERENCE,
    )
    rollout: RolloutSpec = spec_field(
        "vLLM servers for the student (`vllm serve`, OpenAI API); replicas 0 = load it in every trainer process",
        RolloutSpec,
    )


# The contract's teaching settings the CRD has (atlas_contract/teaching.py): the student's temperature is not among
# them (a run sets it in spec.training.extra, atlas_operator/validation.py).
CRD_TEACHING_FIELDS = tuple(name for name in TEACHING_FIELDS if name != "student_temperature")


def _teaching_spec() -> type:
    """spec.teaching: TeachingSettings' fields as CRD fields (each one's type, meaning, default and range from the
    contract), generated so that none is written twice."""
    hints = typing.get_type_hints(TeachingSettings)
    specs = [
        (
            f.name,
            hints[f.name],
            spec_field(f.metadata["help"].rstrip("."), f.default, **defaults.LIMITS[f.name].schema()),
        )
        for f in dataclasses.fields(TeachingSettings)
        if f.name in CRD_TEACHING_FIELDS
    ]
    doc = "The adaptive teaching protocol (probe → guidance → student) and its reward."
    return dataclasses.make_dataclass("TeachingSpec", specs, namespace={"__doc__": doc, "__module__": __name__})


if typing.TYPE_CHECKING:
    # Made at import from the contract's fields (make_dataclass): its fields are not there for mypy to read.
    TeachingSpec: typing.TypeAlias = Any
else:
    TeachingSpec = _teaching_spec()


@dataclass
class EvaluationDatasetSpec:
    """The held-out problems of the evaluation after training."""

    source: str | None = spec_field(
        "where the problems come from, as spec.dataset.source (hf://org/name, s3://bucket/prefix, "
        "pvc://claim/path, a file or folder on the checkpoint volume, builtin://…)",
        unset="spec.dataset.source (the run's own dataset)",
        max_length=MAX_REFERENCE,
    )
    split: str = spec_field(
        "dataset split to evaluate on (held out from training)",
        defaults.EVALUATION["split"],
        pattern=r"\S+",
        pattern_doc="a split name such as test or validation",
    )


@dataclass
class EvaluationSpec:
    """After training, the trained teacher is evaluated against the run's student (ATLAS's two-pass protocol:
    each problem answered by the student alone and with the teacher's guidance); the summary is in
    .status.result.evaluation."""

    dataset: EvaluationDatasetSpec = spec_field(
        "held-out problems", EvaluationDatasetSpec, unset="the run's own spec.dataset.source, split test"
    )
    samples: int = spec_field(
        "student answers per problem, alone and guided",
        defaults.EVALUATION["samples"],
        **defaults.LIMITS["evaluation_samples"].schema(),
    )
    limit: int | None = spec_field(
        "problems evaluated (the first ones of the split)",
        unset="every problem of the split",
        **defaults.LIMITS["evaluation_limit"].schema(),
    )


@dataclass
class SecretKeySelector:
    name: str = spec_field("Secret in the run's namespace", required=True, max_length=MAX_NAME)


@dataclass
class HubSpec:
    """The Hugging Face hub (or a mirror) for hub ids and hf:// models, datasets and outputs."""

    endpoint: str | None = spec_field(
        "the hub's address, a mirror (HF_ENDPOINT)", unset="https://huggingface.co", max_length=MAX_REFERENCE
    )
    secret_ref: SecretKeySelector | None = spec_field(
        "Secret whose key HF_TOKEN is the hub token (read by the pods through secretKeyRef; never by the operator)",
        unset="no token (public repositories only)",
    )


@dataclass
class StorageSpec:
    """Where s3:// sources and outputs live, and the credentials the pods use (by Secret reference only)."""

    endpoint: str | None = spec_field(
        "the S3-compatible store's address, e.g. https://s3.example.com",
        unset="the Secret's AWS_ENDPOINT_URL, else AWS's own endpoint",
        max_length=MAX_REFERENCE,
    )
    region: str | None = spec_field(
        "the store's region (AWS_DEFAULT_REGION)",
        unset="the Secret's AWS_DEFAULT_REGION, else us-east-1",
        max_length=64,
    )
    secret_ref: SecretKeySelector | None = spec_field(
        "Secret with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and optionally AWS_ENDPOINT_URL and "
        "AWS_DEFAULT_REGION; the pods read it through secretKeyRef (the operator never reads a Secret)",
        unset="no credentials from a Secret (the pods' own, e.g. a workload identity; with none, a fetch fails "
        "AccessDenied)",
    )
    hub: HubSpec = spec_field("the Hugging Face hub: its address and token", HubSpec)


@dataclass
class OutputSpec:
    """Where the trained model goes when training succeeds: a Hugging Face folder (safetensors, config, tokenizer,
    generation config), its model card README.md (sources, spec, final step, reward and KL, the evaluation table)
    and atlas-manifest.json (every file, size and sha256) written last. .status.output and condition Exported
    say where and what; a failed export is retried without training again, the model kept on the checkpoint volume."""

    uri: str = spec_field(
        "s3://bucket/prefix (spec.storage), pvc://claim/path or hf://org/name (pushed with spec.storage.hub's token)",
        required=True,
        max_length=MAX_REFERENCE,
    )
    merge: bool = spec_field(
        "a LoRA run: export the adapter merged into its base model (whole weights, at the destination's top) "
        "besides the adapter (in adapter/) instead of the adapter alone (a full fine-tuning's export is its model "
        "either way)",
        False,
    )


@dataclass
class MLflowTrackingSpec:
    """An MLflow tracking server (or store) the run is logged to, through TRL's report_to
    (atlas_contract/tracking.py)."""

    uri: str = spec_field(
        "the tracking server as the trainer pods reach it (http://host:port, https://…) or a store on the trainer's "
        "volume (file:/path): the pods' MLFLOW_TRACKING_URI",
        required=True,
        max_length=MAX_REFERENCE,
    )
    experiment: str | None = spec_field(
        "the experiment the run is logged in (MLFLOW_EXPERIMENT_NAME; made when missing)",
        unset="the run's namespace",
        max_length=MAX_NAME,
    )


@dataclass
class WandbTrackingSpec:
    """Weights & Biases, through TRL's report_to; the key by Secret reference only."""

    project: str = spec_field("the W&B project (WANDB_PROJECT)", required=True, max_length=MAX_NAME)
    entity: str | None = spec_field(
        "the W&B entity (WANDB_ENTITY)", unset="the API key's default entity", max_length=MAX_NAME
    )
    secret_ref: SecretKeySelector | None = spec_field(
        f"Secret whose key {tracking.WANDB_SECRET_KEY} is the API key (read by the trainer pods through secretKeyRef; "
        "never by the operator)",
        unset="no key: W&B's offline mode (WANDB_MODE=offline), its files in the run's output folder",
    )


@dataclass
class TrackingSpec:
    """Experiment tracking: every run's params, curves, evaluation and model card kept in MLflow or W&B, one tracking
    run per run across every resume (.status.tracking, condition Tracking). Rank 0 logs; a tracking server that does
    not answer never stops training (its steps are logged when it is back)."""

    mlflow: MLflowTrackingSpec | None = spec_field("MLflow", unset="not logged to MLflow")
    wandb: WandbTrackingSpec | None = spec_field("Weights & Biases", unset="not logged to W&B")


@dataclass
class EnvVar:
    name: str = spec_field("variable name", required=True)
    value: str | None = spec_field(
        "literal value (never a secret: use valueFrom)", unset="valueFrom, else the empty string"
    )
    value_from: dict[str, Any] | None = spec_field("a Kubernetes EnvVarSource, e.g. secretKeyRef", unset="value")


@dataclass
class RunSpec:
    """Spec shared by AtlasTraining and AtlasTeacher."""

    model: str = spec_field(
        "the policy to train (the teacher for AtlasTeacher): a hub id, hf://org/name, s3://bucket/prefix, "
        "pvc://claim/path, builtin://… or a path (hub and S3 models are fetched once per run)",
        required=True,
        max_length=MAX_REFERENCE,
    )
    dataset: DatasetSpec = spec_field("training prompts", required=True)
    storage: StorageSpec = spec_field("the S3 store and the hub: addresses and credentials", StorageSpec)
    output: OutputSpec | None = spec_field(
        "export the trained model when training succeeds", unset="the model stays in <checkpoint.path>/<name>"
    )
    tracking: TrackingSpec | None = spec_field(
        "experiment tracking (MLflow, W&B)", unset="none: the metrics go to Prometheus and metrics.jsonl only"
    )
    image: str | None = spec_field("trainer image", unset="the operator's trainer image")
    image_pull_secrets: list[LocalObjectReference] = spec_field("Secrets for pulling the images", [])
    service_account_name: str | None = spec_field(
        "ServiceAccount of the trainer and rollout pods", unset="the namespace's default ServiceAccount"
    )
    automount_service_account_token: bool = spec_field(
        "mount the ServiceAccount's API token into the trainer and server pods; only for code of yours that "
        "calls the Kubernetes API (nothing of Atlas's does, and the pods run third-party model code)",
        False,
    )
    reward: RewardSpec = spec_field("reward functions and RIM judges", RewardSpec)
    training: TrainingSpec = spec_field("trainer hyper-parameters (GRPOConfig fields, camelCase)", TrainingSpec)
    resources: ResourcesSpec = spec_field("trainer topology: nodes, GPUs, CPU, memory, placement", ResourcesSpec)
    deepspeed: str = spec_field("DeepSpeed preset (accelerate/deepspeed_*.yaml)", "zero3", enum=DEEPSPEED_PRESETS)
    rollout: PolicyRolloutSpec = spec_field(
        "how the policy generates: vLLM servers (mode server), vLLM inside the trainer (mode colocate), or the "
        "trainer's own generate (replicas 0)",
        PolicyRolloutSpec,
    )
    checkpoint: CheckpointSpec = spec_field("checkpoint volume and frequency", CheckpointSpec)
    env: list[EnvVar] = spec_field(
        "extra environment for the trainer pods (API keys by secretKeyRef)", [], max_items=MAX_LIST
    )
    suspend: bool = spec_field(
        "true stops the run's pods (the job suspended, PyTorchJob's server Deployments scaled to 0); false "
        "resumes. With queueName, Kueue owns the job's suspend: suspending deletes the job (its quota is "
        "released) and resuming queues it again, resuming from spec.checkpoint.pvc; without a PVC the run keeps "
        "running and SpecApplied says why",
        False,
    )
    backend: str | None = spec_field(
        "what runs the trainer and servers: PyTorchJob (Kubeflow Training Operator v1: the trainer job plus one "
        "Deployment per server), JobSet (jobset.x-k8s.io: trainer and servers as one gang, admitted, restarted "
        "and finished together) or TrainJob (Kubeflow Trainer v2: a TrainJob on the chart's ClusterTrainingRuntime "
        "runs the trainer, one Deployment per server beside it)",
        unset="the operator's default backend when the run is created (ATLAS_DEFAULT_BACKEND, chart value "
        "operator.defaultBackend; PyTorchJob unless set); a run keeps the backend it started on",
        enum=BACKENDS,
    )
    queue_name: str | None = spec_field(
        "Kueue LocalQueue: the label kueue.x-k8s.io/queue-name on the job (for PyTorchJob and TrainJob also on the "
        "server Deployments' pods, which Kueue admits one pod at a time, not as a gang)",
        unset="no queue (not managed by Kueue)",
        pattern=QUEUE_NAME_PATTERN,
        pattern_doc="a LocalQueue name as Kueue accepts it: a DNS-1123 subdomain (lowercase letters, digits, '-' and "
        "'.', a letter or digit at both ends) of at most 63 characters",
        max_length=63,  # a label value
    )
    max_restarts: int = spec_field(
        "restarts before the run fails: JobSet, whole-gang restarts (failurePolicy.maxRestarts; any pod's "
        "failure, a server's included, restarts every pod); PyTorchJob, the job's runPolicy.backoffLimit; TrainJob, "
        "the ClusterTrainingRuntime's whole-gang restarts of the trainer pods, which this must equal (chart value "
        "trainJob.runtime.maxRestarts)",
        3,
        minimum=0,
    )
    termination_grace_period_seconds: int = spec_field(
        "seconds the trainer pods get after SIGTERM (Kueue preemption, a node drain, a spot reclaim, a deleted pod) "
        "before they are killed (the pods' terminationGracePeriodSeconds): every rank finishes the step in flight, "
        "a checkpoint of the model and optimizer state is saved at it, and the trainer exits with code "
        f"{STOP_EXIT_CODE}, a stop that JobSet and TrainJob do not count toward spec.maxRestarts. Choose the longest "
        "step plus the time a save takes on spec.checkpoint's volume; the trainer logs a warning when a step plus its "
        "save took longer than this. A spot reclaim's notice (often 30 s to 2 minutes) bounds it whatever it is set "
        "to. The server pods keep Kubernetes' default",
        defaults.TERMINATION_GRACE_S,
        minimum=1,
    )


@dataclass
class AtlasTrainingSpec(RunSpec):
    """GRPO (or SFT) of a model on a verifiable or RIM-judged task."""

    algorithm: str = spec_field("training algorithm", "grpo", enum=("grpo", "sft"))


@dataclass
class AtlasTeacherSpec(RunSpec):
    """GRPO of a teacher rewarded by how much its guidance improves a frozen student."""

    student: StudentSpec | None = spec_field("the frozen student", required=True)
    teaching: TeachingSpec = spec_field("teaching protocol and reward", TeachingSpec)
    evaluation: EvaluationSpec | None = spec_field(
        "evaluate the trained teacher against the student after training (.status.result.evaluation)",
        unset="no evaluation after training",
    )

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
    backend: str = BACKENDS[0]  # spec.backend, else the operator's default


def has_judges(run: Run) -> bool:
    return bool(run.spec.reward.config or run.spec.reward.config_map_ref)


def reward_funcs(run: Run) -> list[str]:
    """The verifiable reward functions in effect (see RewardSpec.funcs)."""
    if run.spec.reward.funcs is not None:
        return list(run.spec.reward.funcs)
    if run.kind == "AtlasTeacher" or has_judges(run):
        return []
    return ["exact_match"] if run.spec.algorithm == "grpo" else []
