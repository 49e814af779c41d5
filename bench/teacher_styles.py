"""Which guidance a trained teacher gives, stage by stage: bench/real_teaching.py's warm-up (SFT) teacher against its
final (GRPO) teacher, on the same prompts.

For each ``--output`` folder of bench/real_teaching.py, the teacher prompts of its evaluation's weak problems (those
the student failed alone; the task, the student's probe and its capability, from ``eval/trained/problems.jsonl``) go
to ``teacher-sft`` and to ``teacher``, greedily as the evaluation decodes; each guidance is counted by its style
(builtin://multistep's candidates: the restated problem, the first step, the method, a check, counting on; none;
other) and kind of problem. It shows what each stage chose: whether the warm-up's greedy teacher follows its
demonstrations and what GRPO changed.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.teacher_styles OUTPUT [OUTPUT ...]
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

STAGES = ("teacher-sft", "teacher")


def style_of(guidance: str, row: dict) -> str:
    """The candidate ``guidance`` is, exactly; else its style with other numbers (a wrong sum), else ``other``."""
    from atlas_core.tasks import multistep

    text = guidance.strip()
    exact = {"": "none", multistep.METHOD_GUIDANCE: "method", multistep.CHECK_GUIDANCE: "check"}
    if row["kind"] == "two-step":
        exact |= {multistep.restated_guidance(row): "restated", multistep.step_guidance(row): "step"}
    else:
        exact |= {multistep.count_guidance(row): "count"}
    if text in exact:
        return exact[text]
    for marker, name in (("the problem is now", "restated"), ("First find", "step"), ("Count ", "count")):
        if marker in text:
            return f"{name} (other numbers)"
    return "other"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", type=Path, help="bench/real_teaching.py --output folders")
    args = parser.parse_args()

    from atlas_core.cli.display import quiet_libraries
    from atlas_core.tasks import multistep
    from atlas_core.teaching import prompts
    from atlas_core.teaching.student import LocalStudent

    quiet_libraries(hide_warnings=True)
    for output in args.outputs:
        records = [json.loads(line) for line in (output / "eval" / "trained" / "problems.jsonl").open()]
        weak = [r for r in records if r["capability"] == "weak"]
        rows = []
        for r in weak:
            question = r["task"].split("What is ", 1)[1].split("?", 1)[0]
            rows.append({"question": question, "ground_truth": r["ground_truth"], "kind": multistep.kind_of(question)})
        conversations = [prompts.teacher_messages(r["task"], r["probe"], r["capability_level"]) for r in weak]
        for stage in STAGES:
            teacher = LocalStudent(str(output / stage), role="teacher")
            completions = teacher.generate(conversations, 64, 1, 0.0)
            counts = Counter(
                (row["kind"], style_of(prompts.extract_guidance(c[0].text), row))
                for row, c in zip(rows, completions, strict=True)
            )
            shown = ", ".join(f"{kind} {style} {n}" for (kind, style), n in sorted(counts.items()))
            print(f"{output} {stage}: {len(weak)} weak problems: {shown}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
