"""Loading and validating a run configuration (the Hydra config tree in ``atlas_core/configs``; on a cluster, the
run.yaml the operator renders), typed by the contract (atlas_contract/run_config.py).

``load_run_config(overrides)`` composes ``train.yaml`` + a recipe + overrides;
``validate_run_config(cfg)`` returns every problem as ``"field: what was expected"``;
``parse_run_config(cfg)`` is the typed run configuration (the contract's ``RunConfig``) the rest reads.
Both raise or return plain data, never print: the CLI decides how to report.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import types
from pathlib import Path
from typing import Any, cast

from omegaconf import MISSING, DictConfig, OmegaConf

from atlas_contract import checks, datasets
from atlas_contract.errors import InvalidFields
from atlas_contract.names import ALGORITHMS
from atlas_contract.run_config import RunConfig
from atlas_contract.teaching import TEACHING_FIELDS
from atlas_contract.text import read_text
from atlas_core.sources import remote_problems

CONFIG_MODULE = "atlas_core.configs"
PRIMARY_CONFIG = "train"


def available_recipes() -> list[str]:
    recipe_dir = Path(__file__).resolve().parent.parent / "configs" / "recipe"
    return sorted(p.stem for p in recipe_dir.glob("*.yaml"))


def trainer_config_class(algorithm: str):
    """SFTConfig for sft, GRPOConfig for grpo and teacher."""
    if algorithm == "sft":
        from atlas_core.training.algorithms.sft import SFTConfig

        return SFTConfig
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    return GRPOConfig


def _trainer_field_names() -> set[str]:
    names: set[str] = set()
    for algorithm in ALGORITHMS:
        names |= {f.name for f in dataclasses.fields(trainer_config_class(algorithm))}
    return names


def _prepare_overrides(overrides: list[str]) -> tuple[list[str], list[str], list[Path]]:
    """Let ``trainer.<field>=v`` name any trainer field (Hydra's struct mode would reject keys the
    YAML does not list), accept ``recipe=<name>`` for ``recipe@_global_=<name>`` and a recipe given as
    a YAML file path; reject malformed or unknown keys with the field named.
    Returns (overrides, problems, recipe files to put on Hydra's search path)."""
    problems, prepared, recipe_files = [], [], []
    trainer_fields = None
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            problems.append(f"{override}: expected key=value")
            continue
        bare = key.lstrip("+~")
        if bare in ("recipe", "recipe@_global_"):
            if value.endswith((".yaml", ".yml")):
                if not Path(value).is_file():
                    problems.append(f"recipe: no such run configuration file '{value}'")
                    continue
                recipe_files.append(Path(value))
                value = _staged_recipe_name(Path(value))  # never shadowed by a bundled recipe of that name
            prepared.append(f"recipe@_global_={value}")
            continue
        if bare.startswith("trainer.") and not key.startswith(("+", "~")):
            trainer_fields = trainer_fields if trainer_fields is not None else _trainer_field_names()
            name = bare.split(".", 2)[1]
            if name not in trainer_fields:
                problems.append(f"{bare}: not a GRPOConfig/SFTConfig field")
                continue
            prepared.append(f"++{bare}={value}")
            continue
        prepared.append(override)
    return prepared, problems, recipe_files


def _staged_recipe_name(path: Path) -> str:
    """A Hydra-safe name for a run file (any file name: spaces, commas, quotes), unique per path."""
    import hashlib
    import re

    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return f"_file_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}_{digest}"


def load_run_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the run configuration; raises :class:`InvalidFields` on unknown recipes or keys.

    ``recipe=<name>`` picks ``atlas_core/configs/recipe/<name>.yaml``; ``recipe=path/to/run.yaml``
    uses that file as the recipe (what ``atlas train FILE.yaml`` and trainer pods do).
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    prepared, problems, recipe_files = _prepare_overrides(list(overrides or []))
    GlobalHydra.instance().clear()
    staging = tempfile.TemporaryDirectory(prefix="atlas-recipe-")
    try:
        if recipe_files:
            # Hydra looks for recipes in <search path>/recipe/<name>.yaml.
            (Path(staging.name) / "recipe").mkdir()
            for recipe_file in recipe_files:  # re-encoded as UTF-8, the only encoding Hydra reads
                staged = Path(staging.name) / "recipe" / f"{_staged_recipe_name(recipe_file)}.yaml"
                staged.write_text(read_text(recipe_file), encoding="utf-8")
            prepared.insert(0, f"hydra.searchpath=[file://{staging.name}]")
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose(config_name=PRIMARY_CONFIG, overrides=prepared)
    except (HydraException, OmegaConfBaseException) as exc:
        problems.append(_explain_hydra_error(exc))  # Hydra stops at its first problem
    finally:
        GlobalHydra.instance().clear()
        staging.cleanup()
    if problems:
        raise InvalidFields(problems)
    return cfg


def _explain_hydra_error(exc: Exception) -> str:
    message = " ".join(str(exc).split())
    if "recipe" in message and ("Could not find" in message or "not found" in message):
        return f"recipe: unknown recipe (available: {', '.join(available_recipes())})"
    if "Could not override" in message or "not in struct" in message or "Key '" in message:
        # "Could not override 'foo'. ... Key 'foo' is not in struct"
        key = message.split("'")[1] if "'" in message else message
        return f"{key}: unknown configuration key (use trainer.<field> for trainer settings)"
    return f"configuration: {message}"


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    return cast(dict[str, Any], OmegaConf.to_container(cfg.trainer, resolve=True)) or {}  # a mapping: trainer.*


def world_size() -> int:
    """Processes in this run (accelerate/torchrun set WORLD_SIZE); 1 when launched plainly."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def parse_run_config(cfg: DictConfig) -> RunConfig:
    """The composed configuration as the contract types it (atlas_contract/run_config.py): the boundary past which
    the trainer reads typed settings. Raises :class:`InvalidFields` with every problem the contract finds."""
    return RunConfig.from_dict(_plain(OmegaConf.to_container(cfg, resolve=True)))


def _plain(value: Any) -> Any:
    """Hydra's ``???`` (a required value left unset) as None, which the contract reports as required."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return None if value == MISSING else value


def validate_run_config(cfg: DictConfig) -> list[str]:
    """Every problem of ``cfg``, as ``"field: expected …, got …"``; empty when it can run: the contract's (each
    section's keys, kinds and ranges, the teaching settings), then what needs this side's libraries and files."""
    if cfg.algorithm not in ALGORITHMS:
        return [f"algorithm: expected one of {', '.join(ALGORITHMS)}, got '{cfg.algorithm}'"]
    try:
        run, problems = parse_run_config(cfg), []
    except InvalidFields as invalid:
        run, problems = None, list(invalid.problems)
    if not OmegaConf.is_missing(cfg, "model"):
        problems += _model_problems(str(cfg.model))
    if not OmegaConf.is_missing(cfg.dataset, "source"):
        remote = remote_problems(str(cfg.dataset.source), "dataset.source", "the dataset")
        if remote is None:
            remote = datasets.dataset_problems(str(cfg.dataset.source), str(cfg.dataset.get("split")), cfg.algorithm)
        problems += remote
    problems += _output_dir_problems(str(cfg.output_dir))

    from atlas_core.training.resume import resume_policy

    try:
        resume_policy(cfg.get("resume", "auto"))
    except InvalidFields as invalid:
        problems += invalid.problems
    problems += _trainer_problems(cfg)
    if cfg.algorithm == "teacher" and cfg.get("student") and not str(cfg.student).startswith(("http://", "https://")):
        problems += _model_problems(str(cfg.student), field="student")
    if run is not None:
        from atlas_core.training.finish import evaluation_dataset_problems

        problems += evaluation_dataset_problems(run)
    return problems + _reward_problems(cfg)


def _trainer_problems(cfg: DictConfig) -> list[str]:
    """Trainer fields the algorithm's config does not have, and values of the wrong kind or range; then (GRPO)
    TRL's generation-batch rule. A teacher's teaching fields are the contract's to check (TeachingSettings)."""
    kwargs = trainer_kwargs(cfg)
    config_class = trainer_config_class(cfg.algorithm)
    known = {f.name for f in dataclasses.fields(config_class)}
    problems = [f"trainer.{name}: not a {config_class.__name__} field" for name in sorted(set(kwargs) - known)]
    checked = {k: v for k, v in kwargs.items() if cfg.algorithm != "teacher" or k not in TEACHING_FIELDS}
    value_problems = _trainer_value_problems(checked, config_class)
    problems += value_problems
    if cfg.algorithm in ("grpo", "teacher") and not value_problems:  # the batch rule needs whole numbers
        problems += _batch_problems(kwargs)
    return problems


def _reward_problems(cfg: DictConfig) -> list[str]:
    """Reward names, weights and the RIM config (GRPO and teacher: SFT has no reward)."""
    if cfg.algorithm not in ("grpo", "teacher"):
        return []
    problems = []
    funcs = list(cfg.reward.funcs or [])
    rim = cfg.reward.get("config")
    if not funcs and not rim and cfg.algorithm == "grpo":
        problems.append("reward.funcs: expected at least one reward function (or a RIM reward.config)")
    weights = None if cfg.reward.weights is None else list(cfg.reward.weights)
    problems += checks.reward_problems(funcs, bool(rim), weights, name=lambda field: f"reward.{field}")
    if rim:
        from atlas_core.reward.config import RIMConfigError, load_rim_config

        try:
            load_rim_config(str(rim))
        except RIMConfigError as exc:
            problems.append(f"reward.config: {exc}")
    return problems


def _model_problems(model: str, field: str = "model") -> list[str]:
    remote = remote_problems(model, field, "the model's folder")  # s3://, pvc://, hf:// (atlas_core/sources)
    if remote is not None:
        return remote
    return checks.model_problems(model, field, builtins=checks.BUILTIN_MODELS)


def _output_dir_problems(output_dir: str) -> list[str]:
    """Where checkpoints go must be a folder this process can create and write."""
    path = Path(os.path.expanduser(output_dir))
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return []
    if existing != path and not existing.is_dir():
        return [f"output_dir: '{output_dir}' cannot be created: '{existing}' is a file"]
    if existing == path and not path.is_dir():
        return [f"output_dir: '{output_dir}' is a file; expected a folder (checkpoints, final model, metrics)"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"output_dir: '{existing}' is not writable"]
    return []


def _trainer_value_problems(kwargs: dict[str, Any], config_class) -> list[str]:
    """Every trainer value of the wrong kind (by the field's type), not finite, or outside its range
    (atlas_contract.defaults.LIMITS), before anything is built: ``trainer.<field>: expected …``."""
    problems = []
    for f in dataclasses.fields(config_class):
        if f.name not in kwargs or (kwargs[f.name] == f.default and type(kwargs[f.name]) is type(f.default)):
            continue  # absent, or the trainer's own default (max_steps -1 = "not set")
        accepted = _accepted_kinds(f)
        problem = checks.setting_problem(f.name, kwargs[f.name], accepted) if accepted else None
        if problem:
            problems.append(f"trainer.{f.name}: {problem}")
    return problems


def _accepted_kinds(f: dataclasses.Field) -> tuple | None:
    """The kinds of value a config field takes, from its annotation (None: too rich to check here)."""
    import enum
    import typing

    annotation = f.type
    if isinstance(annotation, str):  # a postponed annotation: judge by the default instead
        return (type(f.default),) if f.default not in (None, dataclasses.MISSING) else None
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    kinds = []
    for member in members or (annotation,):
        member = typing.get_origin(member) or member
        if member in (bool, int, float, str, list, dict, type(None)) or (
            isinstance(member, type) and issubclass(member, enum.Enum)
        ):
            kinds.append(member)
        else:
            return None
    return tuple(kinds)


def _batch_problems(kwargs: dict[str, Any]) -> list[str]:
    """GRPO needs whole prompt groups in every generation batch (TRL's rule, atlas_contract.checks). Called
    once the values passed :func:`_trainer_value_problems` (whole numbers in range)."""
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    values = {
        name: kwargs.get(name, defaults[name])
        for name in ("per_device_train_batch_size", "num_generations", "gradient_accumulation_steps")
    }
    problem = checks.generation_batch_problem(
        values["num_generations"],
        values["per_device_train_batch_size"],
        world_size(),
        values["gradient_accumulation_steps"],
        steps_per_generation=kwargs.get("steps_per_generation"),
        generation_batch_size=kwargs.get("generation_batch_size"),
        name=lambda field: f"trainer.{field}",
    )
    return [problem] if problem else []
