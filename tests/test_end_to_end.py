"""End to end on one machine: the operator's rendered job, executed locally, trains the tiny model — the same
suite on the three backends (the operator's default backend set to each, so the manifests are the same).

API server: kmock's emulator. Operator: `atlas operator`. Kubeflow (PyTorchJob), the JobSet and Job controllers
(JobSet), or the Kubeflow Trainer over those (TrainJob, on the chart's ClusterTrainingRuntime), and the kubelet:
tests/support/pytorchjob_executor.py, jobset_executor.py and trainjob_executor.py (on kubelet.py), which run each
pod's container command with the environment, hostnames and volumes those controllers give it (a `vllm serve`
server as a local stand-in).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import kubernetes
import pytest
import yaml

from tests.support.env import REPO, free_port
from tests.support.jobset_executor import JobSetExecutor
from tests.support.jobset_world import install_trainjob_runtime
from tests.support.kube_emulator import PYTORCHJOBS, wait_for
from tests.support.manifests import NS, tiny_training
from tests.support.operator_cluster import TIMEOUT, kueue_admit, kueue_admit_trainjob, kueue_preempt, own_cluster
from tests.support.pytorchjob_executor import PyTorchJobExecutor
from tests.support.trainjob_executor import TrainJobExecutor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN_TIMEOUT = 400
STEPS = 80  # the resume case: long enough (several seconds) to kill the Worker between checkpoints


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


BACKENDS = ("PyTorchJob", "JobSet", "TrainJob")
EXECUTORS = {"PyTorchJob": PyTorchJobExecutor, "JobSet": JobSetExecutor, "TrainJob": TrainJobExecutor}


@pytest.fixture(params=BACKENDS)
def local_cluster(request, tmp_path, tiny_model_dir):
    """An operator whose default backend is the parameter, and the executor of that backend's controllers."""
    backend = request.param
    # The rank-0 "pod" serves the trainer's metrics port on a free port of 127.0.0.1, where the operator reads it.
    metrics_port = free_port()
    with own_cluster(
        tmp_path,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        operator_env={"ATLAS_DEFAULT_BACKEND": backend},
    ) as cluster:
        if backend == "TrainJob":  # what the chart installs beside the operator
            install_trainjob_runtime(cluster)
        executor = EXECUTORS[backend](
            cluster.api_client, tmp_path / "pods", NS, Path(sys.executable).parent, host_ports={"metrics": metrics_port}
        ).start()
        yield cluster, executor
        executor.stop()


def on_jobset(executor) -> bool:
    """Whether the run's trainer is a JobSet's (ours on JobSet, the Kubeflow Trainer's on TrainJob): restarted as a
    gang, its restarts mirrored in .status.restarts."""
    return isinstance(executor, JobSetExecutor)


def trainer_pods(executor, name: str) -> list:
    """The run's trainer pods, rank 0 first: the PyTorchJob's Master and Workers, or the JobSet trainer's pods by
    completion index (of the current attempt: a gang restart makes new pods) — the Trainer names that job node."""
    if not on_jobset(executor):
        return executor.pods(name)
    return executor.jobset_pods(name, "node" if isinstance(executor, TrainJobExecutor) else "trainer")


def wait_phase(cluster, manifest, phases, executor):
    try:
        return cluster.wait_status(
            manifest, lambda s: s.get("phase") in phases, f"phase in {phases}", timeout=RUN_TIMEOUT
        )
    except AssertionError as exc:
        name = manifest["metadata"]["name"]
        pods = executor.jobset_pods(name) if on_jobset(executor) else executor.pods(name)
        logs = "\n".join(f"--- {p.name}\n{p.log.read_text(errors='replace')[-3000:]}" for p in pods if p.log.exists())
        raise AssertionError(f"{exc}\n{logs}") from None


def metrics_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_teacher_run_trains_and_reports_progress(local_cluster):
    """(An AtlasTraining run trains on every backend in the queued-run test below.)"""
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

    master, worker = trainer_pods(executor, "local-teacher")
    out = master.root / master.name / "checkpoints" / "local-teacher"  # spec.checkpoint.path/<name>
    assert (out / "checkpoint-10" / "trainer_state.json").is_file()
    steps = [r["step"] for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 11))
    # Both ranks took part: rank 1 (the Worker pod) wrote its ZeRO shard on its own volume, where no checkpoint is
    # published (rank 0 renames the folder on its volume): it stays in the staging folder.
    worker_out = worker.root / worker.name / "checkpoints" / "local-teacher"
    assert list(worker_out.glob(".atlas-staging/checkpoint-10/global_step10/*rank_1*")), sorted(worker_out.rglob("*"))
    assert not list(worker_out.glob("checkpoint-*"))
    assert "done: rank 1/2" in worker.log.read_text() and "done: rank 0/2" in master.log.read_text()


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
    master, worker = trainer_pods(executor, "eval-teacher")
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
    pod = cluster.emu.get("v1/pods", NS, master.name)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "Completed"
    assert results.parse_result_message(terminated["message"]) == result
    worker_pod = cluster.emu.get("v1/pods", NS, worker.name)  # rank 0 alone writes the result
    assert "message" not in worker_pod["status"]["containerStatuses"][0]["state"]["terminated"]
    # Every figure is in the output folder's eval.json; the status carries its summary.
    out = master.root / master.name / "checkpoints" / "eval-teacher"
    report = json.loads((out / names.EVAL_DIR / names.EVAL_REPORT_FILE).read_text())
    assert evaluation == pytest.approx(
        results.parse_result_message(results.result_message(2, None, report))["evaluation"]
    )


def create_pvc(cluster, name: str = "ckpt") -> None:
    kubernetes.client.CoreV1Api(cluster.api_client).create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )


def start_checkpointed_teacher(cluster, executor, name: str, student: dict, steps: int, every: int, **training):
    """examples/local-teacher.yaml on one node as run ``name`` with ``student``, checkpoints every ``every`` steps
    on the PVC ``ckpt``, once its first checkpoint is complete: (the manifest, its output folder)."""
    create_pvc(cluster)
    teacher = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    teacher["metadata"]["name"] = name
    teacher["spec"]["resources"] = {"nodes": 1, "gpusPerNode": 0}
    teacher["spec"]["student"] = student
    teacher["spec"]["training"].update(maxSteps=steps, **training)
    teacher["spec"]["checkpoint"] = {"pvc": "ckpt", "path": "/checkpoints", "saveSteps": every}
    cluster.apply(teacher)
    out = executor.workdir / "pvc" / "ckpt" / name
    wait_for(
        lambda: (out / f"checkpoint-{every}" / "trainer_state.json").is_file(),
        timeout=RUN_TIMEOUT,
        what="the first complete checkpoint",
    )
    return teacher, out


def assert_resumed_without_repeating_steps(log: str, out: Path, steps: int, every: int, ranks: int) -> None:
    """The restarted rank 0 resumed from a saved checkpoint and trained each remaining step exactly once."""
    resumed = re.findall(rf"done: rank 0/{ranks} at global step (\d+), resumed from \S+/checkpoint-(\d+)", log)
    assert resumed, "the restarted rank 0 did not resume from a checkpoint"
    final_step, resumed_from = map(int, resumed[-1])
    assert final_step == steps and resumed_from % every == 0 and resumed_from >= every  # a saved checkpoint
    logged = [r["step"] for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert logged[-(steps - resumed_from) :] == list(range(resumed_from + 1, steps + 1))  # each remaining step once
    assert (out / f"checkpoint-{steps}" / "trainer_state.json").is_file()


def test_killed_worker_restarts_and_resumes_from_the_checkpoint(local_cluster):
    """PyTorchJob: Kubeflow restarts the failed pod in place. JobSet and TrainJob: the failed trainer Job fails the
    JobSet's attempt and the whole gang is made again (restart-attempt 1); either way training resumes from the
    PVC."""
    cluster, executor = local_cluster
    create_pvc(cluster)
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
    master, worker = trainer_pods(executor, "resume-run")
    assert worker.proc.poll() is None, "the run finished before the Worker could be killed"
    worker.kill()

    if on_jobset(executor):  # the operator mirrors the JobSet's restart count
        cluster.wait_status(manifest, lambda s: s.get("restarts") == 1, ".status.restarts 1", timeout=60)
    else:

        def job_conditions() -> list[dict]:
            return (cluster.emu.get(PYTORCHJOBS, NS, "resume-run") or {}).get("status", {}).get("conditions", [])

        wait_for(lambda: any(c["type"] == "Restarting" for c in job_conditions()), timeout=60, what="a restart")
    wait_phase(cluster, manifest, ("Succeeded", "Failed"), executor)
    if on_jobset(executor):
        master, new_worker = trainer_pods(executor, "resume-run")  # the restarted gang's pods
        assert new_worker.name != worker.name and cluster.status(manifest)["restarts"] == 1
        worker = new_worker
    assert cluster.status(manifest)["phase"] == "Succeeded", [p.log.read_text()[-2000:] for p in (master, worker)]
    if not on_jobset(executor):
        assert worker.restarts >= 1
    assert_resumed_without_repeating_steps(master.log.read_text(), out, STEPS, 10, ranks=2)


@pytest.mark.parametrize("local_cluster", ["JobSet"], indirect=True)
def test_a_dead_server_restarts_the_whole_gang_which_resumes_from_the_checkpoint(local_cluster):
    """JobSet only (on PyTorchJob a server is a Deployment of its own, which the executor does not run): the
    student server's process dies, its Job fails, and the JobSet restarts every pod — the server first, then the
    trainer once the new server is Ready — and training resumes from the newest checkpoint on the PVC. The
    student server is the executor's vLLM stand-in (it cannot run vLLM), which the trainer really calls."""
    cluster, executor = local_cluster
    student = {"model": "builtin://tiny-llama", "rollout": {"replicas": 1}}  # vllm serve: the stand-in
    teacher, out = start_checkpointed_teacher(cluster, executor, "gang-teacher", student, steps=30, every=5)
    (server,) = executor.jobset_pods("gang-teacher", "student")
    (trainer,) = trainer_pods(executor, "gang-teacher")
    assert trainer.proc.poll() is None, "the run finished before the server could be killed"
    server.kill()
    status = cluster.wait_status(teacher, lambda s: s.get("restarts") == 1, ".status.restarts 1", timeout=60)
    assert status["phase"] in ("Pending", "Running")  # a restart is not a failure
    wait_phase(cluster, teacher, ("Succeeded", "Failed"), executor)
    (new_trainer,) = trainer_pods(executor, "gang-teacher")
    assert cluster.status(teacher)["phase"] == "Succeeded", new_trainer.log.read_text(errors="replace")[-3000:]
    assert trainer.proc.poll() == -9  # the old trainer was killed with the gang, not left training
    assert new_trainer.name != trainer.name
    # The new trainer started only after the new server was Ready (dependsOn), and really used it.
    log = executor.run_of("gang-teacher").log
    created = [line for line in log if line.startswith("created job")]
    assert created[-2:] == [
        "created job gang-teacher-student-0 (attempt 1)",
        "created job gang-teacher-trainer-0 (attempt 1)",
    ], created
    assert_resumed_without_repeating_steps(new_trainer.log.read_text(), out, 30, 5, ranks=1)


def admit(cluster, executor, name: str) -> None:
    """What Kueue does when it admits the run's workload: JobSet, ``kueue_admit`` (tests/support/operator_cluster.py);
    TrainJob, ``kueue_admit_trainjob``; PyTorchJob (Kueue's kubeflow integration, when enabled),
    ``runPolicy.suspend`` set to false."""
    if isinstance(executor, TrainJobExecutor):
        kueue_admit_trainjob(cluster.api_client, name)
        return
    if on_jobset(executor):
        kueue_admit(cluster.api_client, name)
        return
    kubernetes.client.CustomObjectsApi(cluster.api_client).patch_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs", name, {"spec": {"runPolicy": {"suspend": False}}}
    )


def test_a_queued_run_stays_queued_with_no_pod_until_kueue_admits_it(local_cluster):
    cluster, executor = local_cluster
    manifest = tiny_training("queued-run", queueName="team-a-gpus")
    cluster.apply(manifest)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued")
    # The executor has looked at the suspended job many times, and the operator has refreshed the run (1 s
    # timer): nothing runs, and the run stays Queued.
    passes = executor.passes
    wait_for(lambda: executor.passes >= passes + 15, timeout=TIMEOUT, what="the executor's passes")
    assert trainer_pods(executor, "queued-run") == [] and cluster.emu.list("v1/pods", NS) == []
    assert cluster.status(manifest)["phase"] == "Queued"
    admit(cluster, executor, "queued-run")
    wait_phase(cluster, manifest, ("Succeeded", "Failed"), executor)
    assert cluster.status(manifest)["phase"] == "Succeeded"
    (master,) = trainer_pods(executor, "queued-run")
    assert "done: rank 0/1 at global step 6" in master.log.read_text()
    assert (master.root / master.name / "checkpoints/queued-run/checkpoint-6/trainer_state.json").is_file()


def backend_of(executor) -> str:
    return next(backend for backend, cls in EXECUTORS.items() if type(executor) is cls)


def test_a_kueue_preemption_saves_the_step_in_flight_and_the_readmitted_run_resumes_from_it(local_cluster):
    """Kueue admits a queued 2-node run, then preempts it mid-run (suspends its job). The pods are deleted as the
    kubelet does (SIGTERM to the launch script, the grace period): every rank stops after the same step and saves
    it, though no checkpoint was due before step 50; each pod exits with the stop code. The run shows Queued,
    reason Preempted, with the saved step; readmitted, it resumes from that checkpoint and trains each remaining
    step exactly once, and no restart is counted."""
    from atlas_contract.names import STOP_EXIT_CODE

    cluster, executor = local_cluster
    create_pvc(cluster)
    name = "preempted-run"
    manifest = tiny_training(
        name,
        queueName="team-a-gpus",
        resources={"nodes": 2, "gpusPerNode": 0},
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 50},
    )
    manifest["spec"]["training"]["maxSteps"] = 15
    cluster.apply(manifest)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued")
    admit(cluster, executor, name)
    out = executor.workdir / "pvc" / "ckpt" / name
    wait_for(
        lambda: (out / "metrics.jsonl").is_file() and len(logged_steps(out)) >= 3,
        timeout=RUN_TIMEOUT,
        what="three trained steps",
    )
    first_pods = trainer_pods(executor, name)
    kueue_preempt(cluster.api_client, backend_of(executor), name)
    status = cluster.wait_status(
        manifest,
        lambda s: s.get("phase") == "Queued" and (s.get("preemption") or {}).get("saves") == 1,
        "Queued after the preemption, with the save",
        timeout=RUN_TIMEOUT,
    )
    training = next(c for c in status["conditions"] if c["type"] == "Training")
    steps = logged_steps(out)
    stop = steps[-1]
    assert training["reason"] == "Preempted" and f"checkpoint-{stop}" in training["message"], training
    assert status["preemption"]["step"] == stop < 15
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    # The kubelet stand-in posts each pod's end as it comes: the status may show the first before the second.
    names = {p.name for p in first_pods}

    def ended_pods() -> list[tuple[str, float, int]]:
        ended = [t for t in executor.terminations if t[0] in names]
        return ended if len(ended) == len(names) else []

    ended = wait_for(ended_pods, timeout=60, what="both trainer pods' ends")
    assert sorted(code for _, _, code in ended) == [STOP_EXIT_CODE, STOP_EXIT_CODE], executor.terminations
    events = cluster.emu.list("v1/events", NS)
    assert any(e.get("reason") == "PreemptionSave" and f"checkpoint-{stop}" in e.get("message", "") for e in events)
    assert trainer_pods(executor, name) == [] or all(p.proc.poll() is not None for p in trainer_pods(executor, name))
    print(f"{backend_of(executor)}: stopped after step {stop}; SIGTERM to exit: {[round(t, 1) for _, t, _ in ended]} s")

    admit(cluster, executor, name)
    wait_phase(cluster, manifest, ("Succeeded", "Failed"), executor)
    master = trainer_pods(executor, name)[0]
    assert cluster.status(manifest)["phase"] == "Succeeded", master.log.read_text(errors="replace")[-3000:]
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in master.log.read_text()
    assert logged_steps(out) == list(range(1, 16))  # no step lost, none repeated
    assert (cluster.status(manifest).get("restarts") or 0) == 0  # a preemption is not a restart


@pytest.mark.parametrize("local_cluster", ["JobSet"], indirect=True)
def test_a_drained_trainer_node_stops_every_rank_at_one_step_and_its_pods_are_recreated(local_cluster):
    """A drain of one trainer node: only its pod gets SIGTERM (and the DisruptionTarget condition). Every rank still
    stops after the same step — the other learns it in the step's all-reduce — saves it, and exits with the stop
    code; the trainer Job's podFailurePolicy ignores those exits and recreates both pods, which resume from the
    checkpoint. No gang restart, nothing counted toward maxRestarts."""
    from atlas_contract.names import STOP_EXIT_CODE

    cluster, executor = local_cluster
    create_pvc(cluster)
    name = "drained-run"
    manifest = tiny_training(
        name,
        resources={"nodes": 2, "gpusPerNode": 0},
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 50},
    )
    manifest["spec"]["training"]["maxSteps"] = 15
    cluster.apply(manifest)
    out = executor.workdir / "pvc" / "ckpt" / name
    wait_for(
        lambda: (out / "metrics.jsonl").is_file() and len(logged_steps(out)) >= 3,
        timeout=RUN_TIMEOUT,
        what="three trained steps",
    )
    first, drained = trainer_pods(executor, name)
    os.kill(drained.proc.pid, signal.SIGTERM)  # the kubelet of the drained node, to the container's main process
    wait_for(lambda: first.proc.poll() is not None and drained.proc.poll() is not None, timeout=120, what="both exit")
    assert (first.proc.returncode, drained.proc.returncode) == (STOP_EXIT_CODE, STOP_EXIT_CODE)
    stop = logged_steps(out)[-1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    wait_phase(cluster, manifest, ("Succeeded", "Failed"), executor)
    master = trainer_pods(executor, name)[0]
    assert cluster.status(manifest)["phase"] == "Succeeded", master.log.read_text(errors="replace")[-3000:]
    assert master.name != first.name  # a new pod for each index, in the same attempt
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in master.log.read_text()
    assert logged_steps(out) == list(range(1, 16))
    status = cluster.status(manifest)
    assert (status.get("restarts") or 0) == 0 and status["preemption"]["step"] == stop


def logged_steps(out: Path) -> list[int]:
    return [r["step"] for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]


def test_a_stalled_trainer_is_ended_by_its_watchdog_and_resumes_from_the_checkpoint(local_cluster):
    """A real stall: the teacher's student endpoint (a local OpenAI-compatible server) stops answering mid-run.
    Within spec.training.stepTimeoutSeconds the trainer's step watchdog prints the stacks and the reason (naming
    the student's URL) and exits with code 75; the job restarts it — in place on PyTorchJob, the whole gang on
    JobSet and TrainJob (the JobSet's, or the runtime's, WatchdogExit failure-policy rule, which the operator
    reports) — and once the endpoint answers again
    training resumes from the checkpoint without repeating a step."""
    from atlas_contract.names import WATCHDOG_EXIT_CODE
    from tests.support.judge_server import JudgeServer, Reply

    cluster, executor = local_cluster
    stalled = threading.Event()

    def answer(call):
        # Stalled: an answer only after 30 s, far past the watchdog's limit (and before the server is stopped).
        return Reply(content="The answer is 4.", delay_s=30 if stalled.is_set() else 0)

    with JudgeServer(answer, served_model="student") as student:
        teacher, out = start_checkpointed_teacher(
            cluster,
            executor,
            "stall-teacher",
            {"model": student.base_url, "rollout": {"replicas": 0}},
            steps=12,
            every=4,
            stepTimeoutSeconds=8,
        )
        (trainer,) = trainer_pods(executor, "stall-teacher")
        assert trainer.proc.poll() is None, "the run finished before the student could stall"
        stalled.set()
        stalled_at = time.monotonic()
        wait_for(
            lambda: "atlas watchdog: no optimizer step" in trainer.log.read_text(), timeout=60, what="the watchdog"
        )
        fired_after = time.monotonic() - stalled_at
        stalled.clear()  # the endpoint answers again: the restarted trainer can go on
        wait_phase(cluster, teacher, ("Succeeded", "Failed"), executor)
    log = trainer.log.read_text()
    assert cluster.status(teacher)["phase"] == "Succeeded", log[-3000:]
    reason = [line for line in log.splitlines() if line.startswith("atlas watchdog: no optimizer step")][-1]
    assert f"the student at {student.base_url}" in reason and "limit 8 s" in reason, reason
    assert "Thread 0x" in log  # every thread's stack, before the reason
    assert fired_after < 8 + 30, fired_after  # its limit, plus a step's worth of slack on a loaded machine
    if on_jobset(executor):
        assert trainer.exit_code == WATCHDOG_EXIT_CODE
        (trainer,) = trainer_pods(executor, "stall-teacher")  # the restarted gang's pod
        status = cluster.status(teacher)
        assert status["restarts"] == 1
        events = [e for e in cluster.events("stall-teacher") if e["reason"] == "WatchdogRestart"]
        assert len(events) == 1 and "restart 1 of 3" in events[0]["message"], events
        counted = cluster.operator.get("/metrics")[1]
        assert (
            'atlas_operator_watchdog_restarts_total{kind="AtlasTeacher",namespace="team-a",run="stall-teacher"} 1.0'
            in (counted)
        )
    else:  # Kubeflow restarted the container in place: the kubelet kept the watchdog's exit as its last state
        pod = cluster.emu.get("v1/pods", NS, trainer.name)
        last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
        assert last["exitCode"] == WATCHDOG_EXIT_CODE and last["message"] == reason, last
        assert trainer.restarts == 1
    assert_resumed_without_repeating_steps(trainer.log.read_text(), out, 12, 4, ranks=1)
