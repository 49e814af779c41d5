"""Wrong values for every documented trainer setting and dataset column: one `error: field: …` line each,
exit status 2, never a traceback."""

from __future__ import annotations

import dataclasses
import json

import pytest
from atlas_operator.spec import TrainingSpec

from atlas_contract.defaults import LIMITS, TEACHING
from atlas_core.training.data import DatasetSourceError, load_run_dataset
from atlas_core.training.load_config import load_run_config, validate_run_config
from harness.env import PYTHON, python_env

# The documented trainer settings: every spec.training field, the teaching protocol's, TRL's batch knobs.
DOCUMENTED = sorted(
    {f.name for f in dataclasses.fields(TrainingSpec)} - {"extra"}
    | set(TEACHING)
    | {"steps_per_generation", "generation_batch_size"}
)
TEXT_SETTINGS = {"loss_type", "scale_rewards", "lr_scheduler_type"}
SWITCHES = {"gradient_checkpointing", "bf16"}


def wrong_values(name: str) -> list:
    """Values of the wrong kind, not finite, and (where there is a range) just outside it."""
    if name in SWITCHES:
        return ["maybe", 3]
    if name in TEXT_SETTINGS:
        return [12]
    values = ["abc", float("nan"), float("inf")]
    limit = LIMITS.get(name)
    if limit is not None and limit.minimum is not None:
        values.append(limit.minimum if limit.exclusive_minimum else limit.minimum - 1)
    if limit is not None and limit.maximum is not None:
        values.append(limit.maximum + 1)
    return values


CASES = [(name, value) for name in DOCUMENTED for value in wrong_values(name)]


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_every_documented_trainer_setting_rejects_wrong_values(name, value):
    recipe = "tiny_teacher" if name in TEACHING else "tiny_grpo"
    shown = json.dumps(value) if isinstance(value, str) else ("nan" if value != value else str(value))
    problems = validate_run_config(load_run_config([f"recipe={recipe}", f"++trainer.{name}={shown}"]))
    assert len(problems) == 1 and problems[0].startswith(f"trainer.{name}: expected "), problems


def test_all_at_once_from_the_command_line(tmp_path):
    """Through the CLI: exit 2, one line per wrong setting, no traceback, nothing trained."""
    import subprocess

    wrong = {"temperature": "0", "learning_rate": "abc", "steps_per_generation": "abc", "beta": "-1", "top_p": "1.5"}
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.cli.train", "recipe=tiny_grpo", f"output_dir={tmp_path / 'o'}"]
        + [f"trainer.{k}={v}" for k, v in wrong.items()],
        capture_output=True,
        text=True,
        env=python_env(),
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert sorted(line.split(":")[1].strip() for line in lines) == sorted(f"trainer.{k}" for k in wrong)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("algorithm", "rows", "expected"),
    [
        ("grpo", [{"prompt": ""}, {"prompt": "2+2?"}], "column 'prompt': empty text (row 0)"),
        ("grpo", [{"prompt": "1+1?"}, {"prompt": None}, {"prompt": None}], "got null (rows 1, 2)"),
        ("grpo", [{"prompt": [{"role": "user", "content": 3}]}], "chat messages need a role and a string content"),
        ("grpo", [{"prompt": []}], "an empty message list"),
        ("sft", [{"prompt": "a", "completion": None}, {"prompt": "b", "completion": "x"}], "'completion': expected"),
    ],
)
def test_dataset_rows_are_checked_before_training(tmp_path, algorithm, rows, expected):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DatasetSourceError) as caught:
        load_run_dataset(str(data), algorithm=algorithm)
    assert str(caught.value).startswith(f"dataset.source: '{data}' column ") and expected in str(caught.value)


def test_mixed_plain_and_chat_prompts_are_refused(tmp_path):
    data = tmp_path / "mixed.jsonl"
    data.write_text(
        json.dumps({"prompt": "plain"}) + "\n" + json.dumps({"prompt": [{"role": "user", "content": "hi"}]})
    )
    with pytest.raises(DatasetSourceError) as caught:
        load_run_dataset(str(data))
    assert "column 'prompt': mixes plain-text and chat rows (row 0 is text, row 1 is chat)" in str(caught.value)


def test_output_dir_problems_name_output_dir(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for output_dir, expected in (
        (afile, f"output_dir: '{afile}' is a file"),
        (afile / "sub", f"output_dir: '{afile / 'sub'}' cannot be created: '{afile}' is a file"),
    ):
        problems = validate_run_config(load_run_config(["recipe=tiny_grpo", f"output_dir={output_dir}"]))
        assert len(problems) == 1 and problems[0].startswith(expected), problems


def test_teacher_exact_match_without_ground_truth_names_the_dataset(tmp_path):
    from atlas_contract.errors import InvalidFields
    from atlas_core.training.load_config import parse_run_config
    from atlas_core.training.runner import build_trainer

    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"prompt": "What is 3 + 4?"}) + "\n")
    cfg = load_run_config(
        ["recipe=tiny_teacher", f"dataset.source={data}", "reward.funcs=[exact_match]", f"output_dir={tmp_path / 'o'}"]
    )
    assert validate_run_config(cfg) == []
    with pytest.raises(InvalidFields) as caught:
        build_trainer(parse_run_config(cfg))
    assert caught.value.problems == [
        f"dataset.source: '{data}' has no 'ground_truth' column, which exact-match scoring needs (columns: prompt)"
    ]
