"""The bundled teaching task: problems a teacher can help with without giving the answer away.

Two kinds of problem, answers checked by exact match (``ground_truth``):

* **one-step** ``x + y`` (x in 2..18, y in 1..9): the warmed-up student solves most of these alone;
* **two-step** ``a + b + c`` (a, b, c in 1..9): the student was never shown one without help and
  mostly fails alone. Guidance that states the intermediate sum (``First find a + b = s``) turns it
  into a one-step problem the student can do; the answer itself is never stated, and the protocol
  would mask it if it were.

Every sum a one-step problem asks for (x + y with x ≤ 18) is also the second step of some two-step
problem, so a student warmed up on guided two-step problems and on the *training* one-step problems
can answer held-out one-step problems: the sums are its skills, the problems are new.

**Splits.** Each distinct problem belongs to exactly one split, decided by a hash of its text
(:func:`split_of`): ``test`` holds about 55% of the one-step problems and 30% of the two-step ones,
``train`` the rest. Training data (the student's warm-up, the teacher's warm-up, teacher GRPO) only ever
draws from ``train``; evaluation draws from ``test``. ``test`` mixes two fifths one-step and three fifths
two-step problems, in a fixed order, so that ``limit`` keeps the mix.

**Teacher demonstrations** (the teacher's SFT warm-up, built with the student's by
atlas_core.training.demonstrations) are deliberately of mixed quality: each gives the
intermediate step, a generic method, a short check or nothing, drawn with weights that loosely follow the
template of the (random) capability in its prompt — mostly the first step for a walkthrough, mostly nothing
or a check for minimal guidance — and never look at the problem. On one-step problems the intermediate step *is* the
answer, so that guidance is masked to ``[withheld]`` and helps no one; a wrong one misleads. Getting the
first step right, and giving it where it helps, is left for RL.
"""

from __future__ import annotations

import hashlib
import random
from functools import cache
from typing import Any

from atlas_core.answers import SYSTEM_HINT

SPLITS = ("train", "test")
#: Share of each kind's problems in the held-out ``test`` split (by hash, see :func:`split_of`).
TEST_SHARE = {"one-step": 0.55, "two-step": 0.3}
#: Share of one-step problems when a split is drawn as a mix (the rest two-step).
ONE_STEP_SHARE = 2 / 5
_SALT = "atlas-multistep-v1"
METHOD_GUIDANCE = "Add the numbers from left to right."
CHECK_GUIDANCE = "Check your sum before you answer."
#: The styles of the teacher's warm-up demonstrations, and how often each is drawn under each template of
#: the protocol (atlas_core.teaching.prompts.template_for): the warm-up teacher mostly follows its template
#: (a walkthrough gives the first step, minimal guidance a check or nothing), not always, and never looks at the
#: problem. "none" is an empty ``<teaching>``: a student that can already do the task answers as it would alone,
#: which is the only guidance that can never make it worse (non-degradation).
DEMONSTRATION_STYLES = ("step", "method", "check", "none")
DEMONSTRATION_WEIGHTS = {"walkthrough": (4, 1, 1, 0), "hints": (2, 1, 1, 1), "minimal": (1, 1, 2, 4)}


def _value(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def kind_of(question: str) -> str:
    return "one-step" if len(question.split()) == 3 else "two-step"


def split_of(question: str) -> str:
    """``test`` or ``train``: a stable hash of the problem's text, so a problem has one split forever."""
    digest = hashlib.sha256(f"{_SALT}:{question}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") / 2**64 < TEST_SHARE[kind_of(question)] else "train"


@cache
def problems(kind: str, split: str) -> tuple[dict[str, Any], ...]:
    """Every problem of ``kind`` (``one-step`` | ``two-step``) in ``split``, in a fixed shuffled order."""
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    rows = []
    if kind == "one-step":
        for x in range(2, 19):
            for y in range(1, 10):
                rows.append({"question": f"{x} + {y}", "kind": kind, "ground_truth": str(x + y)})
    elif kind == "two-step":
        for a in range(1, 10):
            for b in range(1, 10):
                for c in range(1, 10):
                    rows.append({"question": f"{a} + {b} + {c}", "kind": kind, "ground_truth": str(a + b + c)})
    else:
        raise ValueError(f"kind: expected one-step or two-step, got {kind!r}")
    chosen = [dict(r, prompt=prompt_of(r["question"])) for r in rows if split_of(r["question"]) == split]
    random.Random(f"{_SALT}:{kind}:{split}").shuffle(chosen)
    return tuple(chosen)


def prompt_of(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"What is {question}? {SYSTEM_HINT}"}]


def make_multistep_dataset(n: int, split: str = "train", seed: int = 0) -> list[dict[str, Any]]:
    """``n`` problems of ``split`` (two fifths one-step): ``{"prompt", "question", "kind", "ground_truth"}``.

    ``test`` gives distinct problems in a fixed order (the first ``n`` of the mix, see :func:`_test_mix`), ``n``
    at most :func:`test_mix_size`; ``train`` samples with ``seed`` and may repeat problems.
    """
    if n < 1:
        raise ValueError(f"n: expected a positive number of problems, got {n}")
    one, two = problems("one-step", split), problems("two-step", split)
    if split == "test":
        most = test_mix_size()
        if n > most:
            raise ValueError(f"n: the test split has {most} problems in its mix, asked for {n}")
        return [dict(row) for row in _test_mix()[:n]]
    rng = random.Random(seed)
    return [dict(rng.choice(one if rng.random() < ONE_STEP_SHARE else two)) for _ in range(n)]


def _test_mix() -> list[dict[str, Any]]:
    """The test split in its fixed order: two problems in five one-step (positions 0 and 3 of every five), the
    others two-step, so that any prefix (a ``limit``) keeps the mix and a longer one extends a shorter one."""
    one, two = problems("one-step", "test"), problems("two-step", "test")
    mix, ones, twos = [], iter(one), iter(two)
    for i in range(len(one) + len(two)):
        row = next(ones if i % 5 in (0, 3) else twos, None)
        if row is None:
            break
        mix.append(row)
    return mix


def test_mix_size() -> int:
    """How many problems the test mix holds (the largest ``n`` of the test split)."""
    return len(_test_mix())


def intermediate_step(row: dict[str, Any]) -> str:
    """The first step written out: ``a + b = s`` (for a one-step problem, that is the answer)."""
    a, op, b = row["question"].split()[:3]
    return f"{a} {op} {b} = {_value(int(a), op, int(b))}"


def step_guidance(row: dict[str, Any]) -> str:
    """Guidance that gives the intermediate result and the step left."""
    parts = row["question"].split()
    rest = f" Then {'add' if parts[3] == '+' else 'subtract'} {parts[4]}." if len(parts) == 5 else ""
    return f"First find {intermediate_step(row)}.{rest}"


def student_solution(row: dict[str, Any], guided: bool) -> str:
    """The student's worked answer: one step, from the intermediate result when it was given."""
    parts = row["question"].split()
    if len(parts) == 5 and guided:
        first = _value(int(parts[0]), parts[1], int(parts[2]))
        line = f"{first} {parts[3]} {parts[4]} = {row['ground_truth']}"
    else:
        line = f"{row['question']} = {row['ground_truth']}"
    return f"{line}. \\boxed{{{row['ground_truth']}}}"


def restated_guidance(row: dict[str, Any]) -> str:
    """Guidance that does the first step and hands the student the one-step problem left, asked as the task asks
    (``7 + 5 = 12, so the problem is now: What is 12 + 4? Put the final answer in \\boxed{}.``); the answer itself is
    never stated. For a one-step problem there is no step to do: the problem, asked again."""
    parts = row["question"].split()
    if len(parts) == 3:
        return f"The problem is: What is {row['question']}? {SYSTEM_HINT}"
    first = _value(int(parts[0]), parts[1], int(parts[2]))
    return f"{intermediate_step(row)}, so the problem is now: What is {first} {parts[3]} {parts[4]}? {SYSTEM_HINT}"


def count_guidance(row: dict[str, Any]) -> str:
    """Counting on from the first number (one-step problems): ``Count up 7 from 11.``"""
    x, op, y = row["question"].split()[:3]
    return f"Count {'up' if op == '+' else 'down'} {y} from {x}."


def guidance_candidates(row: dict[str, Any], restate_one_step: bool = False) -> list[str]:
    """Every guidance this task can give a problem, most preferred first: what a rejection-sampled warm-up
    (atlas_core.training.rejection_sampling) tries on a student that fails the problem alone. The order is the
    measured one (``bench/real_teaching.py``, SmolLM2-135M student, train problems): a restated one-step problem
    helps most with two-step problems, the generic method with one-step ones. ``restate_one_step``: a one-step
    problem's restatement first too (issue #61's lever: one style of guidance for both kinds, so that a greedy
    teacher does not fall back on the generic method everywhere)."""
    if kind_of(row["question"]) == "two-step":
        return [restated_guidance(row), step_guidance(row), METHOD_GUIDANCE, CHECK_GUIDANCE]
    one_step = [METHOD_GUIDANCE, count_guidance(row), CHECK_GUIDANCE]
    return [restated_guidance(row), *one_step] if restate_one_step else one_step


def demonstration_guidance(row: dict[str, Any], rng: random.Random, template: str) -> str:
    """The guidance of a teacher demonstration: the intermediate step, the generic method, a short check or nothing,
    drawn with the weights of ``template`` (:data:`DEMONSTRATION_WEIGHTS`)."""
    style = rng.choices(DEMONSTRATION_STYLES, weights=DEMONSTRATION_WEIGHTS[template])[0]
    return {"step": step_guidance(row), "method": METHOD_GUIDANCE, "check": CHECK_GUIDANCE, "none": ""}[style]
