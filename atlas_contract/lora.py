"""LoRA settings, one statement for every reader: ``spec.training.lora`` (the operator's CRD and CEL), run.yaml's
``trainer.lora`` and the trainers' ``GRPOConfig.lora`` / ``SFTConfig.lora`` (atlas_core/training/lora.py turns them
into PEFT's ``LoraConfig``, handed to TRL as ``peft_config``).

``{r, alpha, dropout, target_modules}``; unset keys take :data:`atlas_contract.defaults.LORA`. ``target_modules`` is
``all-linear`` (every linear layer but the output head, PEFT's meaning) or a list of module names, each matching a
module whose name is it or ends with ``.<it>`` (PEFT's rule for a list).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atlas_contract.defaults import LIMITS, LORA
from atlas_contract.text import bounded_repr

ALL_LINEAR = "all-linear"
KEYS = ("r", "alpha", "dropout", "target_modules")
MAX_TARGET_MODULES = 64


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's shape: rank, scale (alpha / r), dropout and the layers it adapts."""

    r: int = LORA["r"]
    """The adapter's rank (>= 1)."""
    alpha: float = LORA["alpha"]
    """Its scale is alpha / r (> 0)."""
    dropout: float = LORA["dropout"]
    """Dropout on the adapter's input, in [0, 1)."""
    target_modules: str | tuple[str, ...] = LORA["target_modules"]
    """``all-linear``, or the names of the modules adapted."""

    @classmethod
    def parse(cls, raw: Any, path: str = "lora") -> tuple[LoraSettings | None, list[str]]:
        """(settings, problems) from a mapping (None: no LoRA); each problem under ``path.<key>``."""
        if raw is None:
            return None, []
        if isinstance(raw, LoraSettings):
            return raw, []
        if not isinstance(raw, Mapping):
            return None, [f"{path}: expected a mapping ({', '.join(KEYS)}) or null, got {bounded_repr(raw)}"]
        problems = [
            f"{path}.{key}: unknown setting (expected one of: {', '.join(KEYS)})" for key in raw if key not in KEYS
        ]
        r = _number(raw, "r", path, problems, whole=True)
        alpha = _number(raw, "alpha", path, problems)
        dropout = _number(raw, "dropout", path, problems)
        targets = _targets(raw.get("target_modules", LORA["target_modules"]), f"{path}.target_modules", problems)
        if problems:
            return None, problems
        return cls(r=int(r), alpha=float(alpha), dropout=float(dropout), target_modules=targets), []

    def to_dict(self) -> dict[str, Any]:
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return {"r": self.r, "alpha": self.alpha, "dropout": self.dropout, "target_modules": targets}


def _number(raw: Mapping[str, Any], key: str, path: str, problems: list[str], whole: bool = False) -> float:
    default: float = LORA[key]
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not float(value).is_integer()):
        problems.append(f"{path}.{key}: expected a {'whole ' if whole else ''}number, got {bounded_repr(value)}")
        return default
    limit = LIMITS[f"lora_{key}"].problem(value)
    if limit:
        problems.append(f"{path}.{key}: {limit}, got {bounded_repr(value)}")
    return value


def _targets(value: Any, path: str, problems: list[str]) -> str | tuple[str, ...]:
    # The CRD's field is a list (a schema cannot say "a string or a list"): [all-linear] is all-linear.
    if value == ALL_LINEAR or (isinstance(value, (list, tuple)) and list(value) == [ALL_LINEAR]):
        return ALL_LINEAR
    if isinstance(value, (list, tuple)) and ALL_LINEAR in value:
        problems.append(f"{path}: '{ALL_LINEAR}' stands alone (it already names every linear layer), got {list(value)}")
        return ALL_LINEAR
    if isinstance(value, str):  # one name, as PEFT also takes it
        value = [value]
    if (
        isinstance(value, (list, tuple))
        and value
        and len(value) <= MAX_TARGET_MODULES
        and all(isinstance(item, str) and item.strip() for item in value)
    ):
        return tuple(value)
    problems.append(
        f"{path}: expected '{ALL_LINEAR}' or a list of 1 to {MAX_TARGET_MODULES} module names, "
        f"got {bounded_repr(value)}"
    )
    return ALL_LINEAR
