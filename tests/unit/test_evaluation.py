"""The two-pass evaluation: the bundled teaching task's splits, the figures, the result a run reports (the evaluation
after training of a real teacher run: tests/training/test_evaluation_run.py)."""

from __future__ import annotations

import statistics

import pytest

from atlas_contract import results
from atlas_core.answers import exact_match_reward
from atlas_core.evaluation_figures import figures, paired_bootstrap
from atlas_core.tasks import multistep
from atlas_core.teaching.prompts import task_text, withhold_answer
from atlas_core.training.demonstrations import make_student_sft_dataset, make_teacher_sft_dataset

# ------------------------------------------------------------------ the bundled task


def _questions(rows) -> set[str]:
    """The problem of each row: its question, or for warm-up rows the task inside the prompt."""
    found = set()
    for row in rows:
        text = task_text(row["prompt"])
        if "Task:\n" in text:  # a teacher prompt: the task follows "Task:"
            text = text.split("Task:\n", 1)[1].split("\n", 1)[0]
        found.add(text.split("What is ", 1)[1].split("?", 1)[0])
    return found


def test_test_split_is_disjoint_from_every_training_split():
    test = _questions(multistep.make_multistep_dataset(200, "test"))
    assert len(test) == 200  # distinct problems
    trained_on = (
        _questions(multistep.make_multistep_dataset(20000, "train", seed=3))
        | _questions(make_student_sft_dataset(20000, seed=0))
        | _questions(make_teacher_sft_dataset("multistep", 20000, seed=0))
    )
    assert trained_on and not (test & trained_on)
    # every training problem was drawn: the training split is all the rest
    every = {r["question"] for kind in ("one-step", "two-step") for r in multistep.problems(kind, "train")}
    assert trained_on == every


def test_test_mix_keeps_two_fifths_one_step_and_answers_are_right():
    rows = multistep.make_multistep_dataset(150, "test")
    assert sum(r["kind"] == "one-step" for r in rows) == 60
    for row in rows:
        assert multistep.split_of(row["question"]) == "test"
        assert int(row["ground_truth"]) == sum(int(x) for x in row["question"].split(" + "))
    assert rows == multistep.make_multistep_dataset(150, "test")  # a fixed order: limit keeps the mix
    with pytest.raises(ValueError, match="n: the test split has"):
        multistep.make_multistep_dataset(100000, "test")


def test_step_guidance_teaches_without_telling_and_the_student_target_uses_it():
    for row in multistep.problems("two-step", "train")[:200]:
        guidance = multistep.step_guidance(row)
        a, b, c = (int(x) for x in row["question"].split(" + "))
        assert f"{a} + {b} = {a + b}" in guidance
        if a + b != a + b + c:
            assert withhold_answer(guidance, row["ground_truth"]) == guidance  # the answer is not in it
        solution = multistep.student_solution(row, guided=True)
        assert solution.startswith(f"{a + b} + {c} = ") and exact_match_reward([solution], [row["ground_truth"]]) == [
            1.0
        ]
    # one-step: the "first step" is the answer, which the protocol masks
    row = multistep.problems("one-step", "train")[0]
    assert "[withheld]" in withhold_answer(multistep.step_guidance(row), row["ground_truth"])


# ------------------------------------------------------------------ figures


def _record(alone, guided, capability="weak", tokens=5):
    return {
        "accuracy_alone": alone,
        "accuracy_guided": guided,
        "capability": capability,
        "guidance_tokens": tokens,
        "answers_alone": ["\\boxed{1}", "no answer here"],
        "answers_guided": ["\\boxed{2}", "\\boxed{3}"],
        "tokens_alone": [4, 6],
        "tokens_guided": [3, 3],
        "teaching_reward": guided - alone,
    }


def test_figures_are_the_per_problem_means():
    records = [_record(0.0, 1.0), _record(0.5, 0.5), _record(1.0, 0.5), _record(0.0, 0.5)]
    f = figures(records, seed=1)
    assert f.problems == 4
    assert f.student_accuracy == pytest.approx(0.375) and f.guided_accuracy == pytest.approx(0.625)
    assert f.accuracy_delta == pytest.approx(0.25)
    assert f.non_degradation_rate == pytest.approx(0.75) and f.improvement_rate == pytest.approx(0.5)
    assert f.mean_degradation == pytest.approx(0.5)
    assert f.completion_rate_alone == pytest.approx(0.5) and f.completion_rate_guided == pytest.approx(1.0)
    assert f.student_tokens_alone_mean == pytest.approx(5.0) and f.student_tokens_guided_mean == pytest.approx(3.0)
    assert f.accuracy_delta_low <= f.accuracy_delta <= f.accuracy_delta_high
    assert figures([]).problems == 0 and figures([]).student_accuracy is None


def test_paired_bootstrap_interval():
    # every problem gains exactly 0.2: resampling pairs cannot move the mean
    low, high = paired_bootstrap([0.1, 0.5, 0.3] * 20, [0.3, 0.7, 0.5] * 20)
    assert low == pytest.approx(0.2) and high == pytest.approx(0.2)
    # a noisy gain: the interval holds the mean, narrows with more problems, and is reproducible with a seed
    alone = [0.0, 1.0, 0.0, 1.0, 0.0] * 8
    guided = [1.0, 1.0, 0.0, 0.0, 1.0] * 8
    small = paired_bootstrap(alone, guided, seed=3)
    large = paired_bootstrap(alone * 10, guided * 10, seed=3)
    mean = statistics.mean(g - a for a, g in zip(alone, guided, strict=True))
    assert small[0] < mean < small[1] and large[0] < mean < large[1]
    assert large[1] - large[0] < small[1] - small[0]
    assert paired_bootstrap(alone, guided, seed=3) == small


# ------------------------------------------------------------------ the result a run reports


def test_result_message_round_trip_and_foreign_messages():
    report = {
        "problems": 200,
        "student_accuracy": 0.41,
        "guided_accuracy": 0.63,
        "accuracy_delta": 0.22,
        "accuracy_delta_low": 0.15,
        "accuracy_delta_high": 0.29,
        "non_degradation_rate": 0.98,
        "guidance_tokens_mean": 31.2,
        "by_capability": {"weak": {"problems": 3}},
    }
    message = results.result_message(120, 0.61, report)
    assert len(message.encode()) <= results.MAX_MESSAGE_BYTES
    assert results.parse_result_message(message) == {
        "step": 120,
        "reward": 0.61,
        "evaluation": {
            "problems": 200,
            "studentAccuracy": 0.41,
            "guidedAccuracy": 0.63,
            "accuracyDelta": 0.22,
            "accuracyDeltaLow": 0.15,
            "accuracyDeltaHigh": 0.29,
            "nonDegradationRate": 0.98,
            "guidanceTokensMean": 31.2,
        },
    }
    assert results.parse_result_message(results.result_message(7, float("nan"))) == {"step": 7}
    for foreign in ("", "Traceback (most recent call last):", "[1, 2]", '{"step": "x"}', '{"step": true}', "{" * 5000):
        assert results.parse_result_message(foreign) is None
    assert results.parse_result_message('{"step": 3, "reward": "high", "evaluation": {"problems": 1.5}}') == {"step": 3}


def test_evaluation_section_is_checked(tmp_path, capfd):
    """The command's main() in this process: the checks run before any training (tests/unit/test_cli.py runs the
    command itself to its exit status 2)."""
    from atlas_core.cli.train import main

    code = main(
        [
            "recipe=tiny_grpo",
            f"output_dir={tmp_path / 'x'}",
            "+evaluation={samples: 0, limit: -1, dataset: {source: '', bogus: 1}, extra: 2}",
        ]
    )
    stderr = capfd.readouterr().err
    assert code == 2
    errors = [line for line in stderr.splitlines() if line.startswith("error: evaluation")]
    text = "\n".join(errors)
    for expected in (
        "evaluation: only a teacher run",
        "evaluation.extra: unknown",
        "evaluation.dataset.bogus: unknown",
        "evaluation.dataset.source: expected a non-empty string",
        "evaluation.samples: expected a number >= 1, got 0",
        "evaluation.limit: expected a number >= 1, got -1",
    ):
        assert expected in text, stderr


def test_an_evaluation_that_fails_after_training_never_fails_the_run(tmp_path, monkeypatch, capsys):
    """A hub dataset is only known when it loads (here: offline): the trained run still exits 0 and reports
    its step, its reward and the evaluation's error, in one line, naming the evaluation's field."""
    from atlas_core.cli.train import finish_run
    from atlas_core.training.load_config import load_run_config, parse_run_config, validate_run_config
    from atlas_core.training.runner import FinishedRun

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ATLAS_RESULT_FILE", str(tmp_path / "termination-log"))
    cfg = load_run_config(
        ["recipe=tiny_teacher", f"output_dir={tmp_path}", "+evaluation={dataset: {source: 'hf://nobody/nothing'}}"]
    )
    assert validate_run_config(cfg) == []  # not knowable before the run
    trained = FinishedRun(output_dir=tmp_path, global_step=3, resumed_from=None, log_history=[{"reward": 0.25}])
    assert finish_run(parse_run_config(cfg), trained) == 0
    result = results.parse_result_message((tmp_path / "termination-log").read_text())
    assert (result["step"], result["reward"]) == (3, 0.25)
    assert result["evaluationError"].startswith("evaluation.dataset.source: cannot load 'hf://nobody/nothing'")
    assert "\n" not in result["evaluationError"] and "evaluation failed" in capsys.readouterr().err


def test_evaluation_settings_take_their_ranges_from_the_contract():
    """EvaluationRunSettings has no ranges of its own: each setting (its teaching ones the contract's
    TeachingSettings) is checked against atlas_contract.defaults.LIMITS (what the CRD states for spec.teaching and
    spec.evaluation), at both ends."""
    from atlas_contract.defaults import LIMITS
    from atlas_contract.teaching import TEACHING_FIELDS
    from atlas_core.evaluation import SETTING_LIMITS, EvaluationRunSettings

    ranges = {**SETTING_LIMITS, **{name: name for name in TEACHING_FIELDS}}
    assert set(ranges) == set(EvaluationRunSettings().flat()) - {"seed"}
    for name, key in ranges.items():
        limit = LIMITS[key]
        below = limit.minimum if limit.exclusive_minimum else limit.minimum - 1
        settings = EvaluationRunSettings.from_flat(**{name: below})
        assert [p for p in settings.problems() if p.startswith(f"{name}:")], name
        if limit.maximum is not None:
            assert EvaluationRunSettings.from_flat(**{name: limit.maximum + 1}).problems(), name
            assert not EvaluationRunSettings.from_flat(**{name: limit.maximum}).problems(), name
    assert EvaluationRunSettings.from_flat(student_temperature=11).problems() == []  # the contract has no upper bound
