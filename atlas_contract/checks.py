"""Checks both halves apply, in plain Python: the operator when it validates a spec, the trainer when it loads a run.
(The CRDs' CEL rules are the operator's: atlas_operator/cel_rules.py.)

Each check takes plain values and a ``name`` function that spells a field the way the caller's user
wrote it (``spec.training.numGenerations`` for a manifest, ``trainer.num_generations`` for a run
configuration, ``num_generations`` for a GRPOConfig), so the messages name the field the user can fix.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atlas_contract.names import ENV_REWARD_SYSTEM_DIR, REWARD_SYSTEM_DIR
from atlas_contract.text import bounded_repr


def _same(name: str) -> str:
    return name


# ------------------------------------------------------------------ TRL's generation batch


def generation_batch_size_of(
    per_device_train_batch_size: int,
    processes: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int | None = None,
    generation_batch_size: int | None = None,
) -> int:
    """Completions per generation batch, as TRL derives it: an explicit ``generation_batch_size``, else
    per-device batch x processes x ``steps_per_generation`` (which defaults to the accumulation steps)."""
    if generation_batch_size:
        return int(generation_batch_size)
    steps = steps_per_generation or gradient_accumulation_steps
    return per_device_train_batch_size * processes * int(steps)


def generation_batch_problem(
    num_generations: int,
    per_device_train_batch_size: int,
    processes: int,
    gradient_accumulation_steps: int,
    steps_per_generation: int | None = None,
    generation_batch_size: int | None = None,
    name: Callable[[str], str] = _same,
) -> str | None:
    """TRL's rule: every generation batch holds whole groups of ``num_generations`` completions (and a
    group compares at least two). None when it holds."""
    if num_generations < 2:
        return f"{name('num_generations')}: expected at least 2 (GRPO compares completions), got {num_generations}"
    batch = generation_batch_size_of(
        per_device_train_batch_size, processes, gradient_accumulation_steps, steps_per_generation, generation_batch_size
    )
    if batch % num_generations == 0:
        return None

    def short(field: str) -> str:  # the headline names the field in full; the explanation by its last part
        return name(field).rsplit(".", 1)[-1]

    if generation_batch_size:
        how = f"{short('generation_batch_size')} {batch}"
    else:
        steps_field = "steps_per_generation" if steps_per_generation else "gradient_accumulation_steps"
        how = (
            f"{short('per_device_train_batch_size')} {per_device_train_batch_size} x {processes} processes x "
            f"{short(steps_field)} {steps_per_generation or gradient_accumulation_steps}"
        )
    return (
        f"{name('num_generations')}: {num_generations} does not divide the generation batch of {batch} "
        f"completions ({how})"
    )


# ------------------------------------------------------------------ rewards

REWARD_FUNCTIONS = ("exact_match", "boxed_format")  # verifiable rewards by name (atlas_core.answers)


def reward_config_dirs() -> list[Path]:
    """Where a named RIM config (``interpretation``) is looked up: ``$ATLAS_REWARD_SYSTEM_DIR``,
    ``./reward_system``, then the bundled configs (the ``reward_system`` package's data)."""
    dirs = []
    if os.environ.get(ENV_REWARD_SYSTEM_DIR):
        dirs.append(Path(os.environ[ENV_REWARD_SYSTEM_DIR]))
    dirs.append(Path.cwd() / REWARD_SYSTEM_DIR)
    dirs.append(bundled_reward_dir())
    return dirs


def bundled_reward_dir() -> Path:
    """The bundled configs: the ``reward_system`` package's data, in the source tree or an installed wheel."""
    import importlib.resources

    return Path(str(importlib.resources.files(REWARD_SYSTEM_DIR)))


@functools.cache  # the bundled folder does not change while a process runs
def bundled_reward_configs() -> tuple[str, ...]:
    """Names of the RIM configs shipped in ``reward_system/`` (what ``spec.reward.config`` accepts)."""
    return tuple(sorted(p.stem for p in bundled_reward_dir().glob("*.yaml")))


def find_reward_config(config: str | os.PathLike[str]) -> Path | None:
    """A YAML path, or a name looked up in :func:`reward_config_dirs`; None when there is none."""
    path = Path(config)
    if path.is_file():
        return path
    name = path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml"
    for directory in reward_config_dirs():
        if (directory / name).is_file():
            return directory / name
    return None


def reward_problems(
    funcs: list[str], judges: bool, weights: list[float] | None, name: Callable[[str], str] = _same
) -> list[str]:
    """Unknown reward names, a weight that is not a finite number, and a weight count that is not one per
    function plus one for RIM."""
    problems = [
        f"{name('funcs')}: unknown reward {func!r} (available: {', '.join(REWARD_FUNCTIONS)})"
        for func in funcs
        if func not in REWARD_FUNCTIONS
    ]
    expected = len(funcs) + (1 if judges else 0)
    problems += weight_problems(weights, name)
    if weights is not None and len(weights) != expected:
        problems.append(
            f"{name('weights')}: expected {expected} weights (one per reward function, then RIM), got {len(weights)}"
        )
    return problems


def weight_problems(weights: list[float] | None, name: Callable[[str], str] = _same) -> list[str]:
    """A reward weight that is not a finite number (nan or inf would score every completion nan or 0: refused, not
    trained on). Not a CEL rule: JSON carries no nan or inf, so only a local file or the CLI can hold one."""
    problems = []
    for index, weight in enumerate(weights or []):
        problem = setting_problem("reward_weight", weight, (float,))
        if problem:
            problems.append(f"{name('weights')}[{index}]: {problem}")
    return problems


# ------------------------------------------------------------------ vLLM servers

#: Why a vLLM server runs one data-parallel rank: TRL 1.16 (trl/scripts/vllm_serve.py) says
#: ``--data-parallel-size`` > 1 "is not supported/useful and will error out" for dense models (vLLM PR #30739).
DATA_PARALLEL_REASON = "vllm serve --data-parallel-size > 1 errors out for dense models (TRL 1.16, vLLM PR #30739)"


# ------------------------------------------------------------------ model references

BUILTIN_SCHEME = "builtin://"
TINY_MODEL_URI = "builtin://tiny-llama"  # built here (atlas_core/models/tiny.py)
SMOLLM2_MODEL_URI = "builtin://smollm2-135m-instruct"  # a real chat model from a wheel (atlas_core/models/smollm2.py)
BUILTIN_MODELS = (TINY_MODEL_URI, SMOLLM2_MODEL_URI)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def model_reference(ref: str) -> str:
    """What a model reference names: ``builtin`` (``builtin://…``), ``endpoint`` (an OpenAI-compatible
    ``http(s)://…/v1``), ``path`` (absolute, ``./``, ``../``, ``~``, anything on disk, anything that
    cannot be a hub id) or ``hub`` (``org/name`` or ``name``, resolved when the model loads)."""
    if ref.startswith(BUILTIN_SCHEME):
        return "builtin"
    if ref.startswith(("http://", "https://")):
        return "endpoint"
    if ref.startswith(("/", "./", "../", "~")) or os.path.exists(os.path.expanduser(ref)):
        return "path"
    return "hub" if _HUB_ID.fullmatch(ref) else "path"


def model_problems(ref: str, field: str = "model", builtins: tuple[str, ...] = ()) -> list[str]:
    """Problems of a model reference that can be checked here: a local folder that is missing or not
    a saved model, an unknown builtin, a malformed ``s3://``/``pvc://``/``hf://`` URI (atlas_contract/sources.py).
    Hub ids, endpoints and what a URI holds are checked when they are used."""
    from atlas_contract import sources

    if ref.startswith((sources.S3_SCHEME, sources.PVC_SCHEME, sources.HUB_SCHEME)):
        return sources.uri_problems(ref, field)
    kind = model_reference(ref)
    if kind == "builtin":
        if builtins and ref not in builtins:
            return [f"{field}: unknown builtin model {ref!r} (available: {', '.join(builtins)})"]
        return []
    if kind != "path":
        return []
    path = Path(os.path.expanduser(ref))
    if not path.exists():
        return [f"{field}: '{ref}' does not exist (expected a folder saved with save_pretrained or a hub id org/name)"]
    if not path.is_dir():
        return [f"{field}: '{ref}' is a file; expected a folder saved with save_pretrained"]
    if not os.access(path, os.R_OK | os.X_OK):
        return [f"{field}: '{ref}' is not readable"]
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():  # a model, a LoRA adapter
        return [f"{field}: '{ref}' has no config.json; expected a folder saved with save_pretrained"]
    return []


# ------------------------------------------------------------------ trainer settings


def setting_problem(name: str, value: Any, accepted: tuple[Any, ...]) -> str | None:
    """What is wrong with ``value`` for setting ``name`` (None: nothing), as ``expected …, got …``: none of
    the ``accepted`` kinds (bool, int, float, str, list, dict, an Enum class, ``type(None)``), a number that
    is not finite, or outside :data:`atlas_contract.defaults.LIMITS`."""
    import enum
    import math

    from atlas_contract.defaults import LIMITS

    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    for kind in accepted:
        if kind is float and number and not math.isfinite(value):
            return f"expected a finite number, got {bounded_repr(value)}"
        if (
            (kind is bool and isinstance(value, bool))
            or (kind is int and isinstance(value, int) and not isinstance(value, bool))
            or (kind is float and number)
            or (kind in (str, list, dict) and isinstance(value, kind))
            or (kind is type(None) and value is None)
            or (isinstance(kind, type) and issubclass(kind, enum.Enum) and isinstance(value, (str, kind)))
        ):
            limit_problem = LIMITS[name].problem(value) if number and name in LIMITS else None
            return f"{limit_problem}, got {bounded_repr(value)}" if limit_problem else None
    described = [_KIND_NAMES.get(k, "a string") for k in accepted if k is not type(None)]
    return f"expected {' or '.join(dict.fromkeys(described))}, got {bounded_repr(value)}"


_KIND_NAMES = {
    bool: "true or false",
    int: "a whole number",
    float: "a finite number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
