"""The evaluation after training of a real teacher run: its result, its report, and a re-run that resumes it (the
evaluation itself: tests/unit/test_evaluation.py)."""

from __future__ import annotations

import json
import statistics
import subprocess

import pytest

from atlas_contract import results
from atlas_core.tasks import multistep
from harness.env import PYTHON, python_env


def test_teacher_run_evaluates_after_training_and_writes_its_result(tmp_path, atlas_cache, monkeypatch, capfd):
    result_file = tmp_path / "termination-log"
    out = tmp_path / "run"
    overrides = [
        "recipe=tiny_teacher",
        f"output_dir={out}",
        "dataset.source=builtin://multistep",
        "trainer.max_steps=2",
        "trainer.metrics_port=0",
        "+evaluation={samples: 2, limit: 5}",
    ]
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.cli.train", *overrides],
        env=python_env(ATLAS_RESULT_FILE=str(result_file)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = results.parse_result_message(result_file.read_text())
    assert result["step"] == 2
    report = json.loads((out / "evaluation" / "eval.json").read_text())
    lines = [json.loads(line) for line in (out / "evaluation" / "problems.jsonl").read_text().splitlines()]
    assert report["problems"] == len(lines) == 5 and report["split"] == "test" and report["samples"] == 2
    assert all(multistep.split_of(line["task"].split("What is ", 1)[1].split("?")[0]) == "test" for line in lines)
    assert report["student_accuracy"] == pytest.approx(statistics.mean(line["accuracy_alone"] for line in lines))
    assert result["evaluation"] == results.parse_result_message(results.result_message(2, None, report))["evaluation"]
    assert "evaluation: 5 problems" in proc.stderr

    # a re-run of the finished run trains nothing, resumes the finished evaluation and reports it again (the
    # command's main() in this process: it decides before any step; the run above is the command itself)
    from atlas_core.cli.train import main

    result_file.unlink()
    monkeypatch.setenv("ATLAS_RESULT_FILE", str(result_file))
    code = main(overrides)
    stderr = capfd.readouterr().err
    assert code == 0, stderr[-3000:]
    assert "already finished" in stderr
    assert results.parse_result_message(result_file.read_text()) == result
