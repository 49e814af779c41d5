"""The adaptive teaching protocol's text: student prompts, teacher templates, guidance extraction.

Pure functions, no models: the teacher trainer composes them.
"""

from __future__ import annotations

import re
from typing import Any

#: Capability bands: below LOW a walkthrough, up to HIGH hints, above HIGH minimal guidance.
LOW_CAPABILITY = 0.3
HIGH_CAPABILITY = 0.7

TEACHER_TEMPLATES = {
    "walkthrough": (
        "You are a teacher. The student is struggling with this kind of task. Write a step-by-step "
        "walkthrough of the method they should follow, step by step, without stating the final answer."
    ),
    "hints": (
        "You are a teacher. The student is partly able to do this task. Give hints and scaffolding: point "
        "at the key idea and the step where mistakes happen, without stating the final answer."
    ),
    "minimal": (
        "You are a teacher. The student can usually do this task. Give minimal guidance: a short check the "
        "student should verify their answer with, or nothing if they need none, without stating the final answer."
    ),
}
TEACHER_FORMAT = (
    "First think about the student's approach inside <thinking></thinking>, then write the guidance for the "
    "student inside <teaching></teaching>."
)
PROBE_INSTRUCTION = (
    "Before solving, describe in one or two sentences how you would approach this task. Do not solve it."
)
GUIDANCE_INTRO = "Guidance from your teacher:"

_TEACHING = re.compile(r"<teaching>(.*?)(?:</teaching>|$)", re.DOTALL)
_THINKING = re.compile(r"<thinking>.*?(?:</thinking>|$)", re.DOTALL)


def template_for(capability: float) -> str:
    """Template name for a measured capability in [0, 1]."""
    if capability < LOW_CAPABILITY:
        return "walkthrough"
    if capability <= HIGH_CAPABILITY:
        return "hints"
    return "minimal"


def task_text(prompt: Any) -> str:
    """The task of a dataset prompt: the string, or the last user message of a conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
        return users[-1] if users else ""
    raise TypeError(f"prompt: expected a string or a list of chat messages, got {type(prompt).__name__}")


def probe_messages(task: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"{task}\n\n{PROBE_INSTRUCTION}"}]


def baseline_messages(task: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": task}]


def enhanced_messages(task: str, guidance: str) -> list[dict[str, str]]:
    if not guidance.strip():
        return baseline_messages(task)
    return [{"role": "user", "content": f"{task}\n\n{GUIDANCE_INTRO}\n{guidance.strip()}"}]


def teacher_messages(task: str, probe: str, capability: float) -> list[dict[str, str]]:
    """The teacher's prompt: the template its capability calls for, the task and the student's probe.

    This exact conversation is what the policy is conditioned on, both when it generates the
    guidance and when GRPO computes that guidance's log-probabilities.
    """
    return [
        {"role": "system", "content": f"{TEACHER_TEMPLATES[template_for(capability)]} {TEACHER_FORMAT}"},
        {
            "role": "user",
            "content": f"Task:\n{task}\n\nThe student's approach:\n{probe.strip() or '(no answer)'}\n"
            f"Measured student capability: {capability:.2f}",
        },
    ]


def extract_guidance(completion: str) -> str:
    """The text inside the last ``<teaching>`` (a cut-off tag counts); without one, the completion
    minus its ``<thinking>`` part."""
    found = _TEACHING.findall(completion)
    if found:
        return found[-1].strip()
    return _THINKING.sub("", completion).strip()


def withhold_answer(guidance: str, ground_truth: Any) -> str:
    """Mask the reference answer where the guidance states it, in digits or, for a whole number, in words
    ("sixteen", "twenty-one"): the teacher must teach, not tell."""
    if ground_truth is None or not str(ground_truth).strip():
        return guidance
    answer = str(ground_truth).strip()
    forms = [rf"(?<![\w.]){re.escape(answer)}(?![\w]|\.\d)"]
    words = number_words(answer)
    if words:
        # "twenty-one", "twenty one" and "Twenty-One" alike; a longer number word is not a match ("sixteen" ⊄ "six")
        forms.append(r"(?<![\w-])" + r"[\s-]+".join(map(re.escape, words.split())) + r"(?![\w-])")
    return re.sub("|".join(forms), "[withheld]", guidance, flags=re.IGNORECASE)


_ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen"
).split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(answer: str) -> str | None:
    """A whole number from -999,999 to 999,999 in English words, separated by spaces ("-21" → "minus twenty
    one"); None for anything else."""
    text = answer.replace(",", "")
    if not re.fullmatch(r"[-+]?\d{1,6}", text):
        return None
    value = int(text)

    def below_thousand(n: int) -> list[str]:
        words = [_ONES[n // 100], "hundred"] if n >= 100 else []
        n %= 100
        if n >= 20:
            words += [_TENS[n // 10]] + ([_ONES[n % 10]] if n % 10 else [])
        elif n or not words:
            words.append(_ONES[n])
        return words

    thousands, rest = divmod(abs(value), 1000)
    words = (below_thousand(thousands) + ["thousand"] if thousands else []) + (
        below_thousand(rest) if rest or not thousands else []
    )
    return " ".join((["minus"] if value < 0 else []) + words)
