"""End to end on one machine: the operator's rendered PyTorchJob, executed locally, trains the tiny model.

API server: kmock's emulator. Operator: `atlas operator`. Kubeflow + kubelet: tests/pod_executor.py,
which runs each replica's `pytorch` container command with the injected topology environment.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import kubernetes
import pytest
import yaml
from conftest import REPO, free_port
from kube_emulator import PYTORCHJOBS, wait_for
from operator_support import NS, own_cluster, training
from pod_executor import PodExecutor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN_TIMEOUT = 400
STEPS = 120  # the resume case: long enough (~10 s) to kill the Worker between checkpoints


class StatusRecorder:
    """Every distinct .status.progress the run showed, read from the API while it ran."""

    def __init__(self, cluster, manifest):
        self.cluster, self.manifest = cluster, manifest
        self.seen: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            progress = self.cluster.status(self.manifest).get("progress")
            if progress and progress not in self.seen:
                self.seen.append(progress)
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def local_cluster(tmp_path, tiny_model_dir):
    # The Master "pod" serves the trainer's metrics port on a free port of 127.0.0.1, where the operator reads it.
    metrics_port = free_port()
    with own_cluster(tmp_path, metrics_url=f"http://127.0.0.1:{metrics_port}/metrics") as cluster:
        executor = PodExecutor(
            cluster.api_client, tmp_path / "pods", NS, Path(sys.executable).parent, host_ports={"metrics": metrics_port}
        ).start()
        yield cluster, executor
        executor.stop()


def wait_phase(cluster, manifest, phases, executor):
    try:
        return cluster.wait_status(
            manifest, lambda s: s.get("phase") in phases, f"phase in {phases}", timeout=RUN_TIMEOUT
        )
    except AssertionError as exc:
        logs = "\n".join(
            f"--- {p.name}\n{p.log.read_text(errors='replace')[-3000:]}"
            for p in executor.pods(manifest["metadata"]["name"])
            if p.log.exists()
        )
        raise AssertionError(f"{exc}\n{logs}") from None


def metrics_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def tiny_training(name: str, **spec) -> dict:
    manifest = training(
        name,
        model="builtin://tiny-llama",
        resources={"nodes": 1, "gpusPerNode": 0},
        rollout={"replicas": 0},
        deepspeed="zero1",
        training={
            "maxSteps": 6,
            "perDeviceTrainBatchSize": 4,
            "numGenerations": 4,
            "maxCompletionLength": 16,
            "learningRate": 3e-4,
            "loggingSteps": 1,
            "gradientCheckpointing": False,
        },
        checkpoint={"path": "/checkpoints", "saveSteps": 3},
    )
    manifest["spec"].update(spec)
    return manifest


def test_teacher_and_training_runs_train_and_report_progress(local_cluster):
    cluster, executor = local_cluster
    teacher = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    teacher["spec"]["training"]["maxSteps"] = 10  # long enough for a few status refreshes while it runs
    teacher["spec"]["checkpoint"]["saveSteps"] = 5
    cluster.apply(teacher)
    recorder = StatusRecorder(cluster, teacher)
    wait_phase(cluster, teacher, ("Succeeded", "Failed"), executor)
    recorder.stop()
    assert cluster.status(teacher)["phase"] == "Succeeded"
    # Two pods, no spec.checkpoint.pvc: the operator says at once that restarts cannot resume, and why.
    shared = next(c for c in cluster.status(teacher)["conditions"] if c["type"] == "CheckpointsShared")
    assert shared["status"] == "False" and shared["reason"] == "CheckpointsNotShared"
    assert "ReadWriteMany" in shared["message"] and "spec.checkpoint.pvc" in shared["message"]
    assert any(p.get("step", 0) >= 1 and "reward" in p and "kl" in p for p in recorder.seen), recorder.seen

    master, worker = executor.pods("local-teacher")
    out = master.root / master.name / "checkpoints" / "local-teacher"  # spec.checkpoint.path/<name>
    assert (out / "checkpoint-10" / "trainer_state.json").is_file()
    steps = [r["step"] for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 11))
    # Both ranks took part: rank 1 (the Worker pod) saved its ZeRO shard on its own volume.
    worker_out = worker.root / worker.name / "checkpoints" / "local-teacher"
    assert list(worker_out.glob("checkpoint-10/global_step10/*rank_1*")), sorted(worker_out.rglob("*"))
    assert "done: rank 1/2" in worker.log.read_text() and "done: rank 0/2" in master.log.read_text()

    grpo = tiny_training("tiny-grpo", training={**tiny_training("x")["spec"]["training"], "beta": 0.0})
    cluster.apply(grpo)
    wait_phase(cluster, grpo, ("Succeeded", "Failed"), executor)
    assert cluster.status(grpo)["phase"] == "Succeeded"
    (master,) = executor.pods("tiny-grpo")
    assert (master.root / master.name / "checkpoints/tiny-grpo/checkpoint-6/trainer_state.json").is_file()


def test_teacher_evaluated_after_training_reports_its_result_in_the_status(local_cluster):
    """AtlasTeacher with spec.evaluation: after training, the Master evaluates the trained teacher against the
    student; its summary reaches .status.result through the Master container's termination message (the pod
    executor plays the kubelet: it copies the file into the Pod's status), and eval.json holds every figure."""
    from atlas_contract import names, results

    cluster, executor = local_cluster
    teacher = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    teacher["metadata"]["name"] = "eval-teacher"
    teacher["spec"]["training"]["maxSteps"] = 2
    teacher["spec"]["checkpoint"]["saveSteps"] = 2
    teacher["spec"]["evaluation"] = {"samples": 1, "limit": 4}  # the run's dataset, split test
    cluster.apply(teacher)
    wait_phase(cluster, teacher, ("Succeeded", "Failed"), executor)
    master, worker = executor.pods("eval-teacher")
    assert cluster.status(teacher)["phase"] == "Succeeded", master.log.read_text(errors="replace")[-3000:]
    status = cluster.wait_status(teacher, lambda s: "result" in s, ".status.result", timeout=60)
    result = status["result"]
    assert result["step"] == 2
    evaluation = result["evaluation"]
    assert evaluation["problems"] == 4
    for key in ("studentAccuracy", "guidedAccuracy", "nonDegradationRate"):
        assert 0.0 <= evaluation[key] <= 1.0, evaluation
    assert evaluation["accuracyDelta"] == pytest.approx(evaluation["guidedAccuracy"] - evaluation["studentAccuracy"])
    # The Pod the executor reported as the kubelet would: .status.result is its termination message, parsed.
    pod = cluster.emu.get("v1/pods", NS, "eval-teacher-master-0")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "Completed"
    assert results.parse_result_message(terminated["message"]) == result
    worker_pod = cluster.emu.get("v1/pods", NS, "eval-teacher-worker-0")  # rank 0 alone writes the result
    assert "message" not in worker_pod["status"]["containerStatuses"][0]["state"]["terminated"]
    # Every figure is in the output folder's eval.json; the status carries its summary.
    out = master.root / master.name / "checkpoints" / "eval-teacher"
    report = json.loads((out / names.EVAL_DIR / names.EVAL_REPORT_FILE).read_text())
    assert evaluation == pytest.approx(
        results.parse_result_message(results.result_message(2, None, report))["evaluation"]
    )


def test_killed_worker_restarts_and_resumes_from_the_checkpoint(local_cluster):
    cluster, executor = local_cluster
    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    manifest = tiny_training(
        "resume-run",
        resources={"nodes": 2, "gpusPerNode": 0},
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 10},
    )
    manifest["spec"]["training"]["maxSteps"] = STEPS
    cluster.apply(manifest)
    out = executor.workdir / "pvc" / "ckpt" / "resume-run"
    wait_for(
        lambda: (out / "checkpoint-10" / "trainer_state.json").is_file(),
        timeout=RUN_TIMEOUT,
        what="the first complete checkpoint",
    )
    master, worker = executor.pods("resume-run")
    assert worker.proc.poll() is None, "the run finished before the Worker could be killed"
    worker.kill()

    def job_conditions() -> list[dict]:
        return (cluster.emu.get(PYTORCHJOBS, NS, "resume-run") or {}).get("status", {}).get("conditions", [])

    wait_for(lambda: any(c["type"] == "Restarting" for c in job_conditions()), timeout=60, what="a restart")
    wait_phase(cluster, manifest, ("Succeeded", "Failed"), executor)
    assert cluster.status(manifest)["phase"] == "Succeeded", [p.log.read_text()[-2000:] for p in (master, worker)]
    assert worker.restarts >= 1
    import re

    resumed = re.findall(
        r"done: rank 0/2 at global step (\d+), resumed from \S+/checkpoint-(\d+)", master.log.read_text()
    )
    assert resumed, "the restarted Master did not resume from a checkpoint"
    final_step, resumed_from = map(int, resumed[-1])
    assert final_step == STEPS and resumed_from % 10 == 0 and resumed_from >= 10  # a saved checkpoint
    steps = [r["step"] for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert steps[-(STEPS - resumed_from) :] == list(range(resumed_from + 1, STEPS + 1))  # each remaining step once
    assert (out / f"checkpoint-{STEPS}" / "trainer_state.json").is_file()
