"""Judge prompts, the judgment format, and a tolerant reader of judge output.

Every judge answers with one JSON object::

    {"principles": [{"name": ..., "weight": 0.5, "description": ...}, ...],   # 2-3, weights sum to 1
     "score": 0.8, "rationale": "...", "uncertainty": 0.1}

Models wrap JSON in prose or code fences, truncate it, or add trailing commas;
:func:`parse_judgment` recovers what it can and raises :class:`JudgmentParseError` otherwise.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from atlas_core.answers import extract_answer, normalize_answer

JUDGE_CRITERIA = {
    "accuracy": "Is the response's final answer correct and are its claims true? Judge correctness only.",
    "helpfulness": (
        "Does the response help the user reach a correct solution: relevant, clear, actionable, and without "
        "giving away more than needed when it is guidance for a student?"
    ),
    "process": "Is the reasoning process sound: valid steps, no leaps, errors noticed and corrected?",
    "diagnostic": (
        "Does the response diagnose what the learner knows and misses (their capability and gaps) and adapt to it?"
    ),
}

RESPONSE_FORMAT = (
    "First choose 2 or 3 principles that matter most for judging this response, each with a weight; the "
    "weights sum to 1. Then score the response against them. Answer with one JSON object and nothing else:\n"
    '{"principles": [{"name": "...", "weight": 0.5, "description": "..."}], '
    '"score": <number in [0, 1]>, "rationale": "<why, in two or three sentences>", '
    '"uncertainty": <number in [0, 1], how unsure you are of the score>}'
)


class JudgmentParseError(ValueError):
    """Judge output from which no valid judgment could be read."""


@dataclass(frozen=True)
class Judgment:
    """One judge sample: a score in [0, 1] with its rationale, uncertainty and principles."""

    score: float
    rationale: str
    uncertainty: float
    principles: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    temperature: float | None = None
    tier: str = "small"


def _context_lines(context: dict[str, Any]) -> str:
    shown = {k: v for k, v in context.items() if isinstance(v, (str, int, float)) and k != "ground_truth"}
    if "ground_truth" in context:
        shown["reference answer"] = context["ground_truth"]
    return "".join(f"\n{k}: {v}" for k, v in shown.items())


def judge_messages(judge: str, prompt: str, response: str, context: dict[str, Any]) -> list[dict[str, str]]:
    """The tier-1 request of ``judge`` for one (prompt, response)."""
    return [
        {"role": "system", "content": f"You are the {judge} judge of a reward model. {JUDGE_CRITERIA[judge]}"},
        {
            "role": "user",
            "content": f"Task:\n{prompt}\n\nResponse:\n{response}\n{_context_lines(context)}\n\n{RESPONSE_FORMAT}",
        },
    ]


def escalation_messages(
    judge: str, prompt: str, response: str, context: dict[str, Any], samples: list[Judgment], failures: int
) -> list[dict[str, str]]:
    """The tier-2 request: the same task plus every tier-1 judgment, for the large model to settle."""
    shown = [
        {"temperature": s.temperature, "score": s.score, "uncertainty": s.uncertainty, "rationale": s.rationale}
        for s in samples
    ]
    note = f"\n{failures} further judgment(s) could not be read." if failures else ""
    messages = judge_messages(judge, prompt, response, context)
    messages[1]["content"] += (
        "\n\nSmaller judges disagreed or were unsure. Their judgments:\n"
        f"{json.dumps(shown, indent=1)}{note}\n"
        "Weigh them, decide yourself, and answer in the same JSON format."
    )
    return messages


def verifiable_accuracy(response: str, ground_truth: Any) -> Judgment:
    """The accuracy judge when a ground truth exists: answer extraction + exact match, no model."""
    expected = normalize_answer(str(ground_truth))
    found = extract_answer(response)
    correct = found == expected
    rationale = f"extracted answer {found!r} {'matches' if correct else 'does not match'} the reference {expected!r}"
    return Judgment(score=1.0 if correct else 0.0, rationale=rationale, uncertainty=0.0, tier="verifiable")


# ---------------------------------------------------------------- tolerant reading

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_FIELD_NUMBER = r'"{name}"\s*:\s*"?(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)'
_FIELD_TEXT = re.compile(r'"rationale"\s*:\s*"((?:[^"\\]|\\.)*)')


def _balanced_object(text: str) -> str | None:
    """The first ``{...}`` of ``text``, closed where the text was cut off (partial output)."""
    start = text.find("{")
    if start < 0:
        return None
    stack, in_string, escaped = [], False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if stack:
                stack.pop()
            if not stack:
                return text[start : i + 1]
    # Truncated: close the open string and brackets.
    tail = text[start:].rstrip().rstrip(",")
    return tail + ('"' if in_string else "") + "".join(reversed(stack))


def _load_object(text: str) -> dict[str, Any] | None:
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        blob = _balanced_object(candidate)
        if blob is None:
            continue
        for attempt in (blob, _TRAILING_COMMA.sub(r"\1", blob)):
            try:
                value = json.loads(attempt)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _unit_interval(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise JudgmentParseError(f"{name}: expected a number in [0, 1], got {value!r}") from None
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise JudgmentParseError(f"{name}: expected a number in [0, 1], got {value!r}")
    return number


def _principles(raw: Any) -> tuple[dict[str, Any], ...]:
    """Principles as given, weights renormalised to sum to 1 (models are sloppy with arithmetic)."""
    if not isinstance(raw, list):
        return ()
    items = [p for p in raw if isinstance(p, dict)]
    weights = []
    for p in items:
        try:
            weights.append(max(0.0, float(p.get("weight", 0.0))))
        except (TypeError, ValueError):
            weights.append(0.0)
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] * len(items), float(len(items) or 1)
    return tuple({**p, "weight": w / total} for p, w in zip(items, weights, strict=True))


def parse_judgment(text: str, temperature: float | None = None, tier: str = "small") -> Judgment:
    """Read one judgment from model output; raises JudgmentParseError when there is none."""
    if not isinstance(text, str) or not text.strip():
        raise JudgmentParseError("empty judge output")
    obj = _load_object(text)
    if obj is None:
        # Last resort for badly broken JSON: the two numbers the protocol cannot do without.
        score = re.search(_FIELD_NUMBER.format(name="score"), text)
        uncertainty = re.search(_FIELD_NUMBER.format(name="uncertainty"), text)
        if not (score and uncertainty):
            raise JudgmentParseError(f"no JSON judgment in output: {text[:80]!r}")
        rationale = _FIELD_TEXT.search(text)
        obj = {
            "score": score.group(1),
            "uncertainty": uncertainty.group(1),
            "rationale": rationale.group(1) if rationale else "",
        }
    if "score" not in obj:
        raise JudgmentParseError("judgment has no score")
    return Judgment(
        score=_unit_interval(obj["score"], "score"),
        uncertainty=_unit_interval(obj.get("uncertainty", 1.0), "uncertainty"),
        rationale=str(obj.get("rationale", "")).strip(),
        principles=_principles(obj.get("principles")),
        temperature=temperature,
        tier=tier,
    )
