"""An operator on the API emulator: `atlas operator` as a process (OperatorProcess), a Cluster to write runs and the
objects and statuses the operator reads (by hand: no controller runs here; the real ones run in tests/kube/), and read
back what the operator did."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from pathlib import Path

import kubernetes
import pytest

from atlas_contract.names import ChildNames
from harness.env import free_port, python_env
from harness.kube_emulator import NETWORK_POLICIES, PYTORCHJOBS, TEACHERS, TRAININGS, EmulatorThread, write_kubeconfig
from harness.manifests import GROUP, NS, VERSION
from harness.polling import wait_for

TIMEOUT = 30


class OperatorProcess:
    """`atlas operator` as users run it, against the emulator, with fast timers for tests."""

    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        metrics_url: str = "http://127.0.0.1:1/metrics",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.args = args
        self.metrics_port = free_port()
        self.env = python_env(
            KUBECONFIG=str(kubeconfig),
            ATLAS_PROGRESS_INTERVAL="1",
            ATLAS_RETRY_DELAY="0.5",
            ATLAS_OPERATOR_METRICS_PORT=str(self.metrics_port),
            ATLAS_OPERATOR_METRICS_HOST="127.0.0.1",
            ATLAS_METRICS_URL_TEMPLATE=metrics_url,
            ATLAS_TRAINER_IMAGE="registry.example/atlas-trainer:test",
        )
        self.env.update(env or {})
        self.log = log
        self.proc = None

    def start(self) -> OperatorProcess:

        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "atlas_cli.main", "operator", "--verbose", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}{path}", timeout=5) as response:
            return response.status, response.read().decode()


class Cluster:
    def __init__(self, server: EmulatorThread, kubeconfig: Path, operator: OperatorProcess):
        self.server = server  # server.run(coroutine): kmock's async-only APIs, on the emulator's loop
        self.emu = server.emulator
        self.operator = operator
        self.api_client = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        self.custom = kubernetes.client.CustomObjectsApi(self.api_client)
        self.created: list[dict] = []

    def restart_operator(self, log: Path, **env: str) -> None:
        """Stop the operator and start it again on the same cluster with ``env`` (a changed operator setting)."""
        self.operator.stop()
        self.operator = OperatorProcess(Path(self.operator.env["KUBECONFIG"]), log, env=env).start()

    # kubectl-like writes
    def apply(self, manifest: dict) -> dict:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.created.append(manifest)
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, manifest)

    def delete_created(self) -> None:
        """Keep the shared operator's load flat: each test's runs go when it ends."""
        for manifest in self.created:
            if self.run(manifest) is not None:
                self.delete_run(manifest)
        self.created.clear()

    def patch_spec(self, manifest: dict, spec: dict) -> None:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, NS, plural, manifest["metadata"]["name"], {"spec": spec}
        )

    def delete_run(self, manifest: dict) -> None:
        plural = "atlasteachers" if manifest["kind"] == "AtlasTeacher" else "atlastrainings"
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, plural, manifest["metadata"]["name"])

    def set_job_conditions(self, name: str, *types: str, message: str = "") -> None:
        """What the Kubeflow controller writes: conditions in order, the last one True."""
        conditions = [
            {
                "type": t,
                "status": "True" if i == len(types) - 1 else "False",
                "reason": f"PyTorchJob{t}",
                "message": message or f"PyTorchJob {name} is {t.lower()}.",
            }
            for i, t in enumerate(types)
        ]
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", NS, "pytorchjobs", name, {"status": {"conditions": conditions}}
        )

    def finish_master_pod(self, name: str, message: str | None, exit_code: int = 0) -> dict:
        """What Kubeflow and the kubelet leave of job ``name``'s finished Master: Pod ``<name>-master-0``, owned by
        the job, its ``pytorch`` container terminated with ``message`` (the termination message)."""
        job = self.emu.get(PYTORCHJOBS, NS, name)
        core = kubernetes.client.CoreV1Api(self.api_client)
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": job["metadata"]["uid"]}
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": f"{name}-master-0", "ownerReferences": [{**owner, "controller": True}]},
                "spec": {"containers": [{"name": "pytorch", "image": "registry.example/atlas-trainer:test"}]},
            },
        )
        terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
        if message is not None:
            terminated["message"] = message
        status = {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "registry.example/atlas-trainer:test",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }
            ],
        }
        core.patch_namespaced_pod_status(
            f"{name}-master-0", NS, {"status": status}, _content_type="application/merge-patch+json"
        )
        return self.emu.get("v1/pods", NS, f"{name}-master-0")

    def kubelet_pod(self, name: str, template: dict, container: str, state: dict) -> dict:
        """Pod ``name`` as a job's controller makes it from pod ``template`` (its labels), with the container's
        state as the kubelet reports it, e.g. ``{"waiting": {"reason": "ImagePullBackOff", "message": ...}}``."""
        core = kubernetes.client.CoreV1Api(self.api_client)
        if self.emu.get("v1/pods", NS, name) is None:
            core.create_namespaced_pod(
                NS,
                {
                    "metadata": {"name": name, "labels": dict(template["metadata"]["labels"])},
                    "spec": {"containers": [{"name": container, "image": "registry.example/private:1"}]},
                },
            )
        status = {
            "phase": "Running" if "running" in state else "Pending",
            "containerStatuses": [
                {
                    "name": container,
                    "image": "registry.example/private:1",
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "state": state,
                }
            ],
        }
        core.patch_namespaced_pod_status(name, NS, {"status": status}, _content_type="application/merge-patch+json")
        return self.emu.get("v1/pods", NS, name)

    def pod_reads(self, name: str) -> list:
        """The operator's requests for pod ``name``."""
        return self.emu.calls(
            lambda c: c.resource == "pods" and c.name == name and (c.user_agent or "").startswith("atlas-operator/")
        )

    # reads
    def run(self, manifest: dict) -> dict | None:
        resource = TEACHERS if manifest["kind"] == "AtlasTeacher" else TRAININGS
        return self.emu.get(resource, NS, manifest["metadata"]["name"])

    def status(self, manifest: dict) -> dict:
        return (self.run(manifest) or {}).get("status") or {}

    def wait_status(self, manifest: dict, predicate, what: str, timeout: float = TIMEOUT) -> dict:
        try:
            wait_for(lambda: predicate(self.status(manifest)), timeout=timeout, what=what, interval=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; status: {self.status(manifest)}\n{self.operator.output()[-3000:]}") from None
        return self.status(manifest)

    def condition(self, manifest: dict, type_: str) -> dict:
        return next((c for c in self.status(manifest).get("conditions", []) if c["type"] == type_), {})

    def events(self, name: str) -> list[dict]:
        return [e for e in self.emu.list("v1/events", NS) if e.get("involvedObject", {}).get("name") == name]


def children_of(name: str, teacher_run: bool = True) -> dict[str, tuple[str, str]]:
    """What the operator makes for a PyTorchJob run ``name`` (names from atlas_contract.names.ChildNames)."""
    owned = ChildNames(name)
    names = {
        "config": ("v1/configmaps", owned.config_map),
        "metrics": ("v1/services", owned.metrics),
        "rollout-svc": ("v1/services", owned.rollout),
        "rollout": ("apps/v1/deployments", owned.rollout),
        "job": (PYTORCHJOBS, owned.job),
        "network": (NETWORK_POLICIES, owned.network_policy),
        "trainer-network": (NETWORK_POLICIES, owned.trainer_network_policy),
    }
    if teacher_run:
        names |= {
            "student-svc": ("v1/services", owned.student),
            "student": ("apps/v1/deployments", owned.student),
        }
    return names


def start_cluster(
    tmp_path: Path,
    metrics_url: str = "http://127.0.0.1:1/metrics",
    operator_args=(),
    operator_env: dict[str, str] | None = None,
    namespaces: tuple[str, ...] = (),
    **emulator_options,
):
    """An emulator and an operator watching it; ``namespaces`` are created first (kopf serving named
    namespaces waits for their Namespace objects)."""
    server = EmulatorThread(**emulator_options).__enter__()
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    core = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=str(kubeconfig)))
    for namespace in namespaces:
        core.create_namespace({"metadata": {"name": namespace}})
    operator = OperatorProcess(
        kubeconfig, tmp_path / "operator.log", metrics_url, tuple(operator_args), operator_env
    ).start()
    # Ready when kopf watches both kinds: a run created earlier could reach it twice (list, then replay).
    wait_for(
        lambda: (
            {c.resource for c in server.emulator.calls(lambda c: c.query.get("watch") == "true")}
            >= {"atlastrainings", "atlasteachers"}
        ),
        timeout=60,
        what="the operator watching runs",
    )
    return server, Cluster(server, kubeconfig, operator)


def wait_children(cluster: Cluster, name: str, teacher_run: bool = True) -> dict[str, dict]:
    wanted = children_of(name, teacher_run)
    wait_for(
        lambda: all(cluster.emu.get(r, NS, n) for r, n in wanted.values()), timeout=TIMEOUT, what=f"children of {name}"
    )
    return {key: cluster.emu.get(r, NS, n) for key, (r, n) in wanted.items()}


@contextlib.contextmanager
def own_cluster(tmp_path: Path, **options):
    """A cluster (emulator + operator) of a test's own, stopped when the test ends."""
    server, cluster = start_cluster(tmp_path, **options)
    try:
        yield cluster
    finally:
        cluster.operator.stop()
        server.__exit__(None, None, None)


def permissions_used(emu) -> set[tuple[str, str, str]]:
    """(group, resource[/subresource], verb) of every call the operator process made: its own client
    ("atlas-operator/…") and kopf's."""
    return {
        (c.group, c.resource + (f"/{c.subresource}" if c.subresource else ""), c.verb)
        for c in emu.calls(lambda c: (c.user_agent or "").startswith(("atlas-operator/", "kopf/")))
        if c.verb is not None
    }


KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"  # the queue label a queued job carries


@pytest.fixture(autouse=True)
def cleanup_runs(request):
    """After each test of a module that imports this fixture: the runs it created are deleted from its
    module's ``cluster`` (an operator and an emulator shared by the module's tests)."""
    yield
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster").delete_created()
