"""``atlas demo`` at a small size: every stage (SFT warm-up, GRPO, teacher warm-up, teacher GRPO, the teaching
evaluation), live Prometheus, summary tables, metrics.jsonl, PNG. A few steps show the stages work together;
that they learn, and the teaching targets, are measured on the full demo by ``bench/teaching_eval.py``."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from harness.env import PYTHON, free_port, python_env

pytestmark = pytest.mark.serial  # the whole demo, timed: the serial lane (tests/conftest.py)

#: The test's demo: small, with more GRPO steps than the endpoint check needs to see a reward. 100 warm-up steps are
#: enough for GRPO rewards that vary (most steps score some answers; 200 took twice as long for the same checks).
SIZE = {"--sft-steps": 100, "--steps": 40, "--teacher-sft-steps": 100, "--teacher-steps": 20, "--eval-problems": 40}


def test_demo_end_to_end(tmp_path, atlas_cache):
    port = free_port()
    out = tmp_path / "demo"
    size = [str(item) for flag_value in SIZE.items() for item in flag_value]
    proc = subprocess.Popen(
        [PYTHON, "-m", "atlas_cli.main", "demo", "--output", str(out), "--metrics-port", str(port), *size],
        cwd=tmp_path,
        env={key: value for key, value in python_env().items() if key != "COLUMNS"},  # piped: tables kept whole
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # While it runs, Prometheus on 127.0.0.1 serves the GRPO stage's reward.
        deadline, scraped = time.monotonic() + 600, None
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except (urllib.error.URLError, ConnectionError):
                body = ""
            if 'atlas_training_reward{kind="local",namespace="local",run="demo-grpo"}' in body:
                scraped = body
                break
            time.sleep(0.2)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    assert scraped is not None, "the metrics endpoint never showed the GRPO reward"

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {r["stage"] for r in records} == {"sft", "grpo", "teacher-sft", "teacher"}
    steps = {stage: max(r["step"] for r in records if r["stage"] == stage) for stage in ("sft", "teacher-sft")}
    assert steps == {"sft": SIZE["--sft-steps"], "teacher-sft": SIZE["--teacher-sft-steps"]}
    rewards = [r["reward"] for r in records if r["stage"] == "grpo" and "reward" in r]
    assert len(rewards) == SIZE["--steps"] and all(0 <= reward <= 1 for reward in rewards)
    assert statistics.pstdev(rewards) > 0  # the GRPO stage is scored on its problems, not on a constant
    teaching = [r for r in records if r["stage"] == "teacher" and "teaching/reward" in r]
    assert len(teaching) == SIZE["--teacher-steps"]
    # TRL's reward is a float32 mean of the same rewards: equal up to float32 rounding.
    assert all(math.isclose(r["reward"], r["teaching/reward"], rel_tol=1e-6, abs_tol=1e-6) for r in teaching)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "grpo" / "model.safetensors").exists() and (out / "teacher" / "model.safetensors").exists()
    summary_rows = [line for line in output.splitlines() if line.startswith(("│ sft", "│ grpo", "│ teacher"))]
    assert len(summary_rows) == 4 and f" {SIZE['--steps']} " in summary_rows[1], output[-3000:]
    assert "wall time" in output
    assert "Traceback" not in output
    # the evaluation stage: both teachers on the same held-out problems, the same student alone
    reports = {
        name: json.loads((out / "eval" / name / "eval.json").read_text()) for name in ("sft-teacher", "grpo-teacher")
    }
    for name, report in reports.items():
        lines = (out / "eval" / name / "problems.jsonl").read_text().splitlines()
        assert report["problems"] == len(lines) == SIZE["--eval-problems"] and report["split"] == "test"
    assert reports["sft-teacher"]["student_accuracy"] == reports["grpo-teacher"]["student_accuracy"]
    table = output[output.index("teaching evaluation") :]
    assert "+ SFT-only teacher" in table and "+ GRPO teacher" in table and "non-degradation" in table
    assert "…" not in output  # no header or cell cut to 80 columns
    # the endpoint is gone once the demo has finished
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
        raise AssertionError("metrics endpoint still up after the demo ended")
    except (urllib.error.URLError, ConnectionError):
        pass
