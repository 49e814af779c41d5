"""Reading a completion's answer, and the verifiable rewards built on it: what the trainers, the teaching protocol,
the RIM judges and the evaluation use, whatever the task.

:func:`extract_answer` reads the answer a completion commits to (last ``\\boxed{}``, else ``<solution>…</solution>``,
else the number after the last "answer is", else the last number) and :func:`normalize_answer` puts it, and a
ground truth, in one canonical form; :data:`REWARD_FUNCTIONS` are TRL reward functions over rows whose
``ground_truth`` TRL passes as a keyword argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from atlas_contract import checks

#: What a task's prompt asks for: the format :func:`extract_answer` reads first.
SYSTEM_HINT = "Put the final answer in \\boxed{}."

_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
#: A real chat model states its answer in prose ("So, the final answer is 8.") and often goes on with more
#: numbers (a check, a restatement): the number right after "answer is" / "answer:" is what it committed to.
_ANSWER_PHRASE = re.compile(
    r"\banswers?\s*(?:is|was|would be|will be|=|:)\s*:?\s*\$?\s*([-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+)", re.IGNORECASE
)


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


#: Reward functions a recipe may name (``reward.funcs``), under the names of ``atlas_contract.checks``.
REWARD_FUNCTIONS: dict[str, Callable[..., list[float]]] = dict(
    zip(checks.REWARD_FUNCTIONS, (exact_match_reward, boxed_format_reward), strict=True)
)
