"""Runs end to end through the real upstream controllers, on the tier's real control plane: the chart installed with
helm, ``atlas operator`` under its ServiceAccount, the training-operator (PyTorchJob), JobSet, the Kubeflow Trainer
(TrainJob) and Kueue built from their modules with their webhooks serving, the real kube-scheduler, and two process
nodes (atlas_cluster/node/, the one stand-in left: kubelet and container runtime) that run the pods as local
processes, each in a network namespace of its own.

Each scenario runs once, on the backend it belongs to (what differs per backend is checked at the render and status
level: tests/unit/test_render_*.py, tests/emulator/test_operator_*.py):

- PyTorchJob, the default backend: a 2-node teacher trains, reports progress (the operator scrapes rank 0's metrics
  through the run's Service name) and its evaluated result (the Master's termination message); a teacher's
  ``<name>-student`` Deployment runs the real CPU vLLM, and the teacher trains and is evaluated against it; a killed
  Worker is restarted in place and training resumes from the checkpoint volume.
- TrainJob (the Trainer → JobSet → Jobs): a stalled trainer is ended by its step watchdog; the runtime's failure
  policy restarts the gang, which resumes.
- JobSet: a dead student server restarts the whole gang, which resumes; a drained trainer node stops every rank at
  one step and its pods are recreated; real Kueue queues a run, admits it, preempts it for a higher-priority
  workload and readmits it, and training resumes from the preemption's checkpoint with no restart counted.

The student's ``vllm serve`` is harness/vllm_standin.py (a process the gang test kills; it answers without
generating), put first on the nodes' PATH; for the real-vLLM scenario, the CPU launcher (atlas_core/vllm_cpu.py) is
put before it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml

from atlas_cluster.node import ProcessNodes
from atlas_contract import names, results
from harness import vllm_standin
from harness.env import REPO
from harness.manifests import tiny_training
from tests.kube.conftest import Kube, process_nodes, upstream_controllers
from tests.kube.conftest import eventually as _eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN_TIMEOUT = 420  # a few tiny-model steps on 2 loaded cores, plus the pods' start
GROUP = ("atlas.arc.computer", "v1alpha1")
PLURALS = {"AtlasTeacher": "atlasteachers", "AtlasTraining": "atlastrainings"}
eventually = functools.partial(_eventually, timeout=RUN_TIMEOUT)  # a run's pace by default


@pytest.fixture(scope="module")
def nodes(kube: Kube, tmp_path_factory) -> Iterator[ProcessNodes]:
    """Every backend's controller, the scheduler and two process nodes, for this module (fake GPUs for the
    student server, which asks for one: the stand-in runs on CPU)."""
    standin = vllm_standin.install(tmp_path_factory.mktemp("vllm-standin"))
    with upstream_controllers(kube), process_nodes(kube, count=2, gpus=2, cpu=8, memory="16Gi") as running:
        # PATH as the node builds it, with `vllm` (the stand-in) first.
        path = (str(standin), str(running.shims), str(running.python_bin), os.environ.get("PATH", "/usr/bin:/bin"))
        running.extra_env["PATH"] = os.pathsep.join(path)
        yield running


@pytest.fixture
def world(kube: Kube, namespace: str, operator_release, nodes: ProcessNodes) -> World:
    operator_release()
    return World(kube, namespace, nodes)


class World:
    """The test's namespace on the real cluster: its runs, pods and files."""

    def __init__(self, kube: Kube, namespace: str, nodes: ProcessNodes):
        self.kube, self.ns, self.nodes = kube, namespace, nodes
        self.api = kube.api()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.custom = kubernetes.client.CustomObjectsApi(self.api)

    # ------------------------------------------------------------------ runs

    def apply(self, manifest: dict) -> dict:
        manifest["metadata"]["namespace"] = self.ns
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        return manifest

    def status(self, manifest: dict) -> dict:
        plural = PLURALS[manifest["kind"]]
        run = self.custom.get_namespaced_custom_object(*GROUP, self.ns, plural, manifest["metadata"]["name"])
        return run.get("status") or {}

    def wait_status(self, manifest: dict, check: Callable[[dict], object], what: str, timeout: float = RUN_TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(manifest)
            if check(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not in {timeout:.0f} s; status {json.dumps(status)[:1500]}\n"
                    f"{self.pod_logs(manifest['metadata']['name'])}"
                )
            time.sleep(0.5)

    def wait_phase(self, manifest: dict, *phases: str) -> dict:
        return self.wait_status(manifest, lambda s: s.get("phase") in phases, f"phase in {phases}")

    def events(self, name: str) -> list[dict]:
        listed = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}")
        return [{"reason": e.reason, "message": e.message} for e in listed.items]

    # ------------------------------------------------------------------ pods

    def pods(self, selector: str) -> list[dict]:
        listed = self.core.list_namespaced_pod(self.ns, label_selector=selector)
        return [self.api.sanitize_for_serialization(pod) for pod in listed.items]

    def run_pods(self, name: str, component: str = "trainer") -> list[dict]:
        """Every pod of the run's ``component`` (trainer, student), ended ones too."""
        return self.pods(f"app.kubernetes.io/instance={name},app.kubernetes.io/component={component}")

    def trainer_pods(self, name: str) -> list[dict]:
        """The run's live trainer pods, rank 0 first (a PyTorchJob's Master, else by completion index)."""
        pods = [
            p
            for p in self.run_pods(name)
            if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") not in ("Succeeded", "Failed")
        ]

        def rank(pod: dict) -> tuple[int, int]:
            labels = pod["metadata"].get("labels") or {}
            master = labels.get("training.kubeflow.org/replica-type") == "master"
            index = labels.get("batch.kubernetes.io/job-completion-index") or labels.get(
                "training.kubeflow.org/replica-index", "0"
            )
            return (0 if master else 1, int(index))

        return sorted(pods, key=rank)

    def wait_trainer_pods(self, name: str, count: int, exclude: tuple[str, ...] = ()) -> list[dict]:
        def running() -> list[dict] | None:
            pods = [p for p in self.trainer_pods(name) if p["metadata"]["name"] not in exclude]
            ready = [p for p in pods if self.worker(p) is not None and self.worker(p).main[0].alive()]
            return pods if len(pods) == count and len(ready) == count else None

        return eventually(f"{count} running trainer pods of {name}", running)

    def worker(self, pod: dict):
        """The process node's worker of ``pod`` (its containers' processes), or None."""
        return next((w for w in self.nodes.current_workers() if w.uid == pod["metadata"]["uid"]), None)

    def log(self, pod: dict, container: str | None = None) -> str:
        container = container or pod["spec"]["containers"][0]["name"]
        return self.nodes.logs(self.ns, pod["metadata"]["name"], container)

    def pod_logs(self, name: str) -> str:
        folders = sorted(self.nodes.workdir.glob(f"pods/{self.ns}_{name}-*"))
        tails = [
            f"--- {log.parent.parent.name}/{log.name}\n{log.read_text(errors='replace')[-2500:]}"
            for folder in folders
            for log in sorted(folder.glob("logs/*.log"))
        ]
        return "\n".join(tails[-6:])

    # ------------------------------------------------------------------ storage

    def create_pvc(self, name: str = "ckpt") -> Path:
        """A ReadWriteMany claim (the nodes provision a hostPath volume for it); its folder here."""
        self.core.create_namespaced_persistent_volume_claim(
            self.ns,
            {
                "metadata": {"name": name},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )
        return self.nodes.claim_dir(self.ns, name)

    def volume(self, pod: dict, volume: str) -> Path:
        return self.nodes.pod_dir(self.ns, pod["metadata"]["name"]) / "volumes" / volume


class ProgressRecorder:
    """Every distinct ``.status.progress`` the run showed, read from the API while it ran."""

    def __init__(self, world: World, manifest: dict):
        self.world, self.manifest, self.seen = world, manifest, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            progress = self.world.status(self.manifest).get("progress")
            if progress and progress not in self.seen:
                self.seen.append(progress)
            time.sleep(0.3)

    def stop(self) -> list[dict]:
        self._stop.set()
        self._thread.join(5)
        return self.seen


def local_teacher(name: str, backend: str | None = None, training: dict | None = None, **spec) -> dict:
    """examples/local-teacher.yaml as run ``name``: ``training`` updates its spec.training, ``spec`` its spec."""
    teacher = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    teacher["metadata"]["name"] = name
    if backend:
        teacher["spec"]["backend"] = backend
    teacher["spec"]["training"].update(training or {})
    teacher["spec"].update(spec)
    return teacher


def metrics_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [r["step"] for r in metrics_lines(path) if "loss" in r] if path.is_file() else []


def assert_resumed_without_repeating_steps(
    log: str, out: Path, steps: int, every: int, ranks: int, saved_on_stop: bool = False
) -> int:
    """The restarted rank 0 resumed from a saved checkpoint — a periodic one, or with ``saved_on_stop`` the step a
    SIGTERM saved — and trained each remaining step exactly once; returns the step it resumed from."""
    resumed = re.findall(rf"done: rank 0/{ranks} at global step (\d+), resumed from \S+/checkpoint-(\d+)", log)
    assert resumed, f"the restarted rank 0 did not resume from a checkpoint:\n{log[-3000:]}"
    final_step, resumed_from = map(int, resumed[-1])
    assert final_step == steps and resumed_from >= every
    assert saved_on_stop or resumed_from % every == 0, f"resumed from {resumed_from}, saved every {every}"
    logged = logged_steps(out)
    assert logged[-(steps - resumed_from) :] == list(range(resumed_from + 1, steps + 1))  # each remaining step once
    assert (out / f"checkpoint-{steps}" / "trainer_state.json").is_file()
    return resumed_from


def checkpointed_run(world: World, name: str, backend: str, steps: int, every: int, nodes: int = 1, **spec) -> tuple:
    """The tiny AtlasTraining on ``backend``, checkpoints every ``every`` steps on the claim ``ckpt``: (the
    manifest, its output folder)."""
    out = world.create_pvc() / name
    manifest = tiny_training(
        name,
        backend=backend,
        resources={"nodes": nodes, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
        checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": every},
        **spec,
    )
    manifest["spec"]["training"]["maxSteps"] = steps
    return manifest, out


def wait_checkpoint(world: World, manifest: dict, out: Path, step: int) -> None:
    def saved() -> bool:
        if world.status(manifest).get("phase") in ("Failed", "Invalid"):
            raise AssertionError(
                f"the run ended: {world.status(manifest)}\n{world.pod_logs(manifest['metadata']['name'])}"
            )
        return (out / f"checkpoint-{step}" / "trainer_state.json").is_file()

    eventually(f"checkpoint-{step}", saved)


# ---------------------------------------------------------------------- PyTorchJob (the training-operator)


def test_a_two_node_teacher_trains_reports_progress_and_its_evaluated_result(world: World):
    """examples/local-teacher.yaml as a user applies it (the default backend, PyTorchJob), evaluated after training:
    progress (step, reward, KL) while it runs, from rank 0's metrics through the run's Service; ``.status.result``
    from the Master's termination message as the node posts it."""
    teacher = world.apply(
        local_teacher(
            "teacher",
            training={"maxSteps": 6},
            checkpoint={"path": "/checkpoints", "saveSteps": 3},
            evaluation={"samples": 1, "limit": 4},
        )
    )
    recorder = ProgressRecorder(world, teacher)
    master, worker = world.wait_trainer_pods("teacher", 2)
    status = world.wait_phase(teacher, "Succeeded", "Failed")
    seen = recorder.stop()
    assert status["phase"] == "Succeeded", world.pod_logs("teacher")
    assert master["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master"
    # Two pods, no spec.checkpoint.pvc: the operator says at once that restarts cannot resume, and why.
    shared = next(c for c in status["conditions"] if c["type"] == "CheckpointsShared")
    assert shared["status"] == "False" and "spec.checkpoint.pvc" in shared["message"], shared
    assert any(p.get("step", 0) >= 1 and "reward" in p and "kl" in p for p in seen), seen

    result = world.wait_status(teacher, lambda s: "result" in s, ".status.result", timeout=60)["result"]
    assert result["step"] == 6
    evaluation = result["evaluation"]
    assert evaluation["problems"] == 4
    assert evaluation["accuracyDelta"] == pytest.approx(evaluation["guidedAccuracy"] - evaluation["studentAccuracy"])
    # The Master's termination message, as the node read it from the container's file, is the result; rank 1
    # writes none.
    pods = {p["metadata"]["name"]: p for p in world.pods("app.kubernetes.io/instance=teacher")}
    terminated = pods[master["metadata"]["name"]]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "Completed" and results.parse_result_message(terminated["message"]) == result
    worker_state = pods[worker["metadata"]["name"]]["status"]["containerStatuses"][0]["state"]["terminated"]
    assert worker_state["reason"] == "Completed" and "message" not in worker_state
    # Both ranks trained every step: rank 0 published each checkpoint on its volume, rank 1 wrote its ZeRO shard
    # on its own (where nothing is published).
    out = world.volume(master, "checkpoints") / "teacher"
    assert logged_steps(out) == list(range(1, 7))
    assert (out / "checkpoint-6" / "trainer_state.json").is_file()
    report = json.loads((out / names.EVAL_DIR / names.EVAL_REPORT_FILE).read_text())
    assert evaluation == pytest.approx(
        results.parse_result_message(results.result_message(6, None, report))["evaluation"]
    )
    worker_out = world.volume(worker, "checkpoints") / "teacher"
    assert list(worker_out.glob(".atlas-staging/checkpoint-6/global_step6/*rank_1*")), sorted(worker_out.rglob("*"))


@pytest.fixture
def real_vllm_on_the_nodes(nodes: ProcessNodes, tmp_path) -> Iterator[str]:
    """For one test, the nodes' ``vllm`` is the CPU launcher (atlas_core/vllm_cpu.py) over the real CPU vLLM instead
    of the stand-in; the builtin SmolLM2 is built first (the launcher would build it in the pod, minutes in). Yields
    the student model to name."""
    from atlas_contract.checks import SMOLLM2_MODEL_URI
    from atlas_core.models.smollm2 import build_smollm2
    from atlas_core.vllm_cpu import install_program
    from tests.support.vllm import require_cpu_vllm

    launcher = install_program(tmp_path / "vllm-launcher", python=require_cpu_vllm())
    build_smollm2()
    standin_path = nodes.extra_env["PATH"]
    nodes.extra_env["PATH"] = os.pathsep.join((str(launcher), standin_path))
    try:
        yield SMOLLM2_MODEL_URI
    finally:
        nodes.extra_env["PATH"] = standin_path


def test_a_teachers_student_server_is_a_real_vllm_run_by_the_process_node(world: World, real_vllm_on_the_nodes: str):
    """PyTorchJob: the run's ``<name>-student`` Deployment → ReplicaSet → pod, run by a process node as the real
    vLLM (PyPI's CPU build, started from the operator's own ``vllm serve`` command line by the CPU launcher): the
    teacher waits for it to load, trains against its answers and is evaluated with them."""
    teacher = world.apply(
        local_teacher(
            "vllm-teacher",
            resources={"nodes": 1, "gpusPerNode": 0, "cpu": "1", "memory": "2Gi"},
            training={"maxSteps": 2},
            checkpoint={"path": "/checkpoints", "saveSteps": 2},
            evaluation={"samples": 1, "limit": 4},
            student={"model": real_vllm_on_the_nodes, "rollout": {"replicas": 1, "memory": "4Gi"}},
        )
    )
    (master,) = world.wait_trainer_pods("vllm-teacher", 1)
    status = world.wait_phase(teacher, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs("vllm-teacher")
    (server,) = world.run_pods("vllm-teacher", "student")
    assert server["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"  # the Deployment's
    # Not BestEffort (the API server's QoS class of its requests: CPU by default, memory set), and its probes differ:
    # readiness on vLLM's /health, liveness on its port alone, which the node probed (the pod became Ready and stayed).
    assert server["status"]["qosClass"] in ("Burstable", "Guaranteed"), server["status"].get("qosClass")
    (vllm,) = server["spec"]["containers"]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert vllm["livenessProbe"]["tcpSocket"]["port"] == "http"
    assert vllm["readinessProbe"] != vllm["livenessProbe"]
    assert vllm["resources"]["requests"]["ephemeral-storage"] and server["spec"]["nodeName"]  # placed with it
    assert server["status"]["containerStatuses"][0]["restartCount"] == 0  # liveness never failed
    log = world.log(server)
    assert "vllm (CPU launcher): " in log and "vLLM stand-in" not in log, log[-3000:]
    # vLLM's own access log: the trainer's student calls, answered by the real server
    answered = re.findall(r'"POST /v1/chat/completions HTTP/1.1" 200', log)
    result = world.wait_status(teacher, lambda s: "result" in s, ".status.result", timeout=60)["result"]
    assert result["step"] == 2 and result["evaluation"]["problems"] == 4
    out = world.volume(master, "checkpoints") / "vllm-teacher"
    rows = [json.loads(line) for line in (out / names.EVAL_DIR / names.EVAL_PROBLEMS_FILE).read_text().splitlines()]
    # every evaluated problem's student answers came from the server (alone and guided: K=1 each), real text
    assert len(answered) >= 2 * len(rows) and len({row["answers_alone"][0] for row in rows}) > 1, rows
    # the teacher waited for the server to load: no step trained on a batch the student could not score
    steps = [r for r in metrics_lines(out / "metrics.jsonl") if "loss" in r]
    assert [r.get("teaching/unscored_batches") for r in steps] == [0.0, 0.0], steps


def test_a_killed_worker_is_restarted_in_place_and_resumes_from_the_checkpoint(world: World):
    """PyTorchJob: the Worker's processes SIGKILLed (as an OOM kill); restartPolicy OnFailure restarts it in place,
    the Master's rendezvous fails and restarts too, and training resumes from the shared claim."""
    manifest, out = checkpointed_run(world, "resume-run", "PyTorchJob", steps=40, every=10, nodes=2)
    world.apply(manifest)
    wait_checkpoint(world, manifest, out, 10)
    master, worker = world.wait_trainer_pods("resume-run", 2)
    assert world.status(manifest)["phase"] == "Running", "the run finished before the Worker could be killed"
    for container in world.worker(worker).main:
        container.kill_all()
    status = world.wait_phase(manifest, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs("resume-run")
    pod = world.core.read_namespaced_pod(worker["metadata"]["name"], world.ns)
    restarted = pod.status.container_statuses[0]
    assert restarted.restart_count >= 1 and restarted.last_state.terminated.exit_code == 137, restarted
    assert_resumed_without_repeating_steps(world.log(master), out, 40, 10, ranks=2)


# ---------------------------------------------------------------------- TrainJob (the Kubeflow Trainer)


def test_a_stalled_trainer_is_ended_by_its_watchdog_and_the_gang_resumes(world: World):
    """TrainJob: the teacher's student endpoint (a server on this host, at the nodes' bridge address) stops
    answering; the step watchdog names it and exits with its code; the chart's ClusterTrainingRuntime's failure
    policy restarts the JobSet the Trainer made, the operator reports the restart, and once the endpoint answers
    again training resumes from the checkpoint."""
    from harness.judge_server import JudgeServer, Reply

    stalled = threading.Event()

    def answer(call):
        return Reply(content="The answer is 4.", delay_s=30 if stalled.is_set() else 0)

    with JudgeServer(answer, served_model="student", host=world.nodes.network.gateway) as student:
        out = world.create_pvc() / "stall-teacher"
        teacher = local_teacher(
            "stall-teacher",
            "TrainJob",
            resources={"nodes": 1, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
            training={"maxSteps": 12, "stepTimeoutSeconds": 8},
            checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 4},
            student={"model": student.base_url, "rollout": {"replicas": 0}},
        )
        world.apply(teacher)
        wait_checkpoint(world, teacher, out, 4)
        (trainer,) = world.wait_trainer_pods("stall-teacher", 1)
        assert trainer["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == "node"  # the Trainer's
        stalled.set()
        eventually("the watchdog", lambda: "atlas watchdog: no optimizer step" in world.log(trainer), timeout=90)
        stalled.clear()  # the endpoint answers again: the restarted gang can go on
        world.wait_status(teacher, lambda s: s.get("restarts") == 1, ".status.restarts 1", timeout=120)
        status = world.wait_phase(teacher, "Succeeded", "Failed")
    log = world.log(trainer)
    assert status["phase"] == "Succeeded", world.pod_logs("stall-teacher")
    reason = [line for line in log.splitlines() if line.startswith("atlas watchdog: no optimizer step")][-1]
    assert f"the student at {student.base_url}" in reason and "limit 8 s" in reason, reason
    assert "Thread 0x" in log  # every thread's stack, before the reason
    events = [e for e in world.events("stall-teacher") if e["reason"] == "WatchdogRestart"]
    assert len(events) == 1 and "restart 1 of 3" in events[0]["message"], events
    (new_trainer,) = [
        p for p in world.run_pods("stall-teacher") if p["metadata"]["name"] != trainer["metadata"]["name"]
    ]
    assert new_trainer["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    assert_resumed_without_repeating_steps(world.log(new_trainer), out, 12, 4, ranks=1)


# ---------------------------------------------------------------------- JobSet


def test_a_dead_student_server_restarts_the_whole_gang_which_resumes(world: World):
    """JobSet: the student server's process dies, its Job fails, and the JobSet restarts every Job (failurePolicy
    Recreate) — the server first, then the trainer once the new server is Ready (dependsOn) — and training resumes
    from the step the old trainer saved when the gang's SIGTERM reached it."""
    from atlas_contract.names import STOP_EXIT_CODE

    out = world.create_pvc() / "gang-teacher"
    teacher = world.apply(
        local_teacher(
            "gang-teacher",
            "JobSet",
            training={"maxSteps": 30},
            resources={"nodes": 1, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
            checkpoint={"pvc": "ckpt", "path": "/checkpoints", "saveSteps": 5},
            student={"model": "builtin://tiny-llama", "rollout": {"replicas": 1, "memory": "2Gi"}},
        )
    )
    wait_checkpoint(world, teacher, out, 5)
    (trainer,) = world.wait_trainer_pods("gang-teacher", 1)
    (server,) = world.run_pods("gang-teacher", "student")
    assert "vLLM stand-in" in world.log(server)
    old_trainer = world.worker(trainer).main[0].proc
    assert old_trainer.poll() is None, "the run finished before the server could be killed"
    for container in world.worker(server).main:
        container.kill_all()
    status = world.wait_status(teacher, lambda s: s.get("restarts") == 1, ".status.restarts 1", timeout=120)
    assert status["phase"] in ("Pending", "Running")  # a restart is not a failure
    (new_trainer,) = world.wait_trainer_pods("gang-teacher", 1, exclude=(trainer["metadata"]["name"],))
    assert old_trainer.poll() is not None  # the old trainer went with the gang, not left training
    (new_server,) = [p for p in world.run_pods("gang-teacher", "student") if not p["metadata"].get("deletionTimestamp")]
    for pod in (new_server, new_trainer):
        assert pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    # dependsOn: the new trainer's Job was made once the new server was Ready.
    ready = next(c for c in new_server["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and new_trainer["metadata"]["creationTimestamp"] >= ready["lastTransitionTime"]
    status = world.wait_phase(teacher, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs("gang-teacher")
    # The old trainer got the gang's SIGTERM (the JobSet deleted its Job; the pod's grace period): it saved the step in
    # flight and stopped, and the new one resumed from that step.
    assert old_trainer.returncode == STOP_EXIT_CODE, old_trainer.returncode
    log = world.log(new_trainer)
    resumed_from = assert_resumed_without_repeating_steps(log, out, 30, 5, ranks=1, saved_on_stop=True)
    assert status["preemption"]["step"] == resumed_from, status.get("preemption")  # the stop report, as reported


def test_a_drained_trainer_node_stops_every_rank_at_one_step_and_its_pods_are_recreated(world: World):
    """JobSet: one trainer pod evicted (as ``kubectl drain`` does: the Eviction API, the DisruptionTarget condition,
    SIGTERM). Every rank stops after the same step — the other learns it in the step's all-reduce — saves it and
    exits with the stop code; the trainer Job's podFailurePolicy ignores both exits and the Job controller recreates
    the pods, which resume from the checkpoint. No gang restart, nothing counted."""
    from atlas_contract.names import STOP_EXIT_CODE

    manifest, out = checkpointed_run(world, "drained-run", "JobSet", steps=15, every=50, nodes=2)
    world.apply(manifest)
    eventually("three trained steps", lambda: len(logged_steps(out)) >= 3)
    first, drained = world.wait_trainer_pods("drained-run", 2)
    processes = [world.worker(pod).main[0].proc for pod in (first, drained)]
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": drained["metadata"]["name"], "namespace": world.ns},
    }
    world.core.create_namespaced_pod_eviction(drained["metadata"]["name"], world.ns, eviction)
    eventually("both ranks' exits", lambda: all(p.poll() is not None for p in processes), timeout=120)
    assert [p.returncode for p in processes] == [STOP_EXIT_CODE, STOP_EXIT_CODE]
    stop = logged_steps(out)[-1]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    status = world.wait_phase(manifest, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs("drained-run")
    master = succeeded_rank_0(world, "drained-run")
    assert master["metadata"]["name"] != first["metadata"]["name"]  # a new pod for the index, in the same attempt
    assert master["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "0"
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in world.log(master)
    assert logged_steps(out) == list(range(1, 16))
    assert (status.get("restarts") or 0) == 0 and status["preemption"]["step"] == stop


def succeeded_rank_0(world: World, name: str) -> dict:
    """A JobSet run's rank-0 trainer pod that completed."""
    return next(
        p
        for p in world.run_pods(name)
        if p["status"].get("phase") == "Succeeded"
        and p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0"
    )


def kueue_queue(world: World, quota_cpu: str, quota_memory: str) -> tuple[str, str]:
    """A ResourceFlavor, a ClusterQueue (held: stopPolicy Hold; lower priorities preempted), a LocalQueue ``team``
    and a WorkloadPriorityClass; returns (the ClusterQueue's name, the priority class's)."""
    flavor, queue, priority = f"{world.ns}-flavor", f"{world.ns}-cq", f"{world.ns}-urgent"
    world.kube.kubectl(
        "apply",
        "-f",
        "-",
        input="\n---\n".join(
            json.dumps(o)
            for o in [
                {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": flavor}},
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "ClusterQueue",
                    "metadata": {"name": queue},
                    "spec": {
                        "namespaceSelector": {},
                        "stopPolicy": "Hold",
                        "preemption": {"withinClusterQueue": "LowerPriority"},
                        "resourceGroups": [
                            {
                                "coveredResources": ["cpu", "memory"],
                                "flavors": [
                                    {
                                        "name": flavor,
                                        "resources": [
                                            {"name": "cpu", "nominalQuota": quota_cpu},
                                            {"name": "memory", "nominalQuota": quota_memory},
                                        ],
                                    }
                                ],
                            }
                        ],
                    },
                },
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": "team", "namespace": world.ns},
                    "spec": {"clusterQueue": queue},
                },
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": priority},
                    "value": 1000,
                },
            ]
        ),
    )
    return queue, priority


def workloads(world: World, owner: str) -> list[dict]:
    """The Kueue Workloads of the object named ``owner`` (a JobSet, a Job)."""
    listed = world.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", world.ns, "workloads")
    return [w for w in listed["items"] if any(o["name"] == owner for o in w["metadata"].get("ownerReferences", []))]


def test_real_kueue_queues_admits_preempts_and_readmits_a_run_which_resumes(world: World):
    """JobSet under real Kueue: the run waits Queued (no pod) while its ClusterQueue holds; admitted, it trains; a
    higher-priority Job takes the queue's whole quota, Kueue preempts the run's workload (suspends its JobSet): every
    rank saves the step in flight and stops, the run is Queued, reason Preempted; the Job gone, Kueue readmits it
    and training resumes from the preemption's checkpoint, every step once, no restart counted."""
    from atlas_contract.names import STOP_EXIT_CODE

    cluster_queue, priority = kueue_queue(world, quota_cpu="2", quota_memory="2Gi")
    # Steps enough that Kueue's preemption lands mid-run: 15 tiny steps (about 4 s) once ended before it, under load.
    steps = 60
    manifest, out = checkpointed_run(world, "queued-run", "JobSet", steps=steps, every=100, nodes=2, queueName="team")
    world.apply(manifest)
    world.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued", timeout=60)
    (workload,) = eventually("the run's Workload", lambda: workloads(world, "queued-run"), timeout=60)
    assert workload["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    assert world.pods("app.kubernetes.io/instance=queued-run") == []

    world.custom.patch_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues", cluster_queue, {"spec": {"stopPolicy": "None"}}
    )
    eventually("three trained steps", lambda: len(logged_steps(out)) >= 3)
    first = world.wait_trainer_pods("queued-run", 2)
    processes = [world.worker(pod).main[0].proc for pod in first]
    # The JobSet's suspend is Kueue's from its create on: the operator never wrote it (field managers).
    jobset = world.custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", world.ns, "jobsets", "queued-run")
    assert jobset["spec"]["suspend"] is False

    preemptor = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "urgent",
            "labels": {"kueue.x-k8s.io/queue-name": "team", "kueue.x-k8s.io/priority-class": priority},
        },
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "command": ["sleep", "3600"],
                            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}},
                        }
                    ],
                }
            }
        },
    }
    world.kube.kubectl("create", "-n", world.ns, "-f", "-", input=json.dumps(preemptor))
    status = world.wait_status(
        manifest,
        lambda s: s.get("phase") == "Queued" and (s.get("preemption") or {}).get("saves") == 1,
        "Queued after the preemption, with the save",
    )
    eventually("both ranks' exits", lambda: all(p.poll() is not None for p in processes), timeout=120)
    assert [p.returncode for p in processes] == [STOP_EXIT_CODE, STOP_EXIT_CODE]
    training = next(c for c in status["conditions"] if c["type"] == "Training")
    stop = logged_steps(out)[-1]
    assert training["reason"] == "Preempted" and f"checkpoint-{stop}" in training["message"], training
    assert status["preemption"]["step"] == stop < steps
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{stop}"]
    (workload,) = workloads(world, "queued-run")
    evicted = {c["type"]: c for c in workload["status"]["conditions"]}  # Kueue's own account
    assert evicted["Evicted"]["reason"] == "Preempted", evicted.get("Evicted")

    world.kube.kubectl("delete", "job", "urgent", "-n", world.ns, "--wait=false")
    status = world.wait_phase(manifest, "Succeeded", "Failed")
    assert status["phase"] == "Succeeded", world.pod_logs("queued-run")
    master = succeeded_rank_0(world, "queued-run")
    assert f"resume: all 2 ranks resume from checkpoint-{stop}" in world.log(master)
    assert logged_steps(out) == list(range(1, steps + 1))  # no step lost, none repeated
    assert (status.get("restarts") or 0) == 0  # a preemption is not a restart


def test_the_real_trainers_jobset_of_a_run_is_the_one_the_render_tests_model(world: World):
    """TrainJob, suspended (nothing runs): the JobSet the real Trainer makes of the run's TrainJob on the chart's
    runtime equals tests/support/trainer_jobset.py's ``build_jobset`` of the same two objects — the model the
    render-level tests compare the backends with — in every field of every replicated job's pod template."""
    from tests.support.trainer_jobset import build_jobset

    world.apply(local_teacher("tj-shape", "TrainJob", suspend=True))
    trainjob = eventually(
        "the TrainJob",
        lambda: next(
            iter(
                world.custom.list_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", world.ns, "trainjobs")[
                    "items"
                ]
            ),
            None,
        ),
        timeout=60,
    )
    jobset = eventually(
        "the Trainer's JobSet",
        lambda: next(
            iter(
                world.custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", world.ns, "jobsets")["items"]
            ),
            None,
        ),
        timeout=60,
    )
    runtime = world.custom.get_cluster_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes", trainjob["spec"]["runtimeRef"]["name"]
    )
    modelled = build_jobset(trainjob, runtime)
    assert jobset["spec"]["suspend"] is True and modelled["spec"]["suspend"] is True
    owner = jobset["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner.get("controller")) == ("TrainJob", "tj-shape", True)
    assert {k: v for k, v in jobset["metadata"].get("labels", {}).items() if k in modelled["metadata"]["labels"]} == (
        modelled["metadata"]["labels"]
    )
    real = {r["name"]: r for r in jobset["spec"]["replicatedJobs"]}
    model = {r["name"]: r for r in modelled["spec"]["replicatedJobs"]}
    assert set(real) == set(model)
    for name, rjob in model.items():
        real_job, model_job = real[name]["template"]["spec"], rjob["template"]["spec"]
        for key in ("parallelism", "completions", "podFailurePolicy"):
            assert real_job.get(key) == model_job.get(key), (name, key, real_job.get(key), model_job.get(key))
        real_pod, model_pod = real_job["template"]["spec"], model_job["template"]["spec"]
        differences = [
            (f"{name}.{key}", real_pod.get(key), model_pod.get(key))
            for key in sorted((set(real_pod) | set(model_pod)) - {"containers"})
            if real_pod.get(key) != model_pod.get(key)
        ]
        real_containers = {c["name"]: c for c in real_pod["containers"]}
        for container in model_pod["containers"]:
            real_container = real_containers.get(container["name"], {})
            differences += [
                (f"{name}.containers[{container['name']}].{key}", real_container.get(key), container.get(key))
                for key in sorted(set(real_container) | set(container))
                if real_container.get(key) != container.get(key)
            ]
        assert differences == [], "\n".join(
            f"{where}: real {real!r}, model {model!r}" for where, real, model in differences
        )
