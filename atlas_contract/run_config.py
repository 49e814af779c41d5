"""run.yaml, typed: what the operator writes into a run's ConfigMap and the trainer reads.

The operator builds a :class:`RunConfig` from a run's spec and writes its :meth:`RunConfig.to_dict`
(``operator/atlas_operator/render/config_map.py``); the trainer composes its Hydra config (recipes, overrides) and
parses the result with :meth:`RunConfig.from_dict` (``atlas_core/training/load_config.py``), which raises
:class:`~atlas_contract.errors.InvalidFields` listing every problem under its full path (``trainer.student_temperature:
expected …``). The teaching fields stay under ``trainer`` in the file (they are GRPOConfig fields there) and are read
as :attr:`RunConfig.teaching`. What the contract cannot judge without the training libraries (which trainer fields
exist, whether a model or dataset loads) the trainer checks after parsing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from atlas_contract.defaults import EVALUATION
from atlas_contract.errors import InvalidFields
from atlas_contract.lora import LoraSettings
from atlas_contract.names import ALGORITHMS
from atlas_contract.reading import FieldReader
from atlas_contract.teaching import TeachingSettings
from atlas_contract.text import bounded_repr

MODEL_KINDS = "a hub id, a saved model folder, builtin://tiny-llama or builtin://smollm2-135m-instruct"
DATASET_KINDS = "builtin://arithmetic, a file, a folder or hf://org/name"
STUDENT_KINDS = "a hub id, a path or an OpenAI-compatible URL"


@dataclass(frozen=True)
class EvaluationDataset:
    """The held-out problems of the evaluation after training."""

    source: str | None = None
    """Where the problems come from, in ``dataset.source``'s forms; None = the run's own ``dataset.source``."""
    split: str = EVALUATION["split"]
    """The split evaluated (held out from training)."""


@dataclass(frozen=True)
class EvaluationSettings:
    """run.yaml's ``evaluation``: after training, rank 0 evaluates the trained teacher against the run's student with
    ATLAS's two-pass protocol, under the run's :class:`TeachingSettings` (AtlasTeacher ``spec.evaluation``)."""

    dataset: EvaluationDataset = field(default_factory=EvaluationDataset)
    """The held-out problems."""
    samples: int = EVALUATION["samples"]
    """Student answers per problem, alone and guided (K)."""
    limit: int | None = None
    """Problems evaluated (the first of the split); None = every problem of the split."""

    KEYS = ("dataset", "samples", "limit")

    @classmethod
    def read(cls, reader: FieldReader) -> EvaluationSettings:
        reader.unknown_keys(cls.KEYS)
        dataset = EvaluationDataset()
        section = reader.mapping("dataset", "source, split")
        if section is not None:
            inner = FieldReader(section, reader.path("dataset"), reader.problems)
            inner.unknown_keys(("source", "split"))
            dataset = EvaluationDataset(inner.text("source"), inner.text("split", EVALUATION["split"]))
        return cls(
            dataset=dataset,
            samples=reader.setting("samples", EVALUATION["samples"], (int,), limit="evaluation_samples"),
            limit=reader.setting("limit", None, (int,), limit="evaluation_limit"),
        )

    def source(self, run_source: str) -> str:
        """The problems' source: this one's, else the run's ``dataset.source``."""
        return self.dataset.source or run_source

    def to_dict(self) -> dict[str, Any]:
        dataset = {"source": self.dataset.source} if self.dataset.source is not None else {}
        config: dict[str, Any] = {"dataset": {**dataset, "split": self.dataset.split}, "samples": self.samples}
        if self.limit is not None:
            config["limit"] = self.limit
        return config


@dataclass(frozen=True)
class DatasetConfig:
    """run.yaml's ``dataset``: the training problems. What is None is unset: the trainer's
    ``atlas_core/configs/train.yaml`` gives it (the one statement of those defaults)."""

    source: str
    """builtin://arithmetic, a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, or hf://org/name."""
    split: str | None = None
    """The split trained on."""
    num_samples: int | None = None
    """builtin://arithmetic: how many problems."""
    max_operand: int | None = None
    """builtin://arithmetic: the largest operand."""
    seed: int | None = None
    """builtin://arithmetic: the generator's seed."""
    guided_fraction: float | None = None
    """builtin://arithmetic with algorithm sft: share of tasks shown with teacher guidance."""

    @classmethod
    def read(cls, reader: FieldReader) -> DatasetConfig:
        reader.unknown_keys(_names(cls), listed=", ".join(sorted(_names(cls))))
        knobs = {name: _whole(reader, name, 1 if name == "num_samples" else None) for name in _BUILTIN_KNOBS}
        fraction = reader.raw.get("guided_fraction")
        if fraction is not None and (
            isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1
        ):
            reader.problems.append(f"{reader.path('guided_fraction')}: expected a number in [0, 1], got {fraction!r}")
            fraction = None
        return cls(
            source=reader.text("source", required=DATASET_KINDS) or "",
            split=reader.text("split"),
            guided_fraction=fraction,
            **knobs,
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


_BUILTIN_KNOBS = ("num_samples", "max_operand", "seed")


def _whole(reader: FieldReader, name: str, minimum: int | None) -> int | None:
    value = reader.raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        reader.problems.append(f"{reader.path(name)}: expected a whole number{bound}, got {value!r}")
        return None
    return value


@dataclass(frozen=True)
class RewardConfig:
    """run.yaml's ``reward``: what scores the completions (the policy's for grpo, the student's for teacher)."""

    funcs: tuple[str, ...] = ()
    """Verifiable reward functions by name (atlas_contract.checks.REWARD_FUNCTIONS)."""
    config: str | None = None
    """RIM judges: a reward_system config name or a YAML path; None = none."""
    weights: tuple[float, ...] | None = None
    """One weight per reward (funcs, then RIM); None = all 1.0."""

    @classmethod
    def read(cls, reader: FieldReader) -> RewardConfig:
        reader.unknown_keys(_names(cls), listed=", ".join(sorted(_names(cls))))
        return cls(
            funcs=tuple(_text_list(reader, "funcs") or ()),
            config=reader.text("config"),
            weights=_number_list(reader, "weights"),
        )

    def to_dict(self) -> dict[str, Any]:
        weights = None if self.weights is None else list(self.weights)
        return {"funcs": list(self.funcs), "config": self.config, "weights": weights}


def _text_list(reader: FieldReader, key: str) -> list[str] | None:
    value = reader.raw.get(key)
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return list(value)
    reader.problems.append(f"{reader.path(key)}: expected a list of names, got {bounded_repr(value)}")
    return None


def _number_list(reader: FieldReader, key: str) -> tuple[float, ...] | None:
    """A list (each number's own check is atlas_contract.checks.weight_problems', which the trainer runs)."""
    value = reader.raw.get(key)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(value)
    reader.problems.append(f"{reader.path(key)}: expected a list of numbers, got {bounded_repr(value)}")
    return None


@dataclass(frozen=True)
class OutputSettings:
    """run.yaml's ``output``: where rank 0 exports the trained model when training succeeds (AtlasTraining and
    AtlasTeacher ``spec.output``; atlas_core/sources/export.py)."""

    uri: str
    """``s3://bucket/prefix``, ``pvc://claim/path`` or ``hf://org/name`` (atlas_contract/sources.py)."""
    merge: bool = False
    """A LoRA run: also the adapter merged into the base model (a full run's export is its model either way)."""

    KEYS = ("uri", "merge")

    @classmethod
    def read(cls, reader: FieldReader) -> OutputSettings:
        reader.unknown_keys(cls.KEYS)
        return cls(
            uri=reader.text("uri", "", required="s3://…, pvc://… or hf://…"), merge=bool(reader.raw.get("merge"))
        )

    def to_dict(self) -> dict[str, Any]:
        return {"uri": self.uri, "merge": self.merge}


@dataclass(frozen=True)
class TrackingRecord:
    """run.yaml's ``tracking``: what the operator knows of the run that the tracking run records (its params and
    tags, atlas_contract/tracking.py). Where the runs go is the libraries' own environment (MLFLOW_TRACKING_URI,
    WANDB_PROJECT, …) and TRL's ``report_to``, not this section."""

    params: dict[str, str] = field(default_factory=dict)
    """The spec flattened (``spec.training.learningRate``), the image, the backend, the operator's version."""
    tags: dict[str, str] = field(default_factory=dict)
    """``atlas.namespace``, ``atlas.name``, ``atlas.uid``, ``atlas.kind``."""

    KEYS = ("params", "tags")

    @classmethod
    def read(cls, reader: FieldReader) -> TrackingRecord:
        reader.unknown_keys(cls.KEYS)
        sections = {}
        for key in cls.KEYS:
            value = reader.raw.get(key) or {}
            if not isinstance(value, Mapping):
                reader.problems.append(
                    f"{reader.path(key)}: expected a mapping of names to text, got {bounded_repr(value)}"
                )
                value = {}
            sections[key] = {str(k): str(v) for k, v in value.items()}
        return cls(**sections)

    def to_dict(self) -> dict[str, Any]:
        return {"params": dict(self.params), "tags": dict(self.tags)}


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class RunConfig:
    """The whole of run.yaml. :meth:`to_dict` is the file's content (the operator dumps it as it comes, key order
    included); :meth:`from_dict` reads one back, or any composed trainer configuration."""

    algorithm: str
    """grpo | sft | teacher (GRPO of a teacher whose reward is the frozen student's improvement)."""
    model: str
    """The policy trained (the teacher, for algorithm teacher): a hub id, a path, builtin://tiny-llama."""
    run_name: str
    """The run's name: the metrics' ``run`` label and the default output folder."""
    output_dir: str
    """Where checkpoints, the final model, metrics.jsonl and the evaluation go."""
    dataset: DatasetConfig
    """The training problems."""
    resume: Any = "auto"
    """How a restarted run continues: auto (true), start_over or never (false) (atlas_core/training/resume.py)."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """What scores completions."""
    trainer: dict[str, Any] = field(default_factory=dict)
    """GRPOConfig (grpo, teacher) or SFTConfig (sft) fields, snake_case, as the file states them (the teaching fields
    among them); which fields exist is the trainer's to check (the contract imports no training library)."""
    student: str | None = None
    """algorithm teacher: the frozen student — a hub id, a path, builtin://tiny-llama or an OpenAI-compatible URL."""
    evaluation: EvaluationSettings | None = None
    """algorithm teacher: the evaluation after training; None = none."""
    output: OutputSettings | None = None
    """Where the trained model is exported when training succeeds; None = it stays in ``output_dir`` only."""
    tracking: TrackingRecord | None = None
    """The params and tags of the run's tracking run (a cluster run's spec); None = the trainer's own only."""
    teaching: TeachingSettings | None = field(init=False, compare=False)
    """algorithm teacher: the teaching protocol, read from ``trainer`` (its unstated fields at their defaults); else
    None. Derived, not stored twice: ``trainer`` stays what the file says, so the file round-trips byte for byte."""

    # run.yaml's keys (atlas_core/configs/train.yaml lists the same; teaching is read from trainer).
    KEYS = (
        "algorithm",
        "model",
        "student",
        "run_name",
        "output_dir",
        "resume",
        "evaluation",
        "output",
        "tracking",
        "dataset",
        "reward",
        "trainer",
    )

    def __post_init__(self) -> None:
        teaching = TeachingSettings.from_dict(self.trainer, "trainer") if self.algorithm == "teacher" else None
        object.__setattr__(self, "teaching", teaching)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RunConfig:
        """A parsed run.yaml; :class:`InvalidFields` lists every problem, each under its full path."""
        if not isinstance(raw, Mapping):
            raise InvalidFields([f"run configuration: expected a mapping of settings, got {bounded_repr(raw)}"])
        problems: list[str] = []
        reader = FieldReader(raw, "", problems)
        reader.unknown_keys(cls.KEYS, listed=", ".join(sorted(cls.KEYS)))
        algorithm = raw.get("algorithm")
        if algorithm not in ALGORITHMS:
            problems.append(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {bounded_repr(algorithm)}")
        teacher = algorithm == "teacher"
        fields_read = dict(
            algorithm=algorithm if algorithm in ALGORITHMS else "grpo",
            model=reader.text("model", "", required=MODEL_KINDS),
            run_name=reader.text("run_name", "", required="the run's name"),
            output_dir=reader.text("output_dir", "", required="a folder for checkpoints and the final model"),
            resume=raw.get("resume", "auto"),
            dataset=DatasetConfig.read(_section(reader, "dataset", "source, split")),
            reward=RewardConfig.read(_section(reader, "reward", "funcs, config, weights")),
            trainer=_trainer(reader, teacher),
            student=_student(reader, teacher),
            evaluation=_evaluation(reader, algorithm),
            output=_output(reader),
            tracking=_tracking(reader),
        )
        if problems:
            raise InvalidFields(problems)
        return cls(**fields_read)

    def to_dict(self) -> dict[str, Any]:
        """run.yaml's content; ``from_dict(to_dict())`` is an equal RunConfig."""
        config: dict[str, Any] = {
            "algorithm": self.algorithm,
            "model": self.model,
            "run_name": self.run_name,
            "output_dir": self.output_dir,
            "resume": self.resume,
            "dataset": self.dataset.to_dict(),
            "reward": self.reward.to_dict(),
            "trainer": dict(self.trainer),
        }
        if self.student is not None:
            config["student"] = self.student
        if self.evaluation is not None:
            config["evaluation"] = self.evaluation.to_dict()
        if self.output is not None:
            config["output"] = self.output.to_dict()
        if self.tracking is not None:
            config["tracking"] = self.tracking.to_dict()
        return config

    def evaluation_source(self) -> str | None:
        """Where the evaluation's problems come from (None: no evaluation)."""
        return None if self.evaluation is None else self.evaluation.source(self.dataset.source)


def _section(reader: FieldReader, key: str, shape: str) -> FieldReader:
    """A reader of a nested section (an absent one reads as empty, so its required fields are named)."""
    return FieldReader(reader.mapping(key, shape) or {}, key, reader.problems)


def _trainer(reader: FieldReader, teacher: bool) -> dict[str, Any]:
    """``trainer``, its teaching fields checked for a teacher and its LoRA settings (the trainer checks the others
    against its config)."""
    trainer = dict(reader.mapping("trainer", "GRPOConfig or SFTConfig fields") or {})
    if teacher:
        TeachingSettings.read(FieldReader(trainer, "trainer", reader.problems))
    reader.problems.extend(LoraSettings.parse(trainer.get("lora"), "trainer.lora")[1])
    return trainer


def _student(reader: FieldReader, teacher: bool) -> str | None:
    if teacher and not reader.raw.get("student"):
        reader.problems.append(f"student: required for algorithm teacher ({STUDENT_KINDS})")
        return None
    return reader.text("student")


def _output(reader: FieldReader) -> OutputSettings | None:
    section = reader.raw.get("output")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        reader.problems.append(f"output: expected a mapping (uri, merge) or null, got {bounded_repr(section)}")
        return None
    return OutputSettings.read(FieldReader(section, "output", reader.problems))


def _tracking(reader: FieldReader) -> TrackingRecord | None:
    section = reader.raw.get("tracking")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        reader.problems.append(f"tracking: expected a mapping (params, tags) or null, got {bounded_repr(section)}")
        return None
    return TrackingRecord.read(FieldReader(section, "tracking", reader.problems))


def _evaluation(reader: FieldReader, algorithm: Any) -> EvaluationSettings | None:
    section = reader.raw.get("evaluation")
    if section is None:
        return None
    if not isinstance(section, Mapping):
        shape = ", ".join(EvaluationSettings.KEYS)
        reader.problems.append(f"evaluation: expected a mapping ({shape}) or null, got {bounded_repr(section)}")
        return None
    if algorithm != "teacher":
        reader.problems.append(f"evaluation: only a teacher run evaluates its teaching (algorithm is '{algorithm}')")
    return EvaluationSettings.read(FieldReader(section, "evaluation", reader.problems))
