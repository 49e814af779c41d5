"""The local JobSet executor (``JobSetExecutor``, tests/support/jobset_executor.py) on the API emulator, with real
processes.

JobSets built by hand in the shape the operator renders for ``spec.backend: JobSet`` (docs/architecture.md):
replicated jobs ``rollout`` (and ``student``), one pod each, a ``vllm serve`` container (run as the executor's
local HTTP stand-in) with a readiness probe; ``trainer``, Indexed, one pod per node, ``dependsOn`` the servers
Ready; ``enableDNSHostnames``; ``successPolicy`` on the trainer; ``failurePolicy.maxRestarts``; every Job
``restartPolicy: Never``, ``backoffLimit: 0``. No operator here: these show the executor behaves as the JobSet
v0.12.0 and Job controllers do, so that the operator's end-to-end tests on it mean something.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import kubernetes
import pytest

from tests.support.jobset_executor import JobSetExecutor
from tests.support.kube_emulator import JOBS, JOBSETS, PODS, EmulatorThread, wait_for, write_kubeconfig
from tests.support.operator_cluster import KUEUE_QUEUE_LABEL, kueue_admit
from tests.support.vllm_standin import VLLM_STANDIN_ANSWER

pytestmark = pytest.mark.timeout(120)

NS = "team-a"
TIMEOUT = 30

SLOW_SERVER = """
import os, time, http.server
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": [{"id": "slow-model"}]}' if self.path == "/v1/models" else b"{}"
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
time.sleep(2.0)  # a slow start: not Ready for 2 s
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Health).serve_forever()
"""

TRAINER = """
import json, os, socket, sys, time, urllib.request
index = int(os.environ["JOB_COMPLETION_INDEX"])
print(f"index {index} hostname {os.environ['HOSTNAME']} master {os.environ['MASTER_ADDR']}", flush=True)
print("args", sys.argv[1:], flush=True)
with urllib.request.urlopen(os.environ["ROLLOUT_URL"] + "/models", timeout=5) as answer:
    print("rollout serves", json.load(answer)["data"][0]["id"], flush=True)
address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if index == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(address)
    server.listen()
    for _ in range(int(os.environ["NODES"]) - 1):
        peer, _ = server.accept()
        print("rank 0 heard:", peer.recv(100).decode(), flush=True)
else:
    for _ in range(200):
        try:
            peer = socket.create_connection(address, timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    peer.sendall(f"hello from rank {index}".encode())
if os.environ.get("CHAT_URL"):
    request = {"model": "student-model", "messages": [{"role": "user", "content": "2+2?"}]}
    headers = {"Content-Type": "application/json"}
    call = urllib.request.Request(os.environ["CHAT_URL"], json.dumps(request).encode(), headers)
    with urllib.request.urlopen(call, timeout=5) as answer:
        print("student says:", json.load(answer)["choices"][0]["message"]["content"], flush=True)
time.sleep(float(os.environ.get("LINGER", "0")))
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def server_job(name: str, model: str, command: list[str] | None = None) -> dict:
    container = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.11.0",
        "command": command or ["vllm", "serve", model, "--port", "8000", "--served-model-name", model],
        "env": [{"name": "PORT", "value": "8000"}],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 5},
    }
    return {
        "name": name,
        "replicas": 1,
        "template": {
            "spec": {
                "completions": 1,
                "parallelism": 1,
                "backoffLimit": 0,
                "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
            }
        },
    }


def jobset(
    name: str,
    nodes: int = 2,
    servers: tuple[str, ...] = ("rollout",),
    max_restarts: int = 1,
    env: dict[str, str] | None = None,
    suspend: bool | None = None,
    queue: str | None = None,
    rollout_command: list[str] | None = None,
) -> dict:
    variables = {
        "MASTER_ADDR": f"{name}-trainer-0-0.{name}",
        "MASTER_PORT": "29500",
        "ROLLOUT_URL": f"http://{name}-rollout-0-0.{name}.{NS}.svc.cluster.local:8000/v1",
        "NODES": str(nodes),
        **(env or {}),
    }
    trainer = {
        "name": "trainer",
        "replicas": 1,
        "dependsOn": [{"name": s, "status": "Ready"} for s in servers],
        "template": {
            "spec": {
                "completionMode": "Indexed",
                "completions": nodes,
                "parallelism": nodes,
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "registry.example/atlas-trainer:test",
                                "command": ["python", "-c", TRAINER],
                                "args": ["--machine_rank", "$(JOB_COMPLETION_INDEX)", "$$(NODES)", "$(UNSET)"],
                                "env": [{"name": k, "value": v} for k, v in variables.items()],
                                "ports": [{"name": "rendezvous", "containerPort": 29500}],
                            }
                        ],
                    }
                },
            }
        },
    }
    rjobs = [server_job(s, f"{s}-model", rollout_command if s == "rollout" else None) for s in servers]
    manifest = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": NS, "labels": {}},
        "spec": {
            "replicatedJobs": [*rjobs, trainer],
            "network": {"enableDNSHostnames": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
            "failurePolicy": {"maxRestarts": max_restarts},
        },
    }
    if suspend is not None:
        manifest["spec"]["suspend"] = suspend
    if queue:
        manifest["metadata"]["labels"][KUEUE_QUEUE_LABEL] = queue
    return manifest


class Cluster:
    def __init__(self, server, executor, api_client):
        self.emu, self.executor, self.api_client = server.emulator, executor, api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)

    def create(self, manifest: dict) -> dict:
        return self.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets", manifest)

    def status(self, name: str) -> dict:
        return (self.emu.get(JOBSETS, NS, name) or {}).get("status") or {}

    def condition(self, name: str, type_: str) -> dict:
        return next((c for c in self.status(name).get("conditions", []) if c["type"] == type_), {})

    def rjob_status(self, name: str, rjob: str) -> dict:
        return next((s for s in self.status(name).get("replicatedJobsStatus", []) if s["name"] == rjob), {})

    def pods(self, name: str, rjob: str | None = None) -> list[dict]:
        return [
            p
            for p in self.emu.list(PODS, NS)
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == name
            and (rjob is None or p["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"] == rjob)
        ]

    def logs(self, name: str) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.log.read_text(errors='replace')[-2000:]}"
            for p in self.executor.jobset_pods(name)
            if p.log.exists()
        )

    def wait(self, name: str, predicate, what: str, timeout: float = TIMEOUT) -> dict:
        try:
            wait_for(lambda: predicate(self.status(name)), timeout=timeout, what=what, interval=0.1)
        except AssertionError as exc:
            run = self.executor.run_of(name)
            raise AssertionError(
                f"{exc}; status: {self.status(name)}\n{run.log if run else ''}\n{self.logs(name)}"
            ) from None
        return self.status(name)


@pytest.fixture
def cluster(tmp_path):
    with EmulatorThread() as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        executor = JobSetExecutor(api_client, tmp_path / "pods", NS, Path(sys.executable).parent, poll_s=0.1).start()
        try:
            yield Cluster(server, executor, api_client)
        finally:
            executor.stop()


def completed(status: dict) -> bool:
    return status.get("terminalState") in ("Completed", "Failed")


def test_trainer_starts_only_once_the_servers_are_ready(cluster):
    """dependsOn Ready: no trainer Job (nor pod) while the rollout server is not Ready; its readiness comes from
    the container's readinessProbe against the server itself (here a plain server that takes 2 s to listen)."""
    name = "deps"
    slow = ["python", "-c", SLOW_SERVER]
    cluster.create(jobset(name, nodes=1, servers=("rollout", "student"), rollout_command=slow))
    wait_for(lambda: len(cluster.pods(name)) == 2, timeout=TIMEOUT, what="the two server pods")
    (rollout,) = cluster.executor.jobset_pods(name, "rollout")
    time.sleep(1.0)  # the rollout server is still sleeping
    assert cluster.emu.get(JOBS, NS, f"{name}-trainer-0") is None
    assert cluster.pods(name, "trainer") == []
    assert cluster.rjob_status(name, "rollout")["ready"] == 0 and cluster.rjob_status(name, "student")["ready"] == 1
    status = cluster.wait(name, completed, "the JobSet to finish")
    assert status["terminalState"] == "Completed", cluster.logs(name)
    (trainer,) = cluster.executor.jobset_pods(name, "trainer")
    run = cluster.executor.run_of(name)
    created = [line for line in run.log if line.startswith("created job")]
    assert created == [f"created job {name}-{r}-0 (attempt 0)" for r in ("rollout", "student", "trainer")]
    # The trainer's process started only after the slow server listened (2 s after it started) and was probed.
    assert trainer.spawned_at - rollout.spawned_at >= 2.0
    assert any("`vllm serve student-model` runs as the local vLLM stand-in" in line for line in run.log)


def test_indexed_trainer_pods_get_their_index_and_reach_each_other_by_hostname(cluster):
    name = "idx"
    cluster.create(jobset(name, nodes=2, env={"LINGER": "0.5"}))
    status = cluster.wait(name, completed, "the JobSet to finish")
    assert status["terminalState"] == "Completed", cluster.logs(name)
    pods = sorted(cluster.pods(name, "trainer"), key=lambda p: p["spec"]["hostname"])
    assert [p["spec"]["hostname"] for p in pods] == [f"{name}-trainer-0-0", f"{name}-trainer-0-1"]
    assert all(p["spec"]["subdomain"] == name for p in pods)
    assert [p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1"]
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert pod["metadata"]["name"].startswith(pod["spec"]["hostname"] + "-")
        assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "trainer"
        assert labels["jobset.sigs.k8s.io/restart-attempt"] == "0"
        assert labels["jobset.sigs.k8s.io/job-global-index"] == "1"  # after the one rollout Job
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
        assert pod["status"]["phase"] == "Succeeded"
    rank0, rank1 = cluster.executor.jobset_pods(name, "trainer")
    log0, log1 = rank0.log.read_text(), rank1.log.read_text()
    # JOB_COMPLETION_INDEX per pod; the master's JobSet hostname and rendezvous port remapped to this machine.
    assert f"index 0 hostname {name}-trainer-0-0 master 127.0.0.1" in log0
    assert f"index 1 hostname {name}-trainer-0-1 master 127.0.0.1" in log1
    assert "rank 0 heard: hello from rank 1" in log0
    # $(VAR) in args expanded as the kubelet does (from the container's env, JOB_COMPLETION_INDEX included).
    assert "args ['--machine_rank', '1', '$(NODES)', '$(UNSET)']" in log1
    assert "rollout serves rollout-model" in log0 and "rollout serves rollout-model" in log1
    # The headless Service the JobSet controller creates for the hostnames.
    service = cluster.emu.get("v1/services", NS, name)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"jobset.sigs.k8s.io/jobset-name": name}


def test_trainer_success_completes_the_jobset_and_stops_the_servers(cluster):
    name = "done"
    chat = f"http://{name}-student-0-0.{name}:8000/v1/chat/completions"
    cluster.create(jobset(name, nodes=1, servers=("rollout", "student"), env={"CHAT_URL": chat, "LINGER": "1"}))
    cluster.wait(name, lambda s: cluster.rjob_status(name, "trainer").get("active") == 1, "the trainer running")
    servers = [p for p in cluster.executor.jobset_pods(name) if p.replica_type != "trainer"]
    assert len(servers) == 2 and all(p.proc.poll() is None for p in servers)
    status = cluster.wait(name, completed, "the JobSet to finish")
    assert status["terminalState"] == "Completed", cluster.logs(name)
    done = cluster.condition(name, "Completed")
    assert (done["status"], done["reason"], done["message"]) == (
        "True",
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert status["restarts"] == 0
    wait_for(lambda: all(p.proc.poll() is not None for p in servers), what="the server processes stopped")
    assert [p for p in cluster.executor.jobset_pods(name) if p.replica_type != "trainer"] == []
    run = cluster.executor.run_of(name)
    assert f"deleted job {name}-rollout-0" in run.log and f"deleted job {name}-student-0" in run.log
    wait_for(lambda: cluster.pods(name, "rollout") == [] and cluster.pods(name, "student") == [], what="server pods")
    assert cluster.emu.get(JOBS, NS, f"{name}-rollout-0") is None
    trainer_job = cluster.emu.get(JOBS, NS, f"{name}-trainer-0")  # a finished Job stays
    assert trainer_job["status"]["conditions"][0]["type"] == "Complete"
    assert {s["name"]: s["succeeded"] for s in status["replicatedJobsStatus"]} == {
        "rollout": 0,
        "student": 0,
        "trainer": 1,
    }
    # The student's vLLM stand-in answered the trainer as an OpenAI server would (the scripted answer).
    (trainer,) = cluster.executor.jobset_pods(name, "trainer")
    assert f"student says: {VLLM_STANDIN_ANSWER}" in trainer.log.read_text()


def test_a_dead_server_restarts_the_whole_gang_until_max_restarts(cluster):
    name = "gang"
    cluster.create(jobset(name, nodes=2, max_restarts=1, env={"LINGER": "120"}))
    cluster.wait(name, lambda s: cluster.rjob_status(name, "trainer").get("active") == 1, "the trainer running")
    wait_for(lambda: len(cluster.pods(name, "trainer")) == 2, what="two trainer pods")
    first = {p["metadata"]["name"] for p in cluster.pods(name)}
    (server,) = cluster.executor.jobset_pods(name, "rollout")
    old_trainers = cluster.executor.jobset_pods(name, "trainer")
    server.kill()  # the vLLM server's process dies: its Job fails (backoffLimit 0), the JobSet restarts
    status = cluster.wait(name, lambda s: s.get("restarts") == 1, "a restart")
    restarting = cluster.condition(name, "RestartingJobSet")
    assert (
        restarting["reason"] == "DefaultFailurePolicy"
        and f"first failed job: {name}-rollout-0" in restarting["message"]
    )
    wait_for(lambda: all(p.proc.poll() is not None for p in old_trainers), what="the whole gang, not only the server")
    cluster.wait(
        name,
        lambda s: (
            len([p for p in cluster.pods(name, "trainer") if p["metadata"]["name"] not in first]) == 2
            and cluster.rjob_status(name, "trainer").get("ready") == 1
        ),
        "the gang recreated and Ready",
    )
    pods = cluster.pods(name)
    assert {p["metadata"]["name"] for p in pods}.isdisjoint(first)  # every pod is new
    assert {p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] for p in pods} == {"1"}
    job = cluster.emu.get(JOBS, NS, f"{name}-trainer-0")
    assert job["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    cluster.wait(
        name,
        lambda s: cluster.condition(name, "RestartingJobSet").get("reason") == "JobsReady",
        "RestartingJobSet False, JobsReady",
    )
    assert cluster.condition(name, "RestartingJobSet")["status"] == "False"
    # Beyond maxRestarts: Failed.
    (server,) = cluster.executor.jobset_pods(name, "rollout")
    trainers = cluster.executor.jobset_pods(name, "trainer")
    server.kill()
    status = cluster.wait(name, completed, "the JobSet to fail")
    assert status["terminalState"] == "Failed" and status["restarts"] == 1
    failed = cluster.condition(name, "Failed")
    assert failed["reason"] == "ReachedMaxRestarts" and f"(first failed job: {name}-rollout-0)" in failed["message"]
    wait_for(lambda: all(p.proc.poll() is not None for p in trainers), what="the trainer pods ended")
    wait_for(lambda: cluster.pods(name, "trainer") == [], what="the trainer Job and pods deleted")


def test_a_queued_jobset_runs_nothing_until_kueue_admits_it(cluster):
    name = "queued"
    cluster.create(jobset(name, nodes=1, suspend=True, queue="team-a-queue"))
    cluster.wait(name, lambda s: cluster.condition(name, "Suspended").get("status") == "True", "Suspended")
    time.sleep(1.0)
    assert cluster.pods(name) == [] and cluster.executor.jobset_pods(name) == []
    rollout_job = cluster.emu.get(JOBS, NS, f"{name}-rollout-0")  # created suspended, as the controller does
    assert rollout_job["spec"]["suspend"] is True
    assert cluster.emu.get(JOBS, NS, f"{name}-trainer-0") is None  # dependsOn: no Ready server yet
    assert cluster.rjob_status(name, "rollout")["suspended"] == 1
    kueue_admit(cluster.api_client, name, NS, node_selector={"cloud.example/flavor": "cpu"})
    status = cluster.wait(name, completed, "the admitted JobSet to finish")
    assert status["terminalState"] == "Completed", cluster.logs(name)
    resumed = cluster.condition(name, "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "ResumeJobs")
    (trainer,) = cluster.pods(name, "trainer")
    assert trainer["spec"]["nodeSelector"] == {"cloud.example/flavor": "cpu"}
    labels = trainer["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/podset"] == "trainer" and labels["kueue.x-k8s.io/local-queue-name"] == "team-a-queue"
    assert trainer["metadata"]["annotations"]["kueue.x-k8s.io/workload"].startswith(f"jobset-{name}-")


def test_suspending_a_running_jobset_stops_its_pods_and_resuming_starts_the_servers_first(cluster):
    name = "pause"
    cluster.create(jobset(name, nodes=1, env={"LINGER": "1.5"}))
    cluster.wait(name, lambda s: cluster.rjob_status(name, "trainer").get("ready") == 1, "the trainer running")
    running = cluster.executor.jobset_pods(name)
    cluster.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", name, {"spec": {"suspend": True}}
    )
    cluster.wait(name, lambda s: cluster.condition(name, "Suspended").get("status") == "True", "Suspended")
    wait_for(lambda: all(p.proc.poll() is not None for p in running), what="the pods of the suspended Jobs killed")
    wait_for(lambda: cluster.pods(name) == [], what="their Pod objects deleted")
    assert cluster.emu.get(JOBS, NS, f"{name}-trainer-0")["spec"]["suspend"] is True
    cluster.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", name, {"spec": {"suspend": False}}
    )
    status = cluster.wait(name, completed, "the resumed JobSet to finish")
    assert status["terminalState"] == "Completed" and status["restarts"] == 0, cluster.logs(name)
    log = cluster.executor.run_of(name).log
    resumed = [line for line in log if line.startswith("resumed job")]
    assert resumed == [f"resumed job {name}-rollout-0", f"resumed job {name}-trainer-0"]  # the server first
    (trainer,) = cluster.executor.jobset_pods(name, "trainer")  # a new pod, after the resumed server's
    assert trainer.spawned_at > max(p.spawned_at for p in running) and trainer not in running


def test_without_a_failure_policy_a_failed_trainer_fails_the_jobset(cluster):
    name = "nopolicy"
    manifest = jobset(name, nodes=1, env={"EXIT_CODE": "3"})
    del manifest["spec"]["failurePolicy"]
    cluster.create(manifest)
    status = cluster.wait(name, completed, "the JobSet to fail")
    assert status["terminalState"] == "Failed" and status["restarts"] == 0
    failed = cluster.condition(name, "Failed")
    assert (failed["reason"], failed["message"]) == (
        "FailedJobs",
        f"jobset failed due to one or more job failures (first failed job: {name}-trainer-0)",
    )
    job = cluster.emu.get(JOBS, NS, f"{name}-trainer-0")  # the Job controller's verdict (backoffLimit 0)
    assert job["status"]["conditions"][0]["reason"] == "BackoffLimitExceeded" and job["status"]["failed"] == 1
    (pod,) = cluster.pods(name, "trainer")
    assert pod["status"]["phase"] == "Failed"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert cluster.condition(name, "RestartingJobSet") == {}  # never added: it was never True
