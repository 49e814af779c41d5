"""The warm-up datasets in the teaching protocol's format, for SFT before RL: the teacher's demonstrations
(``builtin://teacher-arithmetic``, ``builtin://teacher-multistep``) and the student's guided examples
(``builtin://arithmetic`` with ``guided_fraction``, ``builtin://multistep`` for SFT).

The bundled tasks (atlas_core.tasks) only describe their problems and their guidance; how guidance is shown
(prompts, masking, the teacher's format) is the protocol's (atlas_core.teaching.prompts).
"""

from __future__ import annotations

import random
from typing import Any

from atlas_core.tasks import arithmetic, multistep
from atlas_core.teaching.prompts import enhanced_messages, teacher_messages, template_for, withhold_answer

# What the student "says" in a demonstration's probe, by builtin task.
DEMONSTRATION_PROBES = {
    "arithmetic": ("I would add the numbers.", "I am not sure.", "Count on from the first number."),
    "multistep": ("I would add the numbers.", "I am not sure.", "Left to right."),
}


def teacher_completion(thinking: str, guidance: str) -> str:
    """A teacher completion in the protocol's format (atlas_core.teaching.prompts.TEACHER_FORMAT)."""
    return f"<thinking>{thinking}</thinking><teaching>{guidance}</teaching>"


def guidance_example(row: dict[str, Any]) -> str:
    """A worked teacher completion for the bundled arithmetic task (SFT warm-up of the teacher)."""
    return teacher_completion(f"The student must compute {row['question']}.", arithmetic.guidance_text(row))


def make_teacher_sft_dataset(task: str, n: int, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    """builtin://teacher-<task>: (task, probe, guidance) examples in the teacher's format, for an SFT warm-up before
    RL. The one builder of them: the bundled task only describes its problems (``arithmetic``: the worked guidance
    of :func:`guidance_example`; ``multistep``: its demonstrations, which follow the capability's template
    loosely, over training problems)."""
    if task == "arithmetic":
        problems = arithmetic.make_arithmetic_dataset(n, seed=seed, **kwargs)

        def demonstrate(row, rng, capability):
            return guidance_example(row)
    elif task == "multistep":
        problems = multistep.make_multistep_dataset(n, "train", seed)

        def demonstrate(row, rng, capability):
            guidance = multistep.demonstration_guidance(row, rng, template_for(capability))
            return teacher_completion(row["kind"], guidance)
    else:
        raise ValueError(f"no teacher demonstrations for task {task!r}")
    rng = random.Random(seed)
    rows = []
    for row in problems:
        text = row["prompt"][0]["content"]
        probe = rng.choice(DEMONSTRATION_PROBES[task])
        capability = rng.random()
        prompt = teacher_messages(text, probe, capability=capability)
        completion = demonstrate(row, rng, capability)
        rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": completion}]})
    return rows


def make_student_sft_dataset(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """builtin://multistep for SFT, the student's warm-up: training one-step problems alone, three quarters of them
    with guidance as the protocol shows it (the generic method, a check, or a first step that is the answer,
    masked), so that guidance does not throw it; and two-step problems only with the intermediate step. Never an
    unguided two-step problem: alone, the student is weak at them."""
    rng = random.Random(seed)
    rows = []
    for row in multistep.make_multistep_dataset(n, "train", seed):
        task = row["prompt"][0]["content"]
        if row["kind"] == "two-step":
            prompt = enhanced_messages(task, multistep.step_guidance(row))
            guided = True
        else:
            # as the protocol shows guidance: a first step that is the answer arrives masked
            masked = withhold_answer(multistep.step_guidance(row), row["ground_truth"])
            guidance = rng.choice(("", multistep.METHOD_GUIDANCE, multistep.CHECK_GUIDANCE, masked))
            prompt = enhanced_messages(task, guidance) if guidance else row["prompt"]
            guided = False
        solution = multistep.student_solution(row, guided)
        rows.append({"prompt": prompt, "completion": [{"role": "assistant", "content": solution}]})
    return rows


def with_arithmetic_guidance(rows: list[dict], fraction: float, seed: int, max_operand: int) -> list[dict]:
    """builtin://arithmetic for SFT with ``guided_fraction``: a share of the tasks shown with teacher guidance, as
    the teacher protocol will, so that a student warmed up on them reads guidance instead of being thrown by it."""
    rng = random.Random(seed)
    problems = arithmetic.make_arithmetic_dataset(len(rows), seed=seed, max_operand=max_operand, split="train")
    for row, problem in zip(rows, problems, strict=True):
        if rng.random() < fraction:
            row["prompt"] = enhanced_messages(problem["prompt"][0]["content"], arithmetic.guidance_text(problem))
    return rows
