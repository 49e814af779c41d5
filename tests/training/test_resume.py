"""Checkpoint and resume: rerunning the same command after a kill continues the global step."""

from __future__ import annotations

import json
import signal
import subprocess
import time

from atlas_core.training.resume import RankView, decide, rank_view
from harness.env import PYTHON, python_env


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


def write_checkpoint(root, step, skip=()):
    """A checkpoint folder with the files a single process resumes from (real formats)."""
    import torch
    from safetensors.torch import save_file

    folder = root / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    writers = {
        "trainer_state.json": lambda p: p.write_text(json.dumps({"global_step": step, "max_steps": 12})),
        "rng_state.pth": lambda p: torch.save({"cpu": torch.random.get_rng_state()}, p),
        "optimizer.pt": lambda p: torch.save({"state": {}}, p),
        "model.safetensors": lambda p: save_file({"w": torch.zeros(64)}, str(p)),
    }
    for name, write in writers.items():
        if name not in skip:
            write(folder / name)
    return folder


def test_incomplete_or_corrupt_checkpoints_are_skipped(tmp_path):
    write_checkpoint(tmp_path, 3)
    write_checkpoint(tmp_path, 6, skip=("trainer_state.json",))  # killed while saving
    weights = write_checkpoint(tmp_path, 9) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # truncated
    (write_checkpoint(tmp_path, 10) / "trainer_state.json").write_text('{"global_st')  # truncated
    optimizer = write_checkpoint(tmp_path, 11) / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:200])
    (tmp_path / "checkpoint-12-old").mkdir()
    view = rank_view(tmp_path, rank=0, world_size=1, deepspeed=False)
    assert view.checkpoints[3] == []
    assert view.checkpoints[6] == ["trainer_state.json"]
    assert view.checkpoints[9] == ["model.safetensors (does not load: SafetensorError)"]
    assert view.checkpoints[10] == ["trainer_state.json (does not load: JSONDecodeError)"]
    assert view.checkpoints[11] == ["optimizer.pt (does not load: BadZipFile)"]
    decision = decide([view], "auto")
    assert decision.step == 3 and decision.stop is None
    assert "checkpoint-11 is complete for" not in " ".join(decision.notes)
    assert rank_view(tmp_path / "missing", 0, 1, False).checkpoints == {}


def test_one_decision_from_every_ranks_view():
    ok, shard = [], ["global_step6/*zero_pp_rank_1_*optim_states.pt (this rank's ZeRO shard)"]
    # Per-node folders: rank 0 has checkpoint-6, rank 1 only its shard of it (no trainer state).
    per_node = [RankView(0, "pod-0", "/c", {6: ok}), RankView(1, "pod-1", "/c", {6: ["trainer_state.json", "latest"]})]
    stop = decide(per_node, "auto")
    assert stop.step is None and "rank 1 on pod-1: trainer_state.json, latest missing or broken" in stop.stop
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


# --------------------------------------------------------------------------- resume that means it


def run(out, max_steps, *extra, env=None, cwd=None):
    return subprocess.run(
        [*command(out, max_steps), *extra], cwd=cwd, env=python_env(**(env or {})), capture_output=True, text=True
    )


def run_here(out, max_steps, *extra, capfd) -> tuple[int, str]:
    """The same command's main() in this process (``$ATLAS_RUN_UID`` as the test set it): its exit status and
    stderr. For the re-runs that train nothing (a finished run's no-op, a refused resume), which decide before any
    step; a process each cost a Python start and the training library's imports, most of their time. The runs
    that train, and the ones killed, are processes (``run``)."""
    from atlas_core.cli.train import main

    code = main([*command(out, max_steps)[3:], *extra])
    return code, capfd.readouterr().err


def test_finished_run_rerun_is_a_no_op_and_other_runs_or_settings_are_refused(
    tmp_path, atlas_cache, monkeypatch, capfd
):
    out = tmp_path / "run"
    first = run(out, 6, env={"ATLAS_RUN_UID": "uid-1"})
    assert first.returncode == 0, first.stderr[-2000:]
    identity = json.loads((out / "checkpoint-6" / "atlas_run.json").read_text())
    assert identity["uid"] == "uid-1" and identity["settings"]["trainer.learning_rate"] > 0
    steps = logged_steps(out)

    # Twice more, as a restarted finished job would be: nothing is trained, and it says so.
    monkeypatch.setenv("ATLAS_RUN_UID", "uid-1")
    for _ in range(2):
        code, stderr = run_here(out, 6, capfd=capfd)
        assert code == 0, stderr[-2000:]
        assert "already finished" in stderr and "nothing trained" in stderr
    assert logged_steps(out) == steps and not (out / "checkpoint-7").exists()

    # More steps with other settings: refused, naming the setting (the checkpoint's optimizer keeps the old one).
    code, stderr = run_here(out, 9, "trainer.learning_rate=0.123", capfd=capfd)
    assert code == 2
    assert "trainer.learning_rate" in stderr and "0.123 now" in stderr
    assert "Traceback" not in stderr
    # A different run (the same name re-created on the cluster: another uid; or another name): refused.
    monkeypatch.setenv("ATLAS_RUN_UID", "uid-2")
    code, stderr = run_here(out, 9, capfd=capfd)
    assert code == 2 and "another run" in stderr and "uid-1" in stderr
    monkeypatch.setenv("ATLAS_RUN_UID", "uid-1")
    code, stderr = run_here(out, 9, "run_name=someone-else", capfd=capfd)
    assert code == 2 and "another run" in stderr
    assert logged_steps(out) == steps
    # The same run with more steps continues from its last checkpoint.
    more = run(out, 9, env={"ATLAS_RUN_UID": "uid-1"})
    assert more.returncode == 0, more.stderr[-2000:]
    assert logged_steps(out) == [*steps, 7, 8, 9]

    # A pod killed while saving leaves a truncated file: that checkpoint is skipped, saying why.
    weights = out / "checkpoint-9" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    after_kill = run(out, 10, env={"ATLAS_RUN_UID": "uid-1"})
    assert after_kill.returncode == 0, after_kill.stderr[-2000:]
    assert "skipped checkpoint-9" in after_kill.stderr and "model.safetensors (does not load" in after_kill.stderr
    assert logged_steps(out) == [*steps, 7, 8, 9, 7, 8, 9, 10]


def test_one_run_per_output_folder(tmp_path, atlas_cache, capfd):
    out = tmp_path / "run"
    holder = subprocess.Popen(command(out, 500), env=python_env(), stderr=subprocess.PIPE, text=True)
    try:
        lock = out / ".atlas-run.lock"
        deadline = time.monotonic() + 240
        while not (lock.exists() and lock.read_text().startswith("pid")):
            assert holder.poll() is None, holder.stderr.read()[-2000:]
            assert time.monotonic() < deadline, "the first run never took the output folder"
            time.sleep(0.05)
        code, stderr = run_here(out, 2, capfd=capfd)  # another process than the holder: this one
        assert code == 2
        assert f"is in use by another run (pid {holder.pid} on" in stderr
    finally:
        holder.kill()
        holder.wait(timeout=30)
    # Killed without clean-up: the kernel dropped the lock, so the folder is free again.
    third = run(out, 2, "resume=never")
    assert third.returncode == 0, third.stderr[-2000:]
