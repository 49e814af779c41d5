"""Multi-process training on CPU through the launch command trainer pods use (gloo, DeepSpeed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from harness.env import REPO, free_port, python_env
from harness.polling import wait_for

pytestmark = pytest.mark.serial  # several trainer processes, timed: the serial lane (tests/conftest.py)

# The PyTorchJob container's launch: the Kubeflow controller injects MASTER_ADDR, MASTER_PORT,
# PET_NNODES and PET_NODE_RANK; --mixed_precision no because this machine has no GPU.
POD_LAUNCH = (
    "accelerate launch --config_file accelerate/{preset}.yaml --mixed_precision no "
    "--num_machines $PET_NNODES --machine_rank $PET_NODE_RANK --num_processes {world} "
    "--main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT "
    "-m atlas_core.cli.train recipe@_global_=tiny_grpo {overrides}"
)


def start_nodes(
    preset: str, nodes: int, world: int, overrides: list[str], per_node: list[list[str]] | None = None, **env: str
) -> list[subprocess.Popen]:
    """``nodes`` pods of one job on this machine, each its own process group; ``per_node`` adds overrides to each
    (e.g. its own output_dir); ``env`` entries may hold ``{node}`` (e.g. a result file per pod)."""
    master_port = free_port()
    procs = []
    for node_rank in range(nodes):
        node_env = python_env(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(master_port),
            PET_NNODES=str(nodes),
            PET_NODE_RANK=str(node_rank),
            PATH=f"{REPO / '.venv' / 'bin'}:{python_env()['PATH']}",
            **{k: v.format(node=node_rank) for k, v in env.items()},
        )
        own = per_node[node_rank] if per_node else []
        command = POD_LAUNCH.format(preset=preset, world=world, overrides=" ".join([*overrides, *own]))
        procs.append(
            subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO,
                env=node_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def wait_nodes(procs: list[subprocess.Popen], timeout=420):
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout)[0])
    finally:
        kill_nodes([p for p in procs if p.poll() is None])
    return [p.returncode for p in procs], outputs


def kill_nodes(procs: list[subprocess.Popen], signum: int = signal.SIGKILL) -> None:
    """``signum`` to every process of each node: the launcher and all it started (torch elastic starts its
    workers in their own sessions, out of the launcher's process group)."""
    from atlas_cluster.node import descendants

    for pid in [pid for proc in procs for pid in (proc.pid, *descendants(proc.pid))]:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def launch_nodes(
    preset: str, nodes: int, world: int, overrides: list[str], timeout=420, per_node: list[list[str]] | None = None
):
    return wait_nodes(start_nodes(preset, nodes, world, overrides, per_node), timeout)


@pytest.mark.slow
def test_two_nodes_zero3_like_pods(tmp_path, atlas_cache):
    out = tmp_path / "run"
    metrics_port = free_port()
    codes, outputs = launch_nodes(
        "deepspeed_zero3",
        nodes=2,
        world=2,
        overrides=[
            f"output_dir={out}",
            "trainer.max_steps=3",
            "trainer.save_steps=3",
            "trainer.per_device_train_batch_size=4",
            f"trainer.metrics_port={metrics_port}",  # both nodes share 127.0.0.1: a second server would not bind
            "trainer.metrics_host=127.0.0.1",
        ],
    )
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    # Every rank trained to the end...
    assert "done: rank 0/2 at global step 3" in outputs[0]
    assert "done: rank 1/2 at global step 3" in outputs[1]
    # ... each saved its ZeRO-3 shard, and only rank 0 wrote the trainer state and the metrics file.
    shards = sorted(p.name for p in (out / "checkpoint-3" / "global_step3").glob("zero_pp_rank_*_model_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 3]  # three step logs and the final summary, each written once
    assert (out / "model.safetensors").exists()


@pytest.mark.slow
def test_one_node_two_processes_zero1(tmp_path, atlas_cache):
    out = tmp_path / "run"
    codes, outputs = launch_nodes(
        "deepspeed_zero1",
        nodes=1,
        world=2,
        overrides=[f"output_dir={out}", "trainer.max_steps=2", "trainer.save_strategy=no", "trainer.metrics_port=0"],
    )
    assert codes == [0], outputs[0][-3000:]
    assert "done: rank 0/2 at global step 2" in outputs[0] and "done: rank 1/2 at global step 2" in outputs[0]
    # Both processes generated: the token count per step covers both ranks' completions.
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if "reward" in line]
    assert len(records) == 2


@pytest.mark.parametrize(
    "preset", ["deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero3_cpu_offloading"]
)
def test_presets_parse_with_deepspeed(preset, tmp_path):
    """The DeepSpeed section, as Accelerate and the HF Trainer fill it in, is a valid DeepSpeed config."""
    from accelerate.utils import DeepSpeedPlugin
    from deepspeed.runtime.config import DeepSpeedConfig
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    document = yaml.safe_load((REPO / "accelerate" / f"{preset}.yaml").read_text())
    assert document["distributed_type"] == "DEEPSPEED"
    section = dict(document["deepspeed_config"])
    assert section.pop("deepspeed_multinode_launcher") == "standard"  # torchrun per node, no ssh/hostfile
    plugin = DeepSpeedPlugin(**section)
    hf_config = HfTrainerDeepSpeedConfig(plugin.deepspeed_config)
    hf_config.trainer_config_process(
        GRPOConfig(output_dir=str(tmp_path / "unused"), per_device_train_batch_size=4, num_generations=4)
    )
    parsed = DeepSpeedConfig(hf_config.config)
    expected_stage = {"deepspeed_zero1": 1, "deepspeed_zero2": 2}.get(preset, 3)
    assert parsed.zero_optimization_stage == expected_stage
    assert parsed.train_micro_batch_size_per_gpu == 4
    offload = preset.endswith("offloading")
    assert (
        parsed.zero_config.offload_optimizer is not None and parsed.zero_config.offload_optimizer.device == "cpu"
    ) == offload


# AdamW's decay moves the adapter at every step, even where every answer scores 0; a constant rate, since a linear
# schedule made for 2 steps left the rate at 0 for the first step after a resume that extends the run.
LORA = ["trainer.lora.r=4", "trainer.lora.alpha=8", "trainer.weight_decay=0.1", "trainer.lr_scheduler_type=constant"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset", ["deepspeed_zero1", "deepspeed_zero2", "deepspeed_zero3", "deepspeed_zero3_cpu_offloading"]
)
def test_a_lora_adapter_trains_saves_and_resumes_under_each_zero_stage(preset, tmp_path, atlas_cache):
    """Two processes under each DeepSpeed preset: checkpoints and the final model hold the adapter (gathered whole
    under ZeRO-3), not the model's weights; under ZeRO-3 (where DeepSpeed loads the checkpoint) a restart resumes
    the adapter and trains on from it. (The weights at a resume, compared exactly: tests/training/test_lora.py.)"""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    codes, outputs = launch_nodes(preset, 1, 2, [f"output_dir={out}", *resume_overrides(2, free_port()), *LORA])
    assert codes == [0], outputs[0][-3000:]
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    saved = load_file(checkpoint / "adapter_model.safetensors")
    assert saved and all(t.numel() > 0 for t in saved.values())  # whole tensors, not ZeRO-3's empty shards
    assert load_file(out / "adapter_model.safetensors").keys() == saved.keys()
    if not preset.startswith("deepspeed_zero3"):
        return
    codes, outputs = launch_nodes(preset, 1, 2, [f"output_dir={out}", *resume_overrides(3, free_port()), *LORA])
    assert codes == [0], outputs[0][-3000:]
    assert "resume: all 2 ranks resume from checkpoint-2" in outputs[0]
    from atlas_core.training.lora import adapter_fingerprint  # the adapter gathered from ZeRO-3's shards at step 3

    assert f"applied once: {len(saved)} tensors, sha256 {adapter_fingerprint(saved)}" in outputs[0]
    assert trained_steps(out) == [1, 2, 3]
    final = load_file(out / "adapter_model.safetensors")
    assert final.keys() == saved.keys() and all(final[k].shape == saved[k].shape for k in saved)  # one adapter
    assert any(not final[k].equal(saved[k]) for k in saved)


# The AtlasTeacher launch (teacher GRPO under ZeRO-3, two processes, each rank with its own frozen local student):
# tests/training/test_reference_examples.py::test_deepspeed_launch_commands runs it, with and without CPU offloading.


# --------------------------------------------------------------------------- resume: one decision for all ranks


def resume_overrides(max_steps: int, metrics_port: int, save_steps: int = 2) -> list[str]:
    return [
        f"trainer.max_steps={max_steps}",
        f"trainer.save_steps={save_steps}",
        "trainer.per_device_train_batch_size=4",
        f"trainer.metrics_port={metrics_port}",
        "trainer.metrics_host=127.0.0.1",
    ]


def trained_steps(out) -> list[int]:
    return [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.slow
def test_per_node_checkpoint_folders_stop_every_rank_with_the_reason(tmp_path, atlas_cache):
    """Two nodes, each with its own output folder (no shared volume): after a restart rank 0 finds a
    complete checkpoint and rank 1 none (the checkpoint is published where the saving rank writes; rank 1's
    shard stays in its own staging folder). Every rank stops with the reason, none trains."""
    folders = [[f"output_dir={tmp_path / f'node{i}'}"] for i in range(2)]
    codes, outputs = launch_nodes("deepspeed_zero2", 2, 2, resume_overrides(2, free_port()), per_node=folders)
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert (tmp_path / "node0" / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (tmp_path / "node1" / "checkpoint-2").exists()

    codes, outputs = launch_nodes(
        "deepspeed_zero2", 2, 2, resume_overrides(4, free_port()), per_node=folders, timeout=240
    )
    assert codes[0] != 0 and codes[1] != 0, "\n\n".join(o[-3000:] for o in outputs)
    for output in outputs:
        assert "checkpoint-2 is complete for rank 0" in output and "but not for every rank" in output, output[-3000:]
        assert "rank 1 on" in output and "no such folder" in output
        assert "spec.checkpoint.pvc" in output and "ReadWriteMany" in output
        # The launcher prints its own traceback for a child's exit status; none comes from our code or torch's.
        assert "collective mismatch" not in output and "atlas_core/" not in output.split("error: resume:")[1]
        assert "exitcode  : 2" in output
    assert not (tmp_path / "node0" / "checkpoint-4").exists()  # no rank trained a step


@pytest.mark.slow
def test_shared_folder_resumes_together_and_falls_back_when_a_shard_is_missing(tmp_path, atlas_cache):
    """A shared output folder, rank 1's ZeRO shard of the newest checkpoint deleted: both ranks fall back to the
    previous checkpoint, resume from it together and train each step after it once. (Both resuming from the newest
    checkpoint when it is complete: the SIGTERM test below, whose restarts do.)"""
    out = tmp_path / "run"
    shared = [f"output_dir={out}"]
    codes, outputs = launch_nodes("deepspeed_zero2", 2, 2, [*shared, *resume_overrides(4, free_port())])
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert trained_steps(out) == [1, 2, 3, 4]

    (shard,) = (out / "checkpoint-4" / "global_step4").glob("*zero_pp_rank_1_*optim_states.pt")
    shard.unlink()
    codes, outputs = launch_nodes("deepspeed_zero2", 2, 2, [*shared, *resume_overrides(6, free_port())])
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert "zero_pp_rank_1" in outputs[1] and "resumes from checkpoint-2" in outputs[1]
    assert "resume: all 2 ranks resume from checkpoint-2" in outputs[0]
    assert "done: rank 1/2 at global step 6, resumed from" in outputs[1]
    assert trained_steps(out) == [1, 2, 3, 4, 3, 4, 5, 6]  # 3 and 4 again: checkpoint-4 could not load


# --------------------------------------------------------------------------- a stop on SIGTERM (preemption, drains)


def trainer_processes(procs: list[subprocess.Popen]) -> list[int]:
    """Every node's training processes (the launcher's workers), as a pod's trainer processes."""
    from atlas_cluster.node import descendants

    found = []
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"atlas_core.cli.train" in command and b"accelerate" not in command:
                found.append(pid)
    return found


def logged_steps(out) -> list[int]:
    path = out / "metrics.jsonl"
    return trained_steps(out) if path.is_file() else []


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_a_kill_mid_save_falls_back_to_the_last_complete_checkpoint(
    tmp_path, atlas_cache
):
    """Two nodes, ZeRO-2, a shared output folder, no scheduled checkpoint before step 50.

    1. SIGTERM to every trainer process mid-run: every rank stops after the same step, with a checkpoint there, and
       exits with the stop code; each node's report names the step.
    2. The restart resumes from it; SIGTERM again, then SIGKILL to every process while that stop's checkpoint is
       being written (the grace period ran out): nothing half-written is published.
    3. The next restart falls back to the first stop's checkpoint and trains each remaining step exactly once."""
    from atlas_contract.names import STOP_EXIT_CODE
    from atlas_contract.stops import parse_stop_report

    out = tmp_path / "run"
    run = [f"output_dir={out}", *resume_overrides(10, free_port(), save_steps=50)]
    procs = start_nodes("deepspeed_zero2", 2, 2, run, ATLAS_RESULT_FILE=str(tmp_path / "result-{node}"))
    wait_for(lambda: len(logged_steps(out)) >= 2, timeout=300)
    workers = trainer_processes(procs)
    assert len(workers) == 2
    logged_at_signal = logged_steps(out)[-1]
    signalled = time.monotonic()
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
    codes, outputs = wait_nodes(procs, timeout=120)
    took = time.monotonic() - signalled
    steps = trained_steps(out)
    stop = steps[-1]
    assert stop < 10, "\n\n".join(o[-3000:] for o in outputs)
    reports = [parse_stop_report((tmp_path / f"result-{node}").read_text()) for node in range(2)]
    assert [r.step for r in reports] == [stop, stop], reports
    for output in outputs:  # each node's worker exited with the stop code (torch elastic's summary names it)
        assert f"exitcode  : {STOP_EXIT_CODE}" in output, output[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    shards = sorted(p.name for p in (out / f"checkpoint-{stop}" / f"global_step{stop}").glob("*optim_states.pt"))
    assert len(shards) == 2, shards  # both ranks' ZeRO-2 shards
    assert not (out / "model.safetensors").exists()  # a stop saves a checkpoint, not the final model
    print(f"SIGTERM with step {logged_at_signal} logged: every rank stopped at step {stop}, exit {took:.1f} s later")

    procs = start_nodes("deepspeed_zero2", 2, 2, [f"output_dir={out}", *resume_overrides(10, free_port(), 50)])
    wait_for(lambda: len(logged_steps(out)) >= len(steps) + 1, timeout=300)
    for pid in trainer_processes(procs):
        os.kill(pid, signal.SIGTERM)
    staging = out / ".atlas-staging"
    (written,) = wait_for(lambda: [p for p in staging.glob("checkpoint-*") if any(p.iterdir())], 60, 0.005)
    kill_nodes(procs)
    _, outputs = wait_nodes(procs, timeout=60)
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in outputs[0]
    killed = int(written.name.removeprefix("checkpoint-"))
    assert killed > stop and sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    before = trained_steps(out)
    print(f"SIGKILL in the save of checkpoint-{killed}: steps {before[len(steps) :]} are lost again")

    codes, outputs = launch_nodes("deepspeed_zero2", 2, 2, [f"output_dir={out}", *resume_overrides(10, free_port())])
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in outputs[0]
    assert trained_steps(out) == before + list(range(stop + 1, 11))  # from the last complete checkpoint, once each
    assert not any(staging.glob("checkpoint-*"))  # the next save removed what the killed one left
    assert (out / "model.safetensors").exists()
