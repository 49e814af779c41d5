"""A trainer process on SIGTERM, alone (atlas_core/training/preemption.py): the stop code, its report, the warning
about a grace period too short for a save, and a stop that lands on the run's last step. (Two nodes and a kill in
the middle of a save: tests/training/test_distributed.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from atlas_contract.names import STOP_EXIT_CODE
from atlas_contract.stops import parse_stop_report
from harness.env import REPO, python_env

pytestmark = pytest.mark.serial  # a SIGTERM's save, timed: the serial lane (tests/conftest.py)

TRAIN = [
    sys.executable,
    "-m",
    "atlas_core.cli.train",
    "recipe@_global_=tiny_grpo",
    "trainer.per_device_train_batch_size=4",
]


def steps(out) -> list[int]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r["step"] for r in map(json.loads, lines) if "loss" in r]


@pytest.mark.slow
def test_sigterm_stops_with_a_checkpoint_and_a_stop_landing_on_the_last_step_still_gives_the_final_model(
    tmp_path, atlas_cache, capfd
):
    out, result = tmp_path / "run", tmp_path / "termination-log"
    env = python_env(ATLAS_RESULT_FILE=str(result), ATLAS_TERMINATION_GRACE_SECONDS="0.001")
    proc = subprocess.Popen(
        [*TRAIN, f"output_dir={out}", "trainer.max_steps=200", "trainer.save_steps=1000"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while len(steps(out)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == STOP_EXIT_CODE, stderr[-3000:]
    report = parse_stop_report(result.read_text())
    stop = steps(out)[-1]
    assert report is not None and report.step == stop and report.signal == "SIGTERM"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    assert not (out / ".atlas-staging").exists() and not (out / "model.safetensors").exists()
    # The grace period (1 ms here) is shorter than a step and its save: said once, naming the field to raise.
    assert stderr.count("terminationGracePeriodSeconds (0.001 s) is shorter than a step and a save take") == 1
    assert "Raise spec.terminationGracePeriodSeconds" in stderr

    # Had the signal come at the run's last step, the checkpoint would be its end: a re-run trains nothing and
    # gives the final model from it (the same weights), as a run that ended normally would have left. (The
    # command's main() in this process: the re-run decides before any step; the run above is the command itself.)
    from atlas_core.cli.train import main

    code = main([*TRAIN[3:], f"output_dir={out}", f"trainer.max_steps={stop}"])
    stderr = capfd.readouterr().err
    assert code == 0, stderr[-3000:]
    assert "already finished" in stderr and steps(out)[-1] == stop
    from safetensors.torch import load_file

    final, saved = load_file(out / "model.safetensors"), load_file(out / f"checkpoint-{stop}" / "model.safetensors")
    assert final.keys() == saved.keys() and all((final[k] == saved[k]).all() for k in final)
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    assert not list(out.glob(".*.partial"))
