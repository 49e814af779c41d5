"""The teaching protocol's settings: one definition, read by every part of Atlas that teaches or evaluates.

The operator writes them from an AtlasTeacher's ``spec.teaching`` into run.yaml (under ``trainer``, where they are
GRPOConfig fields: ``atlas_core/training/algorithms/grpo_config.py`` generates its ``TeachingArguments`` from this
class); the teacher trainer, the evaluation after training (``atlas_core/training/finish.py``) and ``atlas eval``
(``atlas_core/cli/eval_plan.py``) run the protocol with a :class:`TeachingSettings`. Defaults are
``atlas_contract.defaults.TEACHING``, ranges ``atlas_contract.defaults.LIMITS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from atlas_contract import checks
from atlas_contract.defaults import TEACHING
from atlas_contract.errors import InvalidFields
from atlas_contract.reading import FieldReader


def _setting(name: str, help: str) -> Any:
    """A teaching field: its default from ``defaults.TEACHING``, its meaning in ``metadata["help"]`` (TRL's form)."""
    return field(default=TEACHING[name], metadata={"help": help})


@dataclass(frozen=True)
class TeachingSettings:
    r"""The adaptive teaching protocol (probe → guidance → student) and its reward.

    Parameters:
        max_probe_tokens (`int`, *optional*, defaults to `50`):
            Token budget of the student's diagnostic probe (its description of its approach).
        max_guidance_tokens (`int`, *optional*, defaults to `200`):
            Token budget of the teacher's guidance; during training the teacher's completions are bounded by
            ``max_completion_length``.
        efficiency_horizon (`float`, *optional*, defaults to `200`):
            Guidance length (tokens) at which the efficiency bonus ``max(0, 1 - L / horizon)`` reaches 0.
        degradation_penalty (`float`, *optional*, defaults to `2`):
            Subtracted from the reward when guidance makes the student worse.
        student_samples (`int`, *optional*, defaults to `2`):
            Student answers per task, with and without guidance: their mean is the score, their agreement the
            diagnostic's confidence (an evaluation's ``samples`` takes its place there).
        student_max_tokens (`int`, *optional*, defaults to `256`):
            Token budget of one student answer.
        student_temperature (`float`, *optional*, defaults to `0.7`):
            Sampling temperature of the student (0 = greedy).
    """

    max_probe_tokens: int = _setting("max_probe_tokens", "Token budget of the student's diagnostic probe.")
    max_guidance_tokens: int = _setting("max_guidance_tokens", "Token budget of the teacher's guidance.")
    efficiency_horizon: float = _setting(
        "efficiency_horizon", "Guidance length (tokens) at which the efficiency bonus reaches 0."
    )
    degradation_penalty: float = _setting(
        "degradation_penalty", "Subtracted from the reward when guidance makes the student worse."
    )
    student_samples: int = _setting("student_samples", "Student answers per task, with and without guidance.")
    student_max_tokens: int = _setting("student_max_tokens", "Token budget of one student answer.")
    student_temperature: float = _setting("student_temperature", "Sampling temperature of the student (0 = greedy).")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], prefix: str = "") -> TeachingSettings:
        """The settings in ``raw`` (absent or null: the default); :class:`InvalidFields` names each wrong one as
        ``<prefix>.<field>: expected …``. Keys that are not teaching fields are left to the caller."""
        problems: list[str] = []
        settings = cls.read(FieldReader(raw, prefix, problems))
        if problems:
            raise InvalidFields(problems)
        return settings

    @classmethod
    def read(cls, reader: FieldReader) -> TeachingSettings:
        """The settings a reader holds, its problems added to the reader's."""
        return cls(**{f.name: reader.setting(f.name, f.default, _kinds(f.name)) for f in fields(cls)})

    @classmethod
    def of(cls, source: Any) -> TeachingSettings:
        """The settings of an object with the same attributes (a GRPOConfig, whose fields are generated from these)."""
        return cls(**{f.name: getattr(source, f.name) for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problems(self, name: Callable[[str], str] = lambda field_name: field_name) -> list[str]:
        """Every value of the wrong kind or out of range, as ``<name(field)>: expected …, got …``."""
        found = []
        for f in fields(self):
            problem = checks.setting_problem(f.name, getattr(self, f.name), _kinds(f.name))
            if problem:
                found.append(f"{name(f.name)}: {problem}")
        return found


TEACHING_FIELDS = tuple(f.name for f in fields(TeachingSettings))


def _kinds(name: str) -> tuple[type, ...]:
    """The kinds of value a field takes: a whole number where its default is one, else any number."""
    return (int,) if isinstance(TEACHING[name], int) else (float,)
