"""The bundled verifiable task: synthetic arithmetic, scored by exact match (atlas_core.answers).

Rows are ``{"prompt": [chat messages], "question": "3 + 4", "ground_truth": "7"}`` so that TRL passes
``ground_truth`` to reward functions as a keyword argument.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from atlas_core.answers import SYSTEM_HINT

SPLITS = ("train", "test")
#: Share of the distinct problems held out in ``test`` (by a hash of the problem, see :func:`split_of`).
TEST_SHARE = 0.2
_SALT = "atlas-arithmetic-v1"


def split_of(question: str) -> str:
    """``test`` or ``train``: a stable hash of the problem's text (``3 + 4``), so a problem has one split forever
    and no test problem is ever trained on."""
    digest = hashlib.sha256(f"{_SALT}:{question}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < TEST_SHARE else "train"


def make_arithmetic_dataset(
    n: int,
    seed: int = 0,
    max_operand: int = 9,
    operations: tuple[str, ...] = ("+",),
    split: str | None = None,
) -> list[dict[str, Any]]:
    """``n`` problems ``a <op> b`` with operands in ``[0, max_operand]``; deterministic in ``seed``. ``split``
    (train | test) draws only that split's problems (:func:`split_of`); None draws from all of them."""
    if n < 1:
        raise ValueError(f"n: expected a positive number of problems, got {n}")
    unknown = set(operations) - {"+", "-", "*"}
    if unknown:
        raise ValueError(f"operations: expected some of '+', '-', '*', got {sorted(unknown)}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    if split is not None and not _split_has_problems(split, max_operand, operations):
        raise ValueError(f"split: no problem with operands up to {max_operand} falls in the {split} split")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    while len(rows) < n:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
        op = rng.choice(operations)
        if split is not None and split_of(f"{a} {op} {b}") != split:
            continue
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} {op} {b}? {SYSTEM_HINT}"}],
                "question": f"{a} {op} {b}",
                "ground_truth": str(value),
            }
        )
    return rows


def _split_has_problems(split: str, max_operand: int, operations: tuple[str, ...]) -> bool:
    """Whether any problem of these operands falls in ``split`` (a large space always has both splits)."""
    if (max_operand + 1) ** 2 * len(operations) > 10_000:
        return True
    values = range(max_operand + 1)
    return any(split_of(f"{a} {op} {b}") == split for a in values for op in operations for b in values)


def solution_text(row: dict[str, Any]) -> str:
    """A worked answer in the format the reward reads, used as the SFT warm-up target."""
    return f"{row['question']} = {row['ground_truth']}. \\boxed{{{row['ground_truth']}}}"


def guidance_text(row: dict[str, Any]) -> str:
    """Teacher-style guidance for a problem that explains the method without stating the answer."""
    a, op, b = row["question"].split()
    method = {
        "+": f"start at {a} and count up {b}",
        "-": f"start at {a} and count down {b}",
        "*": f"add {a} to itself until you have {b} of them",
    }[op]
    return f"To get {a} {op} {b}, {method}. Put the result in \\boxed{{}}."


def make_sft_dataset(n: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    """Prompt/completion pairs in chat form: TRL's SFTTrainer then trains on the completion only."""
    return [
        {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": solution_text(row)}]}
        for row in make_arithmetic_dataset(n, seed=seed, **kwargs)
    ]
