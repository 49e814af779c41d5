"""The one preflight of a run's datasets (atlas_contract.datasets), in its three places: the operator's validation
(``Invalid`` before any child), ``atlas render`` / ``atlas train`` (exit 2, one line per problem) and the
trainer's start-up check (``validate_run_config``, before any model loads); and splits that are real for every
source, so an evaluation never measures training data by accident."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from atlas_operator.cli import render_main
from atlas_operator.validation import parse_run

from atlas_cli.main import main as atlas
from atlas_contract.errors import InvalidFields
from atlas_core.training import data
from atlas_core.training.data import BUILTIN_SOURCES, DatasetSourceError, load_run_dataset
from atlas_core.training.load_config import load_run_config, validate_run_config

TEACHER = {
    "apiVersion": "atlas.arc.computer/v1alpha1",
    "kind": "AtlasTeacher",
    "metadata": {"name": "t"},
    "spec": {
        "model": "builtin://tiny-llama",
        "dataset": {"source": "builtin://arithmetic"},
        "rollout": {"replicas": 0},
        "resources": {"gpusPerNode": 0},
        "student": {"model": "builtin://tiny-llama", "rollout": {"replicas": 0}},
        "evaluation": {"samples": 2},
    },
}

# Each evaluation mistake of issue #29 → the field its one problem names (manifest, run configuration).
EVALUATION_MISTAKES = [
    ({"dataset": {"source": "builtin://does-not-exist"}}, "evaluation.dataset.source"),
    ({"dataset": {"source": "builtin://teacher-multistep"}}, "evaluation.dataset.source"),
    ({"dataset": {"source": "builtin://multistep", "split": "validation"}}, "evaluation.dataset.split"),
    ({"samples": 1099511627776}, "evaluation.samples"),
    ({"limit": 1099511627776}, "evaluation.limit"),
]


def teacher(evaluation: dict, **spec) -> dict:
    manifest = copy.deepcopy(TEACHER)
    manifest["spec"]["evaluation"] = evaluation
    manifest["spec"].update(spec)
    return manifest


def invalid_fields(manifest: dict) -> list[str]:
    with pytest.raises(InvalidFields) as raised:
        parse_run(manifest)
    return [problem.split(":")[0] for problem in raised.value.problems]


def hydra_value(value) -> str:
    """A value in Hydra's override grammar (keys unquoted, strings quoted)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {hydra_value(v)}" for k, v in value.items()) + "}"
    return f"'{value}'" if isinstance(value, str) else str(value)


def run_config_problems(tmp_path: Path, *overrides: str) -> list[str]:
    cfg = load_run_config(["recipe=tiny_teacher", f"output_dir={tmp_path / 'out'}", *overrides])
    return validate_run_config(cfg)


# ------------------------------------------------------------------ the operator and atlas render


@pytest.mark.parametrize(("evaluation", "field"), EVALUATION_MISTAKES)
def test_operator_refuses_each_evaluation_mistake_naming_its_spec_path(evaluation, field):
    assert invalid_fields(teacher(evaluation)) == [f"spec.{field}"]


def test_operator_refuses_training_datasets_of_another_kind_or_split():
    training = {"source": "builtin://teacher-arithmetic"}
    assert invalid_fields(teacher({"samples": 2}, dataset=training)) == ["spec.dataset.source"]  # named once
    split = {"source": "builtin://multistep", "split": "validation"}
    assert invalid_fields(teacher({"samples": 2}, dataset=split)) == ["spec.dataset.split"]
    assert parse_run(teacher({"dataset": {"source": "/data/held-out.jsonl"}}))  # on the volume: the trainer checks


def test_operator_refuses_non_finite_reward_weights():
    for weight in (float("nan"), float("inf"), float("-inf")):
        manifest = teacher({"samples": 2}, reward={"funcs": ["exact_match"], "weights": [weight]})
        assert invalid_fields(manifest) == ["spec.reward.weights[0]"]


def test_atlas_render_exits_2_with_one_line_per_problem(tmp_path, capsys):
    manifest = teacher({"dataset": {"source": "builtin://teacher-multistep"}, "samples": 0})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert render_main([str(path)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert [line.split(":")[1].strip() for line in lines] == [
        "spec.evaluation.samples",
        "spec.evaluation.dataset.source",
    ]


# ------------------------------------------------------------------ the trainer's start-up check and atlas train


@pytest.mark.parametrize(("evaluation", "field"), EVALUATION_MISTAKES)
def test_trainer_start_up_refuses_each_evaluation_mistake(tmp_path, evaluation, field):
    override = f"+evaluation={hydra_value(evaluation)}"
    assert [p.split(":")[0] for p in run_config_problems(tmp_path, override)] == [field]


def test_trainer_start_up_checks_evaluation_files_and_their_splits(tmp_path):
    missing = tmp_path / "missing.jsonl"
    (problems,) = run_config_problems(tmp_path, f"+evaluation={{dataset: {{source: '{missing}'}}}}")
    assert problems == f"evaluation.dataset.source: '{missing}' does not exist"
    unsplit = tmp_path / "problems.jsonl"
    unsplit.write_text(json.dumps({"prompt": "What is 1 + 1?", "ground_truth": "2"}) + "\n")
    # a file without a split column named as the evaluation set is the evaluation set, whole
    assert run_config_problems(tmp_path, f"+evaluation={{dataset: {{source: '{unsplit}'}}}}") == []
    # the run's own training file, spelled otherwise: held out, so only split train evaluates on it
    trained_on = f"dataset.source='{unsplit}'"
    (problems,) = run_config_problems(tmp_path, trained_on, "+evaluation={samples: 2}")
    assert problems.startswith(f"evaluation.dataset.split: '{unsplit}' has no split 'test' (it has split train)")
    assert "set split: train" in problems
    spelled = f"{tmp_path}/./problems.jsonl"
    (problems,) = run_config_problems(tmp_path, trained_on, f"+evaluation={{dataset: {{source: '{spelled}'}}}}")
    assert "no held-out split" in problems
    explicit = "+evaluation={dataset: {split: train}}"
    assert run_config_problems(tmp_path, trained_on, explicit) == []


def test_atlas_train_exits_2_before_training(tmp_path, capsys):
    manifest = teacher({"dataset": {"source": "builtin://multistep", "split": "validation"}, "samples": 1099511627776})
    path = tmp_path / "teacher.yaml"
    path.write_text(yaml.safe_dump(manifest))
    assert atlas(["train", str(path), f"output_dir={tmp_path / 'out'}"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    fields = sorted(line.split(":")[1].strip() for line in lines)
    assert fields == ["spec.evaluation.dataset.split", "spec.evaluation.samples"]  # a manifest: named as written
    assert not (tmp_path / "out").exists()


def test_trainer_start_up_refuses_non_finite_reward_weights(tmp_path):
    for weight in (".nan", ".inf", "-1e400"):
        problems = run_config_problems(tmp_path, "reward.funcs=[exact_match]", f"reward.weights=[{weight}]")
        assert [p.split(":")[0] for p in problems] == ["reward.weights[0]"], problems


# ------------------------------------------------------------------ splits


def _questions(dataset) -> set[str]:
    return {json.dumps(row["prompt"]) for row in dataset}


def test_every_builtin_of_the_contract_has_one_loader():
    assert sorted(data.BUILTIN_DATASETS) == sorted(BUILTIN_SOURCES)


@pytest.mark.parametrize("source", [s for s in BUILTIN_SOURCES if "teacher-" not in s])
def test_no_evaluation_problem_of_a_builtin_is_in_its_training_split(source):
    held_out = _questions(data.load_evaluation_dataset(source, "test", None, default_problems=2000))
    trained = _questions(load_run_dataset(source, "train", "grpo", num_samples=5000))
    assert held_out and trained and not held_out & trained


def test_sft_builtins_train_only_on_training_problems():
    from atlas_core.tasks import arithmetic, multistep

    held_out = {row["question"] for row in arithmetic.make_arithmetic_dataset(2000, split="test")}
    for source in ("builtin://arithmetic", "builtin://teacher-arithmetic"):
        texts = json.dumps(load_run_dataset(source, "train", "sft", num_samples=2000).to_list())
        assert not [q for q in held_out if f"What is {q}?" in texts], source
    held_out = {row["question"] for row in multistep.make_multistep_dataset(multistep.test_mix_size(), "test")}
    for source in ("builtin://multistep", "builtin://teacher-multistep"):
        texts = json.dumps(load_run_dataset(source, "train", "sft", num_samples=2000).to_list())
        assert not [q for q in held_out if f"What is {q}?" in texts], source
    with pytest.raises(DatasetSourceError, match="dataset.split: 'builtin://arithmetic' has split train"):
        load_run_dataset("builtin://arithmetic", "test", "sft")


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_files_split_column_a_file_per_split_or_refused(tmp_path):
    rows = [
        {"prompt": f"What is {i} + 1?", "ground_truth": str(i + 1), "split": ["train", "test"][i % 2]} for i in range(6)
    ]
    column = _write(tmp_path / "split.jsonl", rows)
    assert [r["ground_truth"] for r in load_run_dataset(str(column), "test")] == ["2", "4", "6"]
    with pytest.raises(
        DatasetSourceError, match=r"dataset.split: .* has no split 'validation' \(it has splits test, train\)"
    ):
        load_run_dataset(str(column), "validation")

    folder = tmp_path / "per-split"
    folder.mkdir()
    _write(folder / "train.jsonl", rows[:2])
    _write(folder / "test.jsonl", rows[2:3])
    assert len(load_run_dataset(str(folder), "test")) == 1
    with pytest.raises(DatasetSourceError, match="has no split 'dev'"):
        load_run_dataset(str(folder), "dev")

    whole = _write(tmp_path / "whole.jsonl", [{"prompt": "What is 1 + 1?", "ground_truth": "2"}])
    assert len(load_run_dataset(str(whole), "train")) == 1
    with pytest.raises(DatasetSourceError, match="no held-out split"):  # the evaluation's source is the training's
        data.load_evaluation_dataset(str(whole), "test", None, default_problems=10, training_source=str(whole))
    notes = []  # named as the evaluation set (atlas eval, another source than the training's): evaluated whole
    assert len(data.load_evaluation_dataset(str(whole), "test", None, 10, notes=notes)) == 1
    assert notes == [f"split test: '{whole}' has no 'split' column; evaluating the whole file"]


def test_an_empty_file_says_so(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DatasetSourceError) as raised:
        load_run_dataset(str(tmp_path / "empty.jsonl"), "train")
    assert str(raised.value) == f"dataset.source: '{tmp_path / 'empty.jsonl'}' is empty (expected one problem per row)"
