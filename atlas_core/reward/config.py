"""RIM configuration: which judges, which models, how to sample, escalate and combine.

Loaded from ``reward_system/<name>.yaml`` (every key documented there). Validation happens at
construction and names the key: ``RIMConfigError("small_model.model: required")``.
String values may use ``${VAR}`` / ``${VAR:-default}`` to read the environment (in-cluster
endpoint addresses); API keys are never in the file, only the *name* of the variable holding one.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from atlas_contract import checks
from atlas_core.openai_calls import RetryPolicy

KNOWN_JUDGES = ("accuracy", "helpfulness", "process", "diagnostic")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
#: The numeric settings: (low, high or None, whole number?). Their defaults are RIMConfig's.
_NUMBER_RANGES: dict[str, tuple[float, float | None, bool]] = {
    "variance_threshold": (0.0, 1.0, False),
    "uncertainty_threshold": (0.0, 1.0, False),
    "max_concurrency": (1, None, True),
    "timeout_s": (0.001, None, False),
    "retries": (0, None, True),
    "backoff_s": (0.0, None, False),
    "max_tokens": (1, None, True),
    "fallback_score": (0.0, 1.0, False),
}
_TOP_LEVEL_KEYS = {"judges", "small_model", "large_model", "temperatures", "weights", *_NUMBER_RANGES}


class RIMConfigError(ValueError):
    """A RIM configuration that cannot be used; the message names every bad key."""


@dataclass(frozen=True)
class ModelEndpoint:
    """One judge model.

    ``backend: openai`` (default) calls an OpenAI-compatible chat-completions endpoint at
    ``base_url`` (vLLM ``/v1``, a hosted API); ``backend: transformers`` runs ``model`` (a local
    path, ``builtin://tiny-llama``) in-process, for offline use. ``api_key_env`` names the
    environment variable that holds the API key (in a cluster: from a Secret); ``None`` sends none.
    """

    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    backend: str = "openai"

    def api_key(self) -> str:
        """The key, read when needed and never stored in the config or shown in its repr."""
        if not self.api_key_env:
            return "EMPTY"  # vLLM without --api-key accepts any value; the client requires one
        return os.environ.get(self.api_key_env, "")


@dataclass(frozen=True)
class RIMConfig:
    """Parsed, validated RIM configuration (see ``reward_system/interpretation.yaml``)."""

    judges: tuple[str, ...]
    small_model: ModelEndpoint
    large_model: ModelEndpoint
    temperatures: tuple[float, ...] = (0.2, 0.5, 0.8)
    variance_threshold: float = 0.15
    uncertainty_threshold: float = 0.3
    max_concurrency: int = 16
    timeout_s: float = 30.0
    retries: int = 2
    backoff_s: float = 1.0
    max_tokens: int = 512
    weights: dict[str, float] = field(default_factory=dict)
    fallback_score: float = 0.0
    source: str = "<dict>"

    def retry_policy(self) -> RetryPolicy:
        """The shared policy (:class:`~atlas_core.openai_calls.RetryPolicy`) with ``retries + 1``
        attempts and ``backoff_s`` as the first wait; its other values are the defaults."""
        return RetryPolicy(
            attempts=self.retries + 1,
            base_delay_s=self.backoff_s,
            max_delay_s=max(RetryPolicy.max_delay_s, self.backoff_s),
        )


def expand_env(value: Any) -> Any:
    """``${VAR}`` and ``${VAR:-default}`` in strings, recursively."""
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: os.environ.get(m.group(1), m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def _expand_except_key_names(section: Any) -> Any:
    if not isinstance(section, dict):
        return expand_env(section)
    return {k: v if k == "api_key_env" else expand_env(v) for k, v in section.items()}


def _number(raw: dict, key: str, default: float, problems: list[str], low=None, high=None, integer=False):
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        problems.append(f"{key}: expected a number, got {value!r}")
        return default
    if integer and int(value) != value:
        problems.append(f"{key}: expected a whole number, got {value!r}")
        return default
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        problems.append(f"{key}: expected a value in {bounds}, got {value!r}")
        return default
    return int(value) if integer else float(value)


def _judges(raw: dict, problems: list[str]) -> list[str]:
    judges = raw.get("judges")
    if not isinstance(judges, list) or not judges:
        problems.append(f"judges: required, a list of some of {', '.join(KNOWN_JUDGES)}")
        judges = []
    for i, judge in enumerate(judges):
        if not isinstance(judge, str) or judge not in KNOWN_JUDGES:
            problems.append(f"judges[{i}]: unknown judge {judge!r} (known: {', '.join(KNOWN_JUDGES)})")
    judges = [j for j in judges if isinstance(j, str)]
    if len(set(judges)) != len(judges):
        problems.append("judges: each judge may appear once")
    return judges


def _weights(raw: dict, judges: list[str], problems: list[str]) -> dict[str, float]:
    weights = raw.get("weights") or {}
    if not isinstance(weights, dict):
        problems.append(f"weights: expected a mapping judge -> weight, got {weights!r}")
        return {}
    for judge, weight in weights.items():
        if judge not in judges:
            problems.append(f"weights.{judge}: not one of the configured judges")
        elif (
            isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0
        ):
            problems.append(f"weights.{judge}: expected a finite number >= 0, got {weight!r}")
    if judges and weights and all(weights.get(j, 1.0) == 0 for j in judges):
        problems.append("weights: at least one judge needs a weight above 0")
    return {str(k): float(v) for k, v in weights.items() if isinstance(v, (int, float))}


def _endpoint(raw: dict, key: str, problems: list[str]) -> ModelEndpoint:
    section = raw.get(key)
    if not isinstance(section, dict):
        problems.append(f"{key}: required, a mapping with model, base_url, api_key_env")
        return ModelEndpoint(model="")
    unknown = set(section) - {"model", "base_url", "api_key_env", "backend"}
    for name in sorted(unknown):
        problems.append(f"{key}.{name}: unknown key (expected model, base_url, api_key_env, backend)")
    model = section.get("model")
    if not isinstance(model, str) or not model.strip():
        problems.append(f"{key}.model: required (a model name or path)")
        model = ""
    backend = section.get("backend", "openai")
    if backend not in ("openai", "transformers"):
        problems.append(f"{key}.backend: expected openai or transformers, got {backend!r}")
    base_url = section.get("base_url") or None
    if backend == "openai" and not base_url:
        problems.append(f"{key}.base_url: required for the openai backend (an OpenAI-compatible /v1 URL)")
    api_key_env = section.get("api_key_env") or None
    if api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(api_key_env)):
        # the value is not shown: a misplaced key must not end up in an error message
        problems.append(f"{key}.api_key_env: expected the name of an environment variable (like OPENAI_API_KEY)")
    return ModelEndpoint(model=model, base_url=base_url, api_key_env=api_key_env, backend=backend)


def parse_rim_config(raw: Any, source: str = "<dict>") -> RIMConfig:
    """Validate a loaded YAML mapping; raises RIMConfigError listing every problem."""
    if not isinstance(raw, dict):
        raise RIMConfigError(f"{source}: expected a mapping of RIM settings")
    # ${...} references are expanded everywhere except api_key_env, which names a variable and must never
    # be replaced by (and then echoed as) the secret it holds.
    raw = {
        k: _expand_except_key_names(v) if k in ("small_model", "large_model") else expand_env(v) for k, v in raw.items()
    }
    problems: list[str] = [f"{k}: unknown key" for k in sorted(set(raw) - _TOP_LEVEL_KEYS)]
    judges = _judges(raw, problems)
    defaults = RIMConfig(judges=(), small_model=ModelEndpoint(""), large_model=ModelEndpoint(""))
    temperatures = raw.get("temperatures", list(defaults.temperatures))
    if (
        not isinstance(temperatures, list)
        or not temperatures
        or not all(isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t <= 2 for t in temperatures)
    ):
        problems.append(f"temperatures: expected a non-empty list of numbers in [0, 2], got {temperatures!r}")
        temperatures = defaults.temperatures
    numbers = {
        key: _number(raw, key, getattr(defaults, key), problems, low, high, integer)
        for key, (low, high, integer) in _NUMBER_RANGES.items()
    }
    config = RIMConfig(
        judges=tuple(judges),
        small_model=_endpoint(raw, "small_model", problems),
        large_model=_endpoint(raw, "large_model", problems),
        temperatures=tuple(float(t) for t in temperatures),
        weights=_weights(raw, judges, problems),
        source=source,
        **numbers,
    )
    if problems:
        raise RIMConfigError(f"{source}: " + "; ".join(problems))
    return config


def reward_system_dirs() -> list[Path]:
    """Where named configs are looked up (:func:`atlas_contract.checks.reward_config_dirs`)."""
    return checks.reward_config_dirs()


def resolve_config_path(config: str | os.PathLike) -> Path:
    """A path to a YAML file, or a name (``interpretation``) looked up in :func:`reward_system_dirs`."""
    path = checks.find_reward_config(config)
    if path is None:
        raise RIMConfigError(
            f"config_path: no RIM config {str(config)!r} (looked in {', '.join(str(d) for d in reward_system_dirs())})"
        )
    return path


def load_rim_config(config: str | os.PathLike) -> RIMConfig:
    path = resolve_config_path(config)
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RIMConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    return parse_rim_config(raw, source=str(path))
