"""The typed run contract (atlas_contract/run_config.py, atlas_contract/teaching.py): run.yaml as the operator renders
it parses back into the RunConfig it was built from, for every example and test manifest; the trainer reads the same
settings through Hydra; a wrong value names its full path; every copy of the teaching settings is the contract's."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml
from atlas_operator.render.config_map import config_map, typed_run_config, yaml_text
from atlas_operator.spec import TeachingSpec
from atlas_operator.validation import parse_run

from atlas_contract import defaults
from atlas_contract.errors import InvalidFields
from atlas_contract.names import RUN_CONFIG_FILE
from atlas_contract.run_config import DatasetConfig, RewardConfig, RunConfig
from atlas_contract.teaching import TEACHING_FIELDS, TeachingSettings
from harness.env import REPO
from harness.manifests import teacher, tiny_training, training, with_spec
from tests.unit.test_contract import BASE, manifest
from tests.unit.test_preflight import TEACHER
from tests.unit.test_render_jobset import JOBSET_RUNS


def _examples() -> dict[str, dict]:
    runs = {}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document and document.get("kind") in ("AtlasTraining", "AtlasTeacher"):
                runs[f"examples/{path.name}#{index}"] = document
    return runs


def _builders() -> dict[str, dict]:
    """The manifests the operator tests build (harness/manifests.py, test_contract.BASE, the JobSet runs of
    test_render_jobset, test_preflight's teacher), and the teaching and evaluation variants."""
    runs = {
        "training": training(),
        "tiny_training": tiny_training("tiny"),
        "teacher": teacher(),
        "teacher-evaluated": with_spec(
            teacher(), evaluation={"dataset": {"source": "hf://org/held-out", "split": "validation"}, "limit": 50}
        ),
        "teacher-teaching-and-student-temperature": with_spec(
            teacher(),
            teaching={"maxProbeTokens": 16, "efficiencyHorizon": 100, "studentSamples": 4},
            training={"perDeviceTrainBatchSize": 4, "numGenerations": 4, "extra": {"student_temperature": 0.2}},
        ),
        "preflight-teacher": copy.deepcopy(TEACHER),
    }
    runs.update({f"base-{kind}-{algorithm}": manifest(kind, spec) for (kind, algorithm), spec in BASE.items()})
    runs.update({f"jobset-{name}": run for name, run in JOBSET_RUNS.items()})
    return runs


RUNS = {**_examples(), **_builders()}


@pytest.mark.parametrize("name", list(RUNS))
def test_rendered_run_yaml_parses_back_into_the_run_config_it_was_built_from(name):
    run = parse_run(copy.deepcopy(RUNS[name]))
    text = config_map(run)["data"][RUN_CONFIG_FILE]
    built = typed_run_config(run)
    parsed = RunConfig.from_dict(yaml.safe_load(text))
    assert parsed == built
    assert parsed.teaching == built.teaching and parsed.evaluation == built.evaluation
    assert parsed.to_dict() == yaml.safe_load(text)
    title = text.splitlines()[0][2:].split(" (rendered")[0]
    assert yaml_text(parsed.to_dict(), title) == text  # byte for byte, key order included
    assert (parsed.teaching is not None) == (run.kind == "AtlasTeacher")


def test_the_teaching_a_run_states_is_the_teaching_it_parses_to():
    run = parse_run(RUNS["teacher-teaching-and-student-temperature"])
    assert typed_run_config(run).teaching == TeachingSettings(
        max_probe_tokens=16, efficiency_horizon=100, student_samples=4, student_temperature=0.2
    )
    assert RunConfig.from_dict(yaml.safe_load(config_map(run)["data"][RUN_CONFIG_FILE])).evaluation is None


@pytest.mark.parametrize("name", sorted(_examples()))
def test_the_trainer_reads_the_examples_run_yaml_as_the_operator_wrote_it(name, tmp_path):
    """Through Hydra (train.yaml's defaults merged in) to the contract's RunConfig: the same teaching, evaluation,
    trainer fields, model and data."""
    from atlas_core.training.load_config import load_run_config, parse_run_config

    run = parse_run(copy.deepcopy(RUNS[name]))
    path = tmp_path / "run.yaml"
    path.write_text(config_map(run)["data"][RUN_CONFIG_FILE])
    read = parse_run_config(load_run_config([f"recipe={path}"]))
    built = typed_run_config(run)
    assert (read.teaching, read.evaluation, read.trainer) == (built.teaching, built.evaluation, built.trainer)
    assert (read.model, read.student, read.reward, read.output_dir) == (
        built.model,
        built.student,
        built.reward,
        built.output_dir,
    )
    assert (read.dataset.source, read.dataset.split) == (built.dataset.source, built.dataset.split)


# ------------------------------------------------------------------ a wrong value names its full path


def _teacher_run_yaml() -> dict:
    return yaml.safe_load(config_map(parse_run(teacher()))["data"][RUN_CONFIG_FILE])


def _set(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, key = path.split(".")
    target = raw
    for parent in parents:
        target = target.setdefault(parent, {})
    target[key] = value
    return raw


MISTAKES = [
    ("trainer.student_temperature", -1, "trainer.student_temperature: expected a number >= 0, got -1"),
    ("trainer.student_temperature", "warm", "trainer.student_temperature: expected a finite number, got 'warm'"),
    ("trainer.max_guidance_tokens", 5, "trainer.max_guidance_tokens: expected a number >= 10, got 5"),
    ("trainer.student_samples", 1.5, "trainer.student_samples: expected a whole number, got 1.5"),
    ("trainer.efficiency_horizon", 0, "trainer.efficiency_horizon: expected a number > 0, got 0"),
    ("evaluation.samples", 0, "evaluation.samples: expected a number >= 1, got 0"),
    ("evaluation.limit", "all", "evaluation.limit: expected a whole number, got 'all'"),
    ("evaluation.dataset.split", "", "evaluation.dataset.split: expected a non-empty string, got ''"),
    ("evaluation.dataset.sourc", "x", "evaluation.dataset.sourc: unknown configuration key (known: source, split)"),
    ("evaluation", "yes", "evaluation: expected a mapping (dataset, samples, limit) or null, got 'yes'"),
    ("dataset.num_samples", 0, "dataset.num_samples: expected a whole number >= 1, got 0"),
    ("dataset.guided_fraction", 2, "dataset.guided_fraction: expected a number in [0, 1], got 2"),
    ("reward.funcs", "exact_match", "reward.funcs: expected a list of names, got 'exact_match'"),
    ("algorithm", "ppo", "algorithm: expected one of grpo, sft, teacher, got 'ppo'"),
    ("student", None, "student: required for algorithm teacher"),
    ("model", None, "model: required"),
    ("trainer", [1], "trainer: expected a mapping (GRPOConfig or SFTConfig fields), got [1]"),
    ("rsume", "auto", "rsume: unknown configuration key (known: algorithm, dataset, evaluation, model, "),
]


@pytest.mark.parametrize(("path", "value", "expected"), MISTAKES, ids=[f"{p}={v!r}" for p, v, _ in MISTAKES])
def test_a_wrong_value_in_run_yaml_names_its_full_path(path, value, expected):
    with pytest.raises(InvalidFields) as caught:
        RunConfig.from_dict(_set(_teacher_run_yaml(), path, value))
    assert [p for p in caught.value.problems if p.startswith(expected)], caught.value.problems


def test_every_problem_of_a_run_yaml_is_listed_at_once():
    raw = _set(_teacher_run_yaml(), "trainer.student_temperature", -0.5)
    raw = _set(raw, "evaluation.samples", 0)
    raw = _set(raw, "dataset.seed", "zero")
    with pytest.raises(InvalidFields) as caught:
        RunConfig.from_dict(raw)
    assert [p.split(":")[0] for p in caught.value.problems] == [
        "dataset.seed",
        "trainer.student_temperature",
        "evaluation.samples",
    ]


def test_the_trainer_names_a_wrong_teaching_value_by_its_run_yaml_path_once(tmp_path):
    from atlas_core.training.load_config import load_run_config, validate_run_config

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(_set(_teacher_run_yaml(), "trainer.student_temperature", -1)))
    problems = validate_run_config(load_run_config([f"recipe={path}", f"output_dir={tmp_path / 'out'}"]))
    assert [p for p in problems if p.startswith("trainer.student_temperature")] == [
        "trainer.student_temperature: expected a number >= 0, got -1"
    ]


# ------------------------------------------------------------------ one definition


def test_the_trainers_teaching_fields_are_the_contracts():
    """GRPOConfig's teaching fields are generated from TeachingSettings: the same names, defaults and help."""
    from atlas_core.training.algorithms.grpo_config import GRPOConfig, TeachingArguments

    contract = {f.name: (f.default, f.metadata["help"]) for f in dataclasses.fields(TeachingSettings)}
    trainer = {f.name: (f.default, f.metadata["help"]) for f in dataclasses.fields(TeachingArguments)}
    assert trainer.pop("student_offload")[0] is False
    assert trainer == contract
    assert set(TEACHING_FIELDS) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    assert TeachingSettings() == TeachingSettings(**defaults.TEACHING)


def test_what_mypy_sees_of_the_teaching_fields_is_the_generated_class():
    """grpo_config.py declares TeachingArguments for mypy (under TYPE_CHECKING: make_dataclass is opaque to it): the
    same fields, in order, with the same types and defaults as the class generated at run time."""
    import ast
    import typing

    from atlas_core.training.algorithms import grpo_config

    tree = ast.parse(Path(grpo_config.__file__).read_text())
    declared = next(
        node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "TeachingArguments"
    )
    seen = [
        (a.target.id, ast.unparse(a.annotation), ast.unparse(a.value))
        for a in declared.body
        if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and a.value is not None
    ]
    hints = typing.get_type_hints(grpo_config.TeachingArguments)
    generated = [
        (f.name, hints[f.name].__name__, f"TEACHING['{f.name}']" if f.name in TEACHING_FIELDS else repr(f.default))
        for f in dataclasses.fields(grpo_config.TeachingArguments)
    ]
    assert seen == generated


def test_the_crds_teaching_fields_are_the_contracts():
    """spec.teaching's fields are TeachingSettings fields, with the same default and range (the student's temperature
    is set in spec.training.extra)."""
    contract = {f.name: f.default for f in dataclasses.fields(TeachingSettings)}
    for f in dataclasses.fields(TeachingSpec):
        assert f.name in contract, f.name
        assert TeachingSpec().__dict__[f.name] == contract[f.name], f.name
        assert {key: f.metadata[key] for key in defaults.LIMITS[f.name].schema()} == defaults.LIMITS[f.name].schema()
    assert set(contract) - {f.name for f in dataclasses.fields(TeachingSpec)} == {"student_temperature"}


def test_train_yaml_states_the_keys_the_contract_reads():
    """The trainer's primary config lists the run.yaml keys, its dataset and reward sections the contract's fields."""
    primary = yaml.safe_load(Path(REPO / "atlas_core" / "configs" / "train.yaml").read_text())
    assert set(primary) - {"defaults"} == set(RunConfig.KEYS)
    assert set(primary["dataset"]) == {f.name for f in dataclasses.fields(DatasetConfig)}
    assert set(primary["reward"]) == {f.name for f in dataclasses.fields(RewardConfig)}
