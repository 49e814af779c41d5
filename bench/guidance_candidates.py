"""What each guidance of builtin://multistep's candidates does for the real student, on training problems.

The rejection-sampled warm-up (atlas_core/training/rejection_sampling.py) tries ``multistep.guidance_candidates`` on
the problems the student fails alone, most preferred first, and keeps the first that helps. This bench shows each
candidate to the student on every problem of ``--problems`` training problems (``builtin://multistep``'s train split,
``--seed``), as the protocol shows guidance (masked, greedy, 64-token answers: the settings of
bench/real_teaching.py), and prints by kind of problem: how many the student solves alone, and for each candidate how
many of the failed ones it then solves and how many of the solved ones it keeps. Nothing here touches the held-out
test split.

The student is ``builtin://smollm2-135m-instruct`` behind a CPU vLLM server (float32) when ``make vllm`` installed
one, else loaded in-process.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.guidance_candidates [--problems 200] [--seed 123]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def score_of(score: float | None) -> float:
    """An answer's score: every builtin://multistep row has a ground truth, so there is one (None: nothing to match)."""
    assert score is not None
    return score


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=200, help="training problems drawn (default 200)")
    parser.add_argument("--seed", type=int, default=123, help="seed of the draw (default 123)")
    parser.add_argument("--student", choices=("auto", "vllm", "local"), default="auto")
    args = parser.parse_args()

    from atlas_contract.checks import SMOLLM2_MODEL_URI
    from atlas_contract.teaching import TeachingSettings
    from atlas_core.cli.display import quiet_libraries
    from atlas_core.models.tiny import resolve_model_path
    from atlas_core.tasks import multistep
    from atlas_core.teaching import prompts
    from atlas_core.teaching.protocol import TeachingProtocol
    from atlas_core.teaching.student import load_student
    from bench.real_teaching import STUDENT_SETTINGS, student_endpoint

    quiet_libraries(hide_warnings=True)
    drawn = multistep.make_multistep_dataset(args.problems, "train", seed=args.seed)
    rows = list({row["question"]: row for row in drawn}.values())  # each distinct problem once
    tasks = [prompts.task_text(row["prompt"]) for row in rows]
    with student_endpoint(args.student) as endpoint:
        student = load_student(endpoint or resolve_model_path(SMOLLM2_MODEL_URI))
        protocol = TeachingProtocol(student, TeachingSettings(**STUDENT_SETTINGS))
        started = time.perf_counter()
        answers = student.generate(
            [prompts.baseline_messages(t) for t in tasks], STUDENT_SETTINGS["student_max_tokens"], 1, 0.0
        )
        solved = [score_of(s) for s in protocol.score_answers(tasks, [a[0].text for a in answers], rows)]
        flat = [
            (i, position, g)
            for i, row in enumerate(rows)
            for position, g in enumerate(multistep.guidance_candidates(row))
        ]
        guided = protocol.guided([tasks[i] for i, _, _ in flat], [rows[i] for i, _, _ in flat], [g for *_, g in flat])
        seconds = time.perf_counter() - started
    print(
        f"{len(rows)} distinct training problems (of {args.problems} drawn, seed {args.seed}); "
        f"{len(flat) + len(rows)} student answers in {seconds:.0f} s"
    )
    for kind in ("one-step", "two-step"):
        mine = [i for i, row in enumerate(rows) if row["kind"] == kind]
        weak = [i for i in mine if solved[i] < 1.0]
        print(f"\n{kind}: {len(mine)} problems, solved alone {len(mine) - len(weak)} ({1 - len(weak) / len(mine):.0%})")
        example = rows[mine[0]]
        for position, text in enumerate(multistep.guidance_candidates(example)):
            scores = {
                i: score_of(g.score) for (i, p, _), g in zip(flat, guided, strict=True) if p == position and i in mine
            }
            fixed = sum(scores[i] >= 1.0 for i in weak)
            kept = sum(scores[i] >= 1.0 for i in mine if i not in weak)
            print(
                f"  {position}: fixes {fixed}/{len(weak)} failed ({fixed / max(len(weak), 1):.0%}), keeps "
                f"{kept}/{len(mine) - len(weak)} solved; e.g. ({example['question']}) {text!r}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
