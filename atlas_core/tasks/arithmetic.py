"""The bundled verifiable task: synthetic arithmetic with exact-match rewards.

Rows are ``{"prompt": [chat messages], "ground_truth": "7"}`` so that TRL passes
``ground_truth`` to reward functions as a keyword argument. Answers are read from a
completion by :func:`extract_answer` (last ``\\boxed{}``, else ``<solution>…</solution>``,
else the number after the last "answer is", else the last number) and compared after
:func:`normalize_answer`.
"""

from __future__ import annotations

import hashlib
import random
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from atlas_contract import rules

SYSTEM_HINT = "Put the final answer in \\boxed{}."

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
#: A real chat model states its answer in prose ("So, the final answer is 8.") and often goes on with more
#: numbers (a check, a restatement): the number right after "answer is" / "answer:" is what it committed to.
_ANSWER_PHRASE = re.compile(
    r"\banswers?\s*(?:is|was|would be|will be|=|:)\s*:?\s*\$?\s*([-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+)", re.IGNORECASE
)


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
    rows = []
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


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}``, honouring nested braces."""
    start = text.rfind("\\boxed{")
    while start != -1:
        i, depth = start + len("\\boxed{"), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[start + len("\\boxed{") : i - 1]
        start = text.rfind("\\boxed{", 0, start)  # unbalanced: try an earlier one
    return None


def normalize_answer(answer: str) -> str:
    """Canonical form: numbers as plain decimals (``"1,000.0"`` → ``"1000"``), text lower-cased."""
    text = answer.strip().strip("$").strip()
    text = text.rstrip(".").strip()
    candidate = text.replace(",", "").replace(" ", "")
    if len(candidate) > 100:
        return " ".join(text.lower().split())
    try:
        number = Decimal(candidate)
    except InvalidOperation:
        return " ".join(text.lower().split())
    if not number.is_finite() or abs(number.adjusted()) > 60:
        # not a plain number (or too large to print): compare as text, and never build a huge int
        return " ".join(text.lower().split())
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def extract_answer(text: str) -> str | None:
    """The answer a completion commits to, normalised; ``None`` when it gives none."""
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return normalize_answer(boxed)
    solutions = _SOLUTION.findall(text)
    if solutions and solutions[-1].strip():
        return normalize_answer(solutions[-1])
    stated = _ANSWER_PHRASE.findall(text)
    if stated:
        return normalize_answer(stated[-1])
    numbers = _NUMBER.findall(text)
    if numbers:
        return normalize_answer(numbers[-1])
    return None


def completion_text(completion: Any) -> str:
    """Text of a completion that may be a string or a list of chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if m.get("role", "assistant") == "assistant")
    raise TypeError(f"completion: expected a string or a list of chat messages, got {type(completion).__name__}")


def exact_match_reward(completions: list[Any], ground_truth: list[str], **kwargs: Any) -> list[float]:
    """1.0 where the extracted answer equals the normalised ground truth, else 0.0 (a TRL reward function)."""
    return [
        1.0 if extract_answer(completion_text(c)) == normalize_answer(str(t)) else 0.0
        for c, t in zip(completions, ground_truth, strict=True)
    ]


def boxed_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """1.0 where the completion commits to an answer in ``\\boxed{}``, else 0.0."""
    return [1.0 if _last_boxed(completion_text(c)) else 0.0 for c in completions]


#: Reward functions a recipe may name (``reward.funcs``), under the names of ``atlas_contract.rules``.
REWARD_FUNCTIONS = dict(zip(rules.REWARD_FUNCTIONS, (exact_match_reward, boxed_format_reward), strict=True))
