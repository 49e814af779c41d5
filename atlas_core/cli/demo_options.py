"""How big ``atlas demo`` is: its stages' steps and the evaluation's problems, with their defaults.

A module of its own, without torch or transformers, so ``atlas``'s parser can state the defaults
(``atlas demo --help``) from the same dataclass that ``run_demo`` and ``bench/teaching_eval.py`` take.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DemoSize:
    """The demo's size. The defaults are the full demo, whose figures ``bench/teaching_eval.py`` checks
    against the ATLAS targets (about 5 minutes on 2 cores); smaller sizes run the same stages faster."""

    sft_steps: int = 800
    """The student's SFT warm-up on ``builtin://multistep``."""
    grpo_steps: int = 200
    """GRPO of the warmed-up student (the ``grpo`` stage)."""
    teacher_sft_steps: int = 550
    """The teacher's warm-up on demonstrations of mixed quality (they are long: the prompt holds the template)."""
    teacher_steps: int = 150
    """Teacher GRPO against the frozen, greedy student."""
    eval_problems: int = 200
    """Held-out problems (``builtin://multistep``'s test split) each teacher is evaluated on."""


#: The seed of every training stage (sampling, data order) and of the evaluation's sampling; the held-out problems
#: and the tiny model's initialisation stay the same, so seeds show how far the figures move with training noise.
DEMO_SEED = 0


#: field -> (flag, help) of each size option; ``--steps`` keeps its name from the first demo.
_FLAGS = {
    "sft_steps": ("--sft-steps", "student SFT warm-up steps"),
    "grpo_steps": ("--steps", "GRPO steps"),
    "teacher_sft_steps": ("--teacher-sft-steps", "teacher warm-up (SFT) steps"),
    "teacher_steps": ("--teacher-steps", "teacher GRPO steps"),
    "eval_problems": ("--eval-problems", "held-out problems in the teaching evaluation"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = DemoSize()
    for field in fields(DemoSize):
        flag, text = _FLAGS[field.name]
        default = getattr(defaults, field.name)
        parser.add_argument(flag, dest=field.name, type=_positive, default=default, help=f"{text} (default {default})")
    parser.add_argument(
        "--seed",
        type=int,
        default=DEMO_SEED,
        help=f"seed of the training stages and the evaluation (default {DEMO_SEED})",
    )


def size_of(args: argparse.Namespace) -> DemoSize:
    return DemoSize(**{field.name: getattr(args, field.name) for field in fields(DemoSize)})


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number ≥ 1, got {value}")
    return value
