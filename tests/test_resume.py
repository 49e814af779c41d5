"""Checkpoint and resume: rerunning the same command after a kill continues the global step."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from conftest import PYTHON, python_env

from atlas_core.training.resume import RankView, decide, rank_view


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
    checkpoint_step = max(rank_view(out, rank=0, world_size=1, deepspeed=False).loadable())
    assert checkpoint_step >= 6 and max(before) < 24

    rerun = subprocess.run(command(out, 24), cwd=tmp_path, env=python_env(), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    after = logged_steps(out)[len(before) :]
    # The second run starts right after the checkpoint and trains each remaining step once.
    assert after == list(range(checkpoint_step + 1, 25))
    state = json.loads((out / "checkpoint-24" / "trainer_state.json").read_text())
    assert state["global_step"] == 24


def test_partial_checkpoint_is_skipped(tmp_path):
    def checkpoint(step, files):
        (tmp_path / f"checkpoint-{step}").mkdir()
        for name in files:
            (tmp_path / f"checkpoint-{step}" / name).write_text("x")

    whole = ("trainer_state.json", "rng_state.pth", "model.safetensors", "optimizer.pt")
    checkpoint(3, whole)
    checkpoint(6, whole[1:])  # killed while saving: no trainer_state.json
    (tmp_path / "checkpoint-10-old").mkdir()
    view = rank_view(tmp_path, rank=0, world_size=1, deepspeed=False)
    assert view.checkpoints == {3: [], 6: ["trainer_state.json"]}
    assert decide([view], "auto").step == 3
    assert rank_view(tmp_path / "missing", 0, 1, False).checkpoints == {}


def test_one_decision_from_every_ranks_view():
    ok, shard = [], ["global_step6/*zero_pp_rank_1_*optim_states.pt (this rank's ZeRO shard)"]
    # Per-node folders: rank 0 has checkpoint-6, rank 1 only its shard of it (no trainer state).
    per_node = [RankView(0, "pod-0", "/c", {6: ok}), RankView(1, "pod-1", "/c", {6: ["trainer_state.json", "latest"]})]
    stop = decide(per_node, "auto")
    assert stop.step is None and "rank 1 on pod-1 cannot: trainer_state.json, latest missing" in stop.stop
    assert "spec.checkpoint.pvc" in stop.stop and "ReadWriteMany" in stop.stop
    over = decide(per_node, "start_over")
    assert over.step is None and over.stop is None and "EVERY RANK STARTS OVER" in over.notes[-1]
    # Shared folder, rank 1's shard of the newest checkpoint deleted: all fall back to checkpoint-3.
    shared = [RankView(0, "a", "/c", {3: ok, 6: ok}), RankView(1, "b", "/c", {3: ok, 6: shard})]
    fallback = decide(shared, "auto")
    assert fallback.step == 3 and fallback.stop is None
    assert "zero_pp_rank_1" in fallback.notes[0] and "resumes from checkpoint-3" in fallback.notes[1]
    assert decide(shared, "never").step is None
    assert decide([RankView(0, "a", "/c", {}), RankView(1, "b", "/c", {})], "auto") == decide([], "auto")
