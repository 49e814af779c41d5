"""Checkpoint and resume: rerunning the same command after a kill continues the global step."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from conftest import PYTHON, python_env

from atlas_core.training.runner import last_checkpoint


def command(out, max_steps):
    return [
        PYTHON,
        "-m",
        "atlas_core.cli.train",
        "recipe=tiny_grpo",
        f"output_dir={out}",
        f"trainer.max_steps={max_steps}",
        "trainer.save_steps=3",
        "trainer.metrics_port=0",
        "trainer.per_device_train_batch_size=16",
    ]


def logged_steps(out) -> list[int]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "loss" in r]  # per-step logs (the final summary has train_loss)


def test_rerun_after_kill_resumes_from_newest_checkpoint(tmp_path, atlas_cache):
    out = tmp_path / "run"
    proc = subprocess.Popen(command(out, 24), cwd=tmp_path, env=python_env(), stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        # Wait (polling the file system, not sleeping for a fixed time) until the second checkpoint is complete.
        while not (out / "checkpoint-6" / "trainer_state.json").exists():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint-6 within 240 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    before = logged_steps(out)
    resumed_from = last_checkpoint(out)
    checkpoint_step = int(resumed_from.rsplit("-", 1)[1])
    assert checkpoint_step >= 6 and max(before) < 24

    rerun = subprocess.run(command(out, 24), cwd=tmp_path, env=python_env(), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = logged_steps(out)[len(before) :]
    # The second run starts right after the checkpoint and trains each remaining step once.
    assert after == list(range(checkpoint_step + 1, 25))
    state = json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())
    assert state["global_step"] == 24


def test_partial_checkpoint_is_skipped(tmp_path):
    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-6").mkdir()  # killed while saving: no trainer_state.json
    (tmp_path / "checkpoint-10-old").mkdir()
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-3")
    assert last_checkpoint(tmp_path / "missing") is None
