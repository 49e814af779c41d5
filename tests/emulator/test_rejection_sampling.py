"""The rejection-sampled warm-up (atlas_core/training/rejection_sampling.py) against a student on a real HTTP server:
the demonstrations keep only guidance the student then answers right with."""

from __future__ import annotations

import re

from atlas_contract.teaching import TeachingSettings
from atlas_core.answers import SYSTEM_HINT
from atlas_core.tasks import multistep
from atlas_core.teaching import prompts
from atlas_core.teaching.protocol import TeachingProtocol
from atlas_core.teaching.student import EndpointStudent
from atlas_core.training.rejection_sampling import rejection_sampled_demonstrations
from harness.judge_server import Call, JudgeServer, Reply

ROWS = [
    {"question": q, "kind": multistep.kind_of(q), "ground_truth": str(eval(q)), "prompt": multistep.prompt_of(q)}
    for q in ("3 + 4", "11 + 7", "7 + 5 + 4", "2 + 2 + 9", "9 + 9 + 9")
]


def student_script(call: Call) -> Reply:
    """A student that solves 3 + 4 alone; 11 + 7 only when told to count; a two-step problem only when it is
    restated as a one-step one, except 9 + 9 + 9, which nothing helps. It answers 0 otherwise."""
    text = call.messages[-1]["content"]
    if prompts.PROBE_INSTRUCTION in text:
        return Reply("I would add the numbers.")
    question = re.search(r"What is ([\d +]+)\?", text).group(1)
    guidance = text.split(prompts.GUIDANCE_INTRO)[1] if prompts.GUIDANCE_INTRO in text else ""
    right = (
        question == "3 + 4"
        or (question == "11 + 7" and "Count up" in guidance)
        or (question != "9 + 9 + 9" and "the problem is now" in guidance)
    )
    return Reply(f"\\boxed{{{eval(question) if right else 0}}}")


def test_demonstrations_keep_the_first_guidance_that_helps_and_drop_what_nothing_helps():
    settings = TeachingSettings(student_temperature=0.0, student_samples=1, student_max_tokens=32)
    with JudgeServer(student_script) as server:
        protocol = TeachingProtocol(EndpointStudent(server.base_url), settings)
        demonstrations, report = rejection_sampled_demonstrations(
            protocol, ROWS, multistep.guidance_candidates, thinking=lambda row: row["kind"]
        )

    def taught(question: str) -> list[str]:
        return [
            d["completion"][0]["content"]
            for d in demonstrations
            if f"What is {question}?" in d["prompt"][-1]["content"]
        ]

    # solved alone: the empty guidance; fixed: the first candidate that worked, not an earlier or later one
    assert taught("3 + 4") == ["<thinking>one-step</thinking><teaching></teaching>"]
    assert taught("11 + 7") == ["<thinking>one-step</thinking><teaching>Count up 7 from 11.</teaching>"]
    restated = multistep.restated_guidance(ROWS[2])
    assert taught("7 + 5 + 4") == [f"<thinking>two-step</thinking><teaching>{restated}</teaching>"]
    assert taught("9 + 9 + 9") == []  # no candidate helped: dropped
    assert report.to_dict() == {
        "problems": 5,
        "solved_alone": 1,
        "fixed": 3,
        "dropped": 1,
        "student_calls": 2 + len(multistep.guidance_candidates(ROWS[4])),
        "winners": {"0": 2, "1": 1},
    }
    # the teacher's prompt is the protocol's, with the student's probe and its measured capability
    by_task = {prompts.task_text(row["prompt"]): row for row in ROWS}
    expected = [
        prompts.teacher_messages(task, "I would add the numbers.", 1.0 if by_task[task]["question"] == "3 + 4" else 0.0)
        for task in by_task
        if by_task[task]["question"] != "9 + 9 + 9"
    ]
    assert [d["prompt"] for d in demonstrations] == expected
    # a later candidate is asked only of the problems the earlier ones left unfixed: 9 + 9 + 9 tried on each
    guided = [c for c in server.calls if prompts.GUIDANCE_INTRO in c.messages[-1]["content"]]
    assert len(guided) == 4 + 2 + 1 + 1  # the 4 failed alone; 11 + 7 and 9 + 9 + 9; then 9 + 9 + 9 twice


def test_every_candidate_teaches_without_telling():
    """No candidate guidance states the answer, so none is masked to [withheld] when shown to the student."""
    for kind in ("one-step", "two-step"):
        for row in multistep.problems(kind, "train")[:50]:
            for guidance in multistep.guidance_candidates(row, restate_one_step=True):
                assert prompts.withhold_answer(guidance, row["ground_truth"]) == guidance, (row, guidance)


def test_the_restated_one_step_lever_asks_the_problem_again_first_then_the_usual_candidates():
    """bench/real_teaching.py --restate-one-step: a one-step problem's restatement goes first, in the style of a
    two-step problem's first candidate; a two-step problem's candidates are unchanged."""
    one, two = multistep.problems("one-step", "train")[0], multistep.problems("two-step", "train")[0]
    restated = multistep.guidance_candidates(one, restate_one_step=True)
    assert restated[0] == f"The problem is: What is {one['question']}? {SYSTEM_HINT}"
    assert restated[1:] == multistep.guidance_candidates(one)
    assert multistep.guidance_candidates(two, restate_one_step=True) == multistep.guidance_candidates(two)
    assert multistep.guidance_candidates(two)[0].startswith(multistep.intermediate_step(two) + ", so the problem")
