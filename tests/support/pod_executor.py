"""A local stand-in for the Kubeflow Training Operator + kubelet, for end-to-end tests (not a product feature).

It watches PyTorchJobs on the Kubernetes API (the kmock emulator) and runs each replica's ``pytorch``
container as a local process group, with what a cluster would give it:

* the environment the Kubeflow controller injects: MASTER_ADDR=127.0.0.1, MASTER_PORT (one free port
  per job), PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, WORLD_SIZE, RANK — plus the container's
  own ``env`` (values, ``fieldRef`` metadata.namespace, ``secretKeyRef`` read from the API);
* volumes under a temp dir: a ConfigMap's keys written as files, an emptyDir per pod, a PVC shared by
  every pod that claims it; every mount path is remapped (in the command, env values and the
  ConfigMap files) to its directory here;
* PyTorchJob status written as the controller would: Created → Running → Succeeded, or Failed with the
  exit code; Restarting when a replica exits non-zero and the restart policy (OnFailure) allows it,
  up to runPolicy.backoffLimit; ``replicaStatuses`` with active/succeeded/failed counts.

* Pod objects ``<job>-<replica type, lowercase>-<index>`` in the API, as the controller names them (owner: the
  job) and as the kubelet reports them: Running, then ``containerStatuses[].state.terminated`` with the exit
  code, reason ``Completed`` or ``Error`` and the termination message — the container's
  ``terminationMessagePath`` is a fresh local file per (re)start (remapped in the env and command like a
  mount), read back when the process exits and cut to 4096 bytes as the kubelet cuts it
  (``terminationMessagePolicy: FallbackToLogsOnError`` falls back to the log tail when it is empty and the
  container failed);
* container ports mapped to host ports, as separate pod networks would keep them apart: a port named in
  ``host_ports`` (e.g. ``{"metrics": <a free port>}``) is served on that host port instead of its
  ``containerPort`` — the executor rewrites that port number where the pod's ConfigMap YAML files set a
  ``*port`` key to it (the trainer's ``metrics_port`` in run.yaml).

Jobs run one at a time (a one-node cluster: every Master would bind the same host ports).

:class:`JobSetExecutor` does the same for JobSets (jobset.x-k8s.io/v1alpha2): the JobSet v0.12.0 controller,
the Job controller and the kubelet — child Jobs, Indexed pods with hostnames remapped to 127.0.0.1, dependsOn,
success and failure policies, suspend/resume — and runs a local HTTP stand-in in place of ``vllm serve``
(see its docstring for exactly what it emulates and what it does not).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

HOST_ENV = ("HOME", "LANG", "HF_HUB_OFFLINE", "ATLAS_CACHE_DIR", "TOKENIZERS_PARALLELISM", "TMPDIR")
MAX_TERMINATION_MESSAGE = 4096  # bytes the kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the kubelet's log tail (at most 80 lines, still <= 4096 bytes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Replica:
    """One pod: its process, its remapped directories and restart count."""

    job: str
    replica_type: str  # Master | Worker
    index: int
    node_rank: int
    template: dict[str, Any]
    restart_policy: str
    root: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    exit_code: int | None = None
    master_port: int = 0
    termination_file: Path | None = None  # the container's terminationMessagePath, here
    started_at: str | None = None
    last_state: dict[str, Any] | None = None  # the previous run's state.terminated, once restarted
    container: str = "pytorch"  # the container run (a JobSet's: the pod's first container)
    pod_name: str | None = None  # a JobSet pod's generated name (<job>-<index>-<5 random>)
    spawned_at: float | None = None  # time.monotonic() when its process started
    ready_at: float | None = None  # time.monotonic() when it last became Ready (JobSet pods)
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / f"{self.name}.log"

    @property
    def name(self) -> str:
        return self.pod_name or f"{self.job}-{self.replica_type.lower()}-{self.index}"

    def kill(self) -> None:
        """SIGKILL every process of the "container" — the launcher and all it started, even in their own
        sessions (torch elastic starts its workers that way) — as a container runtime kills a cgroup."""
        if self.proc is None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _map_ports(value: Any, ports: dict[int, int], key: str = "") -> Any:
    """``value`` with every ``*port`` key whose number is a mapped container port set to its host port."""
    if isinstance(value, dict):
        return {k: _map_ports(v, ports, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_ports(v, ports, key) for v in value]
    if key.endswith("port") and isinstance(value, int) and not isinstance(value, bool) and value in ports:
        return ports[value]
    return value


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined VAR is replaced, an undefined one left as written, ``$$`` → ``$``."""
    import re

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class PodExecutor:
    def __init__(
        self,
        api_client,
        workdir: Path,
        namespace: str,
        python_bin: Path,
        poll_s: float = 0.2,
        host_ports: dict[str, int] | None = None,
    ):
        self.host_ports = dict(host_ports or {})  # container port name → the host port it is served on
        self.api = api_client
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.workdir = workdir
        self.namespace = namespace
        self.python_bin = python_bin
        self.poll_s = poll_s
        self.replicas: dict[str, list[Replica]] = {}  # job uid → pods
        self.done: set[str] = set()
        self.collected: set[str] = set()  # deleted jobs whose Pod objects are gone too
        self.passes = 0  # loops done: a test waits for some to show that nothing happens
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> PodExecutor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for pods in self.replicas.values():
            for pod in pods:
                pod.kill()

    def pods(self, job: str) -> list[Replica]:
        return next((pods for pods in self.replicas.values() if pods and pods[0].job == job), [])

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # keep serving; the test sees the job stall and the log
                print(f"pod executor: {exc!r}", file=sys.stderr)
            self.passes += 1
            time.sleep(self.poll_s)

    def _step(self) -> None:
        jobs = self.custom.list_namespaced_custom_object("kubeflow.org", "v1", self.namespace, "pytorchjobs")["items"]
        running = [uid for uid, pods in self.replicas.items() if uid not in self.done]
        for job in jobs:
            uid = job["metadata"]["uid"]
            if uid in self.done:
                continue
            if uid in self.replicas:
                self._supervise(job)
            elif not running and not job["spec"].get("runPolicy", {}).get("suspend"):
                self._launch(job)
                running.append(uid)
        present = {j["metadata"]["uid"] for j in jobs}
        for uid in [u for u in self.replicas if u not in present and u not in self.collected]:
            for pod in self.replicas[uid]:  # the job was deleted: its pods go (the garbage collector's part too)
                if uid not in self.done:
                    pod.kill()
                self._delete_pod_object(pod.name, uid)
            self.done.add(uid)
            self.collected.add(uid)

    # ------------------------------------------------------------------ pods

    def _launch(self, job: dict[str, Any]) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        root = self.workdir / f"{name}-{uid[:8]}"
        root.mkdir(parents=True)
        specs = job["spec"]["pytorchReplicaSpecs"]
        pods, node_rank = [], 0
        for replica_type in ("Master", "Worker"):
            spec = specs.get(replica_type)
            for index in range((spec or {}).get("replicas", 0)):
                pods.append(
                    Replica(
                        name, replica_type, index, node_rank, spec["template"], spec.get("restartPolicy", "Never"), root
                    )
                )
                node_rank += 1
        self.replicas[uid] = pods
        self._write_status(job, [("Created", f"PyTorchJob {name} is created.")])
        master_port = _free_port()
        for pod in pods:
            self._create_pod_object(job, pod)
            self._start_pod(job, pod, len(pods), master_port)
        self._write_status(
            job, [("Created", f"PyTorchJob {name} is created."), ("Running", f"PyTorchJob {name} is running.")]
        )

    def _start_pod(self, job: dict[str, Any], pod: Replica, nnodes: int, master_port: int) -> None:
        (container,) = [c for c in pod.template["spec"]["containers"] if c["name"] == "pytorch"]
        ports = {
            p["containerPort"]: self.host_ports[p["name"]]
            for p in container.get("ports", [])
            if p.get("name") in self.host_ports
        }
        topology = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(master_port),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(master_port),
            "PET_NNODES": str(nnodes),
            "PET_NODE_RANK": str(pod.node_rank),
            "PET_NPROC_PER_NODE": str(job["spec"].get("nprocPerNode", "1")),
            "WORLD_SIZE": str(nnodes),
            "RANK": str(pod.node_rank),
        }
        pod.master_port = master_port
        self._spawn(job, pod, container, topology, ports)
        self._write_pod_status(
            pod,
            "Running",
            {"state": {"running": {"startedAt": pod.started_at}}, "ready": True, "started": True},
        )

    def _spawn(
        self,
        job: dict[str, Any],
        pod: Replica,
        container: dict[str, Any],
        extra_env: dict[str, str],
        ports: dict[int, int],
        rewrite=None,
        argv: list[str] | None = None,
        expand: bool = False,
    ) -> None:
        """Start ``container`` of ``pod`` as a local process group: its volumes mounted, every mount path
        remapped (command, env values, ConfigMap files), ``ports`` (containerPort → host port) applied to
        the ConfigMap YAML ``*port`` keys, then ``rewrite`` (more text remapping) on all of it; ``argv``
        replaces the container's command (a stand-in); ``expand``: ``$(VAR)`` references in env values and the
        command expanded as the kubelet does (from the container's env and ``extra_env``; ``$$`` → ``$``)."""
        spec = pod.template["spec"]
        mounts = self._mount_volumes(job, pod, spec, container)

        paths: dict[str, Path] = dict(mounts)
        termination_path = container.get("terminationMessagePath")
        if termination_path:  # the kubelet gives each container run a fresh, empty file there
            pod.termination_file = pod.root / pod.name / "termination-log"
            pod.termination_file.parent.mkdir(parents=True, exist_ok=True)
            pod.termination_file.write_bytes(b"")
            paths[termination_path] = pod.termination_file

        def remap(text: str) -> str:
            for mount_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(mount_path, str(local))
            return rewrite(text) if rewrite else text

        for local in mounts.values():  # ConfigMap files refer to other mounts (run.yaml → /checkpoints)
            if (local / ".configmap").exists():
                for path in local.iterdir():
                    if path.name != ".configmap":
                        text = remap(path.read_text())
                        if ports and path.suffix in (".yaml", ".yml"):
                            document = yaml.safe_load(text)
                            mapped = _map_ports(document, ports)
                            if mapped != document:
                                text = yaml.safe_dump(mapped, sort_keys=False)
                        path.write_text(text)
        env = {k: os.environ[k] for k in HOST_ENV if k in os.environ}
        env["PATH"] = f"{self.python_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
        env.update(extra_env)
        declared = dict(extra_env)  # what $(VAR) may refer to: the container's own env, in order
        for var in container.get("env", []):
            value = remap(self._env_value(job, var))
            env[var["name"]] = declared[var["name"]] = _expand(value, declared) if expand else value
        command = argv or [remap(part) for part in container.get("command", []) + container.get("args", [])]
        if expand and not argv:
            command = [_expand(part, declared) for part in command]
        with open(pod.log, "ab") as log:
            pod.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=pod.root, start_new_session=True
            )
        pod.exit_code = None
        pod.started_at = _now()
        pod.spawned_at = time.monotonic()

    def _mount_volumes(self, job, pod: Replica, spec, container) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            volume = volumes[mount["name"]]
            if "persistentVolumeClaim" in volume:  # shared by every pod, like a ReadWriteMany claim
                local = self.workdir / "pvc" / volume["persistentVolumeClaim"]["claimName"]
            else:
                local = pod.root / pod.name / mount["name"]
            if "configMap" in volume:  # written afresh at each (re)start, as the kubelet projects it
                shutil.rmtree(local, ignore_errors=True)
                local.mkdir(parents=True)
                data = self.core.read_namespaced_config_map(volume["configMap"]["name"], self.namespace).data or {}
                for key, value in data.items():
                    (local / key).write_text(value)
                (local / ".configmap").write_text("")
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
        return mounts

    def _env_value(self, job, var: dict[str, Any]) -> str:
        source = var.get("valueFrom")
        if not source:
            return str(var.get("value", ""))
        if "fieldRef" in source and source["fieldRef"]["fieldPath"] == "metadata.namespace":
            return job["metadata"]["namespace"]
        if "secretKeyRef" in source:
            import base64

            ref = source["secretKeyRef"]
            secret = self.core.read_namespaced_secret(ref["name"], self.namespace)
            return base64.b64decode(secret.data[ref["key"]]).decode()
        raise ValueError(f"unsupported env source {source}")

    # ------------------------------------------------------------------ supervision

    def _supervise(self, job: dict[str, Any]) -> None:
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        pods = self.replicas[uid]
        backoff_limit = job["spec"].get("runPolicy", {}).get("backoffLimit", 3)
        for pod in pods:
            if pod.proc is None or pod.exit_code is not None:
                continue
            code = pod.proc.poll()
            if code is None:
                continue
            pod.exit_code = code
            restarts = code != 0 and pod.restart_policy in ("OnFailure", "Always", "ExitCode")
            restarts = restarts and pod.restarts < backoff_limit
            self._pod_terminated(pod, code, restarts)
            if restarts:
                pod.restarts += 1
                self._write_status(
                    job,
                    [
                        ("Created", ""),
                        ("Running", ""),
                        (
                            "Restarting",
                            f"PyTorchJob {name} is restarting because {pod.replica_type} replica(s) failed.",
                        ),
                    ],
                )
                self._start_pod(job, pod, len(pods), pod.master_port)
                self._write_status(
                    job, [("Created", ""), ("Restarting", ""), ("Running", f"PyTorchJob {name} is running.")]
                )
        codes = [p.exit_code for p in pods]
        if any(c not in (None, 0) for c in codes):
            failed = next(p for p in pods if p.exit_code not in (None, 0))
            for pod in pods:
                pod.kill()
            self._write_status(
                job,
                [
                    ("Created", ""),
                    ("Running", ""),
                    (
                        "Failed",
                        f"PyTorchJob {name} is failed because {failed.replica_type} replica {failed.index} "
                        f"exited with code {failed.exit_code}.",
                    ),
                ],
            )
            self.done.add(uid)
        elif codes and all(c == 0 for c in codes):
            self._write_status(
                job, [("Created", ""), ("Running", ""), ("Succeeded", f"PyTorchJob {name} is successfully completed.")]
            )
            self.done.add(uid)
        else:
            self._write_replica_statuses(job)

    def _replica_statuses(self, uid: str) -> dict[str, dict[str, int]]:
        statuses: dict[str, dict[str, int]] = {}
        for pod in self.replicas[uid]:
            entry = statuses.setdefault(pod.replica_type, {"active": 0, "succeeded": 0, "failed": 0})
            if pod.exit_code is None:
                entry["active"] += 1
            elif pod.exit_code == 0:
                entry["succeeded"] += 1
            else:
                entry["failed"] += 1
        return statuses

    def _write_replica_statuses(self, job) -> None:
        current = (job.get("status") or {}).get("replicaStatuses")
        wanted = self._replica_statuses(job["metadata"]["uid"])
        if current != wanted:
            self.custom.patch_namespaced_custom_object_status(
                "kubeflow.org",
                "v1",
                self.namespace,
                "pytorchjobs",
                job["metadata"]["name"],
                {"status": {"replicaStatuses": wanted}},
            )

    def _write_status(self, job: dict[str, Any], conditions: list[tuple[str, str]]) -> None:
        """Conditions in order, the last one True (the controller's convention)."""
        at = _now()
        items = [
            {
                "type": t,
                "status": "True" if i == len(conditions) - 1 else "False",
                "reason": f"PyTorchJob{t}",
                "message": message,
                "lastUpdateTime": at,
                "lastTransitionTime": at,
            }
            for i, (t, message) in enumerate(conditions)
        ]
        status: dict[str, Any] = {
            "conditions": items,
            "replicaStatuses": self._replica_statuses(job["metadata"]["uid"]),
        }
        if conditions[-1][0] in ("Succeeded", "Failed"):
            status["completionTime"] = at
        else:
            status.setdefault("startTime", at)
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", self.namespace, "pytorchjobs", job["metadata"]["name"], {"status": status}
        )

    # ------------------------------------------------------------------ Pod objects (controller + kubelet)

    def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """One plain API call (the typed client would validate a partial Pod): (HTTP status, decoded answer)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self.api.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = self.api.call_api(method, url, header_params=headers, body=body)
        data = response.read()
        try:
            return response.status, json.loads(data) if data else {}
        except ValueError:
            return response.status, {}

    def _pods_path(self, name: str | None = None, subresource: str | None = None) -> str:
        return "/".join(p for p in (f"/api/v1/namespaces/{self.namespace}/pods", name, subresource) if p)

    def _create_pod_object(self, job: dict[str, Any], pod: Replica) -> None:
        """The Pod as the Kubeflow controller creates it: named <job>-<type>-<index>, owned by the job."""
        self._delete_pod_object(pod.name, None)  # one of an earlier job of the same name, not collected yet
        meta = pod.template.get("metadata") or {}
        labels = {
            **(meta.get("labels") or {}),
            "training.kubeflow.org/job-name": pod.job,
            "training.kubeflow.org/replica-type": pod.replica_type.lower(),
            "training.kubeflow.org/replica-index": str(pod.index),
            **({"training.kubeflow.org/job-role": "master"} if pod.replica_type == "Master" else {}),
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "name": pod.job,
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {**pod.template["spec"], "restartPolicy": pod.restart_policy},
        }
        status, _ = self._call("POST", self._pods_path(), body)
        if status not in (200, 201):
            raise RuntimeError(f"creating pod {pod.name}: HTTP {status}")

    def _delete_pod_object(self, name: str, job_uid: str | None) -> None:
        """Delete pod ``name`` (only when it belongs to job ``job_uid``, if given)."""
        if job_uid is not None:
            status, existing = self._call("GET", self._pods_path(name))
            refs = (existing.get("metadata") or {}).get("ownerReferences") or [] if status == 200 else []
            if not any(r.get("uid") == job_uid for r in refs):
                return
        self._call("DELETE", self._pods_path(name))

    def _write_pod_status(
        self, pod: Replica, phase: str, container: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> None:
        """What the kubelet reports: the pod's phase and its container's status (``extra``: more status fields)."""
        entry = {"name": pod.container, "restartCount": pod.restarts, "image": "", "imageID": "", **container}
        if pod.last_state:
            entry["lastState"] = {"terminated": pod.last_state}
        status = {"phase": phase, "containerStatuses": [entry], **(extra or {})}
        code, _ = self._call(
            "PATCH", self._pods_path(pod.name, "status"), {"status": status}, "application/merge-patch+json"
        )
        if code != 200:
            raise RuntimeError(f"status of pod {pod.name}: HTTP {code}")

    def _termination_message(self, pod: Replica, code: int) -> str:
        """The termination message the kubelet reads: the file (at most 4096 bytes); with
        FallbackToLogsOnError, a failed container's log tail when the file is empty."""
        (container,) = [c for c in pod.template["spec"]["containers"] if c["name"] == pod.container]
        data = b""
        if pod.termination_file is not None and pod.termination_file.is_file():
            data = pod.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
        if not data and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = pod.log.read_bytes().splitlines()[-FALLBACK_LOG_LINES:] if pod.log.exists() else []
            data = b"\n".join(lines)[-MAX_TERMINATION_MESSAGE:]
        return data.decode("utf-8", "ignore")

    def _terminated_state(self, pod: Replica, code: int) -> dict[str, Any]:
        """The container's ``state.terminated`` as kubelet writes it, termination message included."""
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": pod.started_at,
            "finishedAt": _now(),
        }
        message = self._termination_message(pod, code)
        if message:
            terminated["message"] = message
        return terminated

    def _pod_terminated(self, pod: Replica, code: int, restarts: bool) -> None:
        terminated = self._terminated_state(pod, code)
        phase = "Running" if restarts else ("Succeeded" if code == 0 else "Failed")
        self._write_pod_status(pod, phase, {"state": {"terminated": terminated}, "ready": False, "started": False})
        pod.last_state = terminated


# ====================================================================================================
# JobSets (jobset.x-k8s.io/v1alpha2): the JobSet controller + the Job controller + the kubelet.

JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
JOBSET_PREFIX = "jobset.sigs.k8s.io/"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"

# The vLLM stand-in (run with ``python -c VLLM_STANDIN <port> <served model>``): standard library only, so
# it starts in a blink. /health and /health/ answer 200; /v1/models lists the served model;
# /v1/chat/completions and /v1/completions answer every request with VLLM_STANDIN_ANSWER (n choices). It does
# NOT generate, and has none of the weight-sync endpoints a trainer's rollout client needs
# (init_communicator, update_named_param, ...): those answer 404.
VLLM_STANDIN_ANSWER = "The answer is 4."
VLLM_STANDIN = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODEL, ANSWER = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/") == "/health":
            return self.send(200, {})
        if self.path == "/v1/models":
            return self.send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = int(body.get("n") or 1)
        answer = {"id": "standin", "created": int(time.time()), "model": body.get("model", MODEL)}
        if self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": ANSWER}
            choices = [{"index": i, "message": message, "finish_reason": "stop"} for i in range(n)]
            usage = {"prompt_tokens": 1, "completion_tokens": 3 * n, "total_tokens": 1 + 3 * n}
            return self.send(200, {**answer, "object": "chat.completion", "choices": choices, "usage": usage})
        if self.path == "/v1/completions":
            choices = [{"index": i, "text": ANSWER, "finish_reason": "stop"} for i in range(n)]
            return self.send(200, {**answer, "object": "text_completion", "choices": choices})
        self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})


print(f"vLLM stand-in (tests/support/pod_executor.py): serving {MODEL} on 127.0.0.1:{PORT}", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""


def _vllm_served(argv: list[str]) -> str | None:
    """The model of a ``vllm serve MODEL …`` command (its --served-model-name when set), else None."""
    words = [Path(w).name for w in argv[:2]]
    if words != ["vllm", "serve"] or len(argv) < 3:
        return None
    names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--served-model-name"]
    names += [a.split("=", 1)[1] for a in argv if a.startswith("--served-model-name=")]
    return names[0] if names else argv[2]


@dataclass
class ChildJob:
    """One child Job of a JobSet (the Job controller's view): its pods by completion index."""

    name: str
    rjob: str
    index: int
    uid: str
    spec: dict[str, Any]  # the Job's spec (template included)
    attempt: int
    suspended: bool
    pods: dict[int, Replica] = field(default_factory=dict)
    succeeded: set[int] = field(default_factory=set)
    failed: int = 0
    condition: str | None = None  # Complete | Failed
    reason: str = ""  # of the Failed condition: BackoffLimitExceeded | PodFailurePolicy
    message: str = ""
    failed_at: float = 0.0
    written: dict[str, Any] | None = None

    @property
    def completions(self) -> int:
        return int(self.spec.get("completions") or self.spec.get("parallelism") or 1)

    @property
    def parallelism(self) -> int:
        return int(self.spec.get("parallelism") or 1)

    @property
    def indexed(self) -> bool:
        return self.spec.get("completionMode", "Indexed") == "Indexed"

    def active(self) -> list[Replica]:
        return [p for p in self.pods.values() if p.proc is not None and p.exit_code is None]

    def ready(self) -> int:
        return sum(1 for p in self.active() if p.ready_at is not None)


@dataclass
class JobSetRun:
    uid: str
    name: str
    root: Path
    restarts: int = 0
    restarts_towards_max: int = 0
    jobs: dict[str, ChildJob] = field(default_factory=dict)
    conditions: dict[str, dict[str, Any]] = field(default_factory=dict)
    terminal: str | None = None
    ports: dict[tuple[str, int], int] = field(default_factory=dict)  # (replicated job, containerPort) → host port
    written: dict[str, Any] | None = None
    log: list[str] = field(default_factory=list)  # what the controllers did, in order (for tests)


class JobSetExecutor(PodExecutor):
    """The JobSet v0.12.0 controller, the Kubernetes Job controller and the kubelet, for JobSets on the emulator.

    Each reconcile follows the JobSet controller's order (notes on JobSet v0.12.0 ``jobset_controller.go``):
    failure policy first, then success policy, then the headless Service, then the child Jobs of every
    replicated job whose ``dependsOn`` is reached, then suspend/resume, then one status write.

    * Child Jobs ``<js>-<rjob>-<jobIdx>`` (batch/v1 objects owned by the JobSet, with the JobSet labels and the
      restart-attempt label); pods ``<job>-<podIdx>-<5 random>`` owned by their Job, hostname ``<job>-<podIdx>``
      and ``subdomain`` (the JobSet's ``network.subdomain`` or name) when ``enableDNSHostnames`` (default true),
      labels/annotations of the JobSet and the Job controller, ``JOB_COMPLETION_INDEX`` (Indexed Jobs).
    * Networking on one machine: every JobSet hostname, alone or as ``<host>.<subdomain>[.<ns>.svc[.cluster.local]]``,
      is rewritten to 127.0.0.1 in commands, env values and ConfigMap files. Every declared ``containerPort`` P
      of a replicated job R gets one free host port H(R, P): ``<R's host>:P`` becomes ``127.0.0.1:H``; in R's own
      pods a whole argument or env value ``P`` (or ``--…port=P``), the readiness probe's port and the ConfigMap
      YAML ``*port`` keys become H. Pods of one replicated job share H, so only one of them may listen on it (the
      trainer's rendezvous port on pod 0; one-pod servers). ``host_ports`` (port name → host port) wins over it.
    * A container whose command is ``vllm serve MODEL …`` is not run: a small HTTP stand-in (VLLM_STANDIN) serves
      /health, /v1/models and scripted /v1/chat/completions on its port instead, and the executor logs so.
    * Readiness: a running pod with a ``readinessProbe.httpGet`` is Ready while a GET on it answers 2xx/3xx
      (probed each poll, timings ignored); without a probe, Ready once started. Job ``status.ready`` counts them.
    * Job controller: ``restartPolicy: Never`` pods; a failed pod beyond ``backoffLimit`` (default 6) fails the
      Job (reason BackoffLimitExceeded) and its other pods are killed; within it, the index gets a new pod. An
      Indexed Job is Complete when every index succeeded (NonIndexed: ``completions`` successes).
    * JobSet: Jobs of a failed attempt are deleted with their pods and recreated under the same names with
      ``restart-attempt`` + 1 (failurePolicy: the first matching rule's action — RestartJobSet (reason
      ``FailurePolicy_<rule>``), RestartJobSetAndIgnoreMaxRestarts or FailJobSet — else RestartJobSet (reason
      DefaultFailurePolicy), up to ``maxRestarts``, then Failed, ReachedMaxRestarts; no failurePolicy: Failed,
      FailedJobs); a Job's ``podFailurePolicy`` ``onExitCodes`` rules (FailJob: the Job fails at once, reason
      PodFailurePolicy; Ignore: the pod is replaced, not counted); ``successPolicy`` (All/Any over its targets)
      → Completed, ``terminalState``, still-active Jobs and their pods deleted (finished ones kept);
      ``spec.suspend``: Jobs created suspended, pods of suspended Jobs deleted; resuming merges the JobSet's
      current pod-template labels/annotations/nodeSelector/tolerations into the Jobs (how Kueue's admission
      reaches them) and starts them. ``status``: conditions (added only when True, as ``updateCondition``),
      ``restarts``, ``restartsCountTowardsMax``, ``terminalState``, ``replicatedJobsStatus``.

    Not emulated: podFailurePolicy ``onPodConditions``, failurePolicy ``restartStrategy`` other than Recreate,
    ``startupPolicy: InOrder``,
    ``ttlSecondsAfterFinished``, ``coordinator``, the webhooks' defaulting/validation, graceful termination
    (pods are SIGKILLed), probe timings, scheduling (every pod runs at once), more than the first container.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sets: dict[str, JobSetRun] = {}
        self.batch = kubernetes.client.BatchV1Api(self.api)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for run in self.sets.values():
            for job in run.jobs.values():
                for pod in job.pods.values():
                    pod.kill()

    def run_of(self, name: str) -> JobSetRun | None:
        return next((r for r in self.sets.values() if r.name == name), None)

    def jobset_pods(self, name: str, rjob: str | None = None) -> list[Replica]:
        run = self.run_of(name)
        if run is None:
            return []
        jobs = list(run.jobs.values())  # the executor's thread changes them while a test reads
        return [p for j in jobs if rjob is None or j.rjob == rjob for _, p in sorted(list(j.pods.items()))]

    # ------------------------------------------------------------------ the loop

    def _step(self) -> None:
        items = self.custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets")[
            "items"
        ]
        for js in items:
            if js.get("metadata", {}).get("deletionTimestamp"):
                continue
            managed_by = js["spec"].get("managedBy")
            if managed_by and managed_by != JOBSET_CONTROLLER:
                continue
            self._reconcile(js)
        present = {js["metadata"]["uid"] for js in items}
        for uid, run in list(self.sets.items()):
            if uid not in present:  # deleted: its Jobs and pods go (garbage collection)
                for job in run.jobs.values():
                    self._delete_job(run, job)
                del self.sets[uid]

    def _reconcile(self, js: dict[str, Any]) -> None:
        uid, name = js["metadata"]["uid"], js["metadata"]["name"]
        run = self.sets.get(uid)
        if run is None:
            root = self.workdir / f"{name}-{uid[:8]}"
            root.mkdir(parents=True, exist_ok=True)
            run = self.sets[uid] = JobSetRun(uid, name, root)
        spec = js["spec"]
        rjobs = spec["replicatedJobs"]
        for job in list(run.jobs.values()):
            self._supervise_job(js, run, job)
        statuses = self._rjob_statuses(rjobs, run)
        if run.terminal:
            for job in [j for j in run.jobs.values() if j.condition is None]:  # finished: active Jobs deleted
                self._delete_job(run, job)
                del run.jobs[job.name]
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        suspend = bool(spec.get("suspend"))
        failed = sorted((j for j in run.jobs.values() if j.condition == "Failed"), key=lambda j: j.failed_at)
        if failed:
            self._failure_policy(js, run, failed)
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        policy = spec.get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in rjobs]
        complete = sum(1 for j in run.jobs.values() if j.condition == "Complete" and j.rjob in targets)
        expected = (
            1
            if policy.get("operator") == "Any"
            else sum(int(r.get("replicas", 1)) for r in rjobs if r["name"] in targets)
        )
        if complete and complete >= expected:
            run.terminal = "Completed"
            self._condition(run, "Completed", True, "AllJobsCompleted", "jobset completed successfully")
            self._condition(run, "RestartingJobSet", False, "JobSetCompleted", "jobset completed successfully")
            run.log.append("Completed")
            for job in [j for j in run.jobs.values() if j.condition is None]:
                self._delete_job(run, job)
                del run.jobs[job.name]
            self._write_jobset_status(js, run, self._rjob_statuses(rjobs, run))
            return
        self._ensure_service(js)
        replicas_before = 0
        for rjob in rjobs:
            deps_met = self._deps_met(rjob, statuses)
            replicas = int(rjob.get("replicas", 1))
            if deps_met:
                for index in range(replicas):
                    job_name = f"{name}-{rjob['name']}-{index}"
                    if job_name not in run.jobs:
                        self._create_job(js, run, rjob, index, replicas_before, suspend)
            replicas_before += replicas
        if suspend:
            for job in run.jobs.values():
                if not job.suspended and job.condition is None:
                    self._suspend_job(run, job)
            self._condition(run, "Suspended", True, "SuspendedJobs", "jobset is suspended")
        else:
            for rjob in rjobs:
                if not self._deps_met(rjob, statuses):
                    continue
                for job in run.jobs.values():
                    if job.rjob == rjob["name"] and job.suspended:
                        self._resume_job(js, run, rjob, job)
            self._condition(run, "Suspended", False, "ResumeJobs", "jobset is resumed")
        statuses = self._rjob_statuses(rjobs, run)
        total = sum(int(r.get("replicas", 1)) for r in rjobs)
        if not suspend and sum(s["ready"] + s["succeeded"] for s in statuses) == total:
            self._condition(run, "RestartingJobSet", False, "JobsReady", "all jobs are ready")
        self._write_jobset_status(js, run, statuses)

    # ------------------------------------------------------------------ JobSet controller parts

    @staticmethod
    def _deps_met(rjob: dict[str, Any], statuses: list[dict[str, Any]]) -> bool:
        by_name = {s["name"]: s for s in statuses}
        for dep in rjob.get("dependsOn") or []:
            status = by_name.get(dep["name"])
            if status is None:
                return False
            if dep["status"] == "Ready":
                reached = status["_replicas"] == status["ready"] + status["failed"] + status["succeeded"]
            else:
                reached = status["_replicas"] == status["succeeded"]
            if not reached:
                return False
        return True

    @staticmethod
    def _rjob_statuses(rjobs: list[dict[str, Any]], run: JobSetRun) -> list[dict[str, Any]]:
        out = []
        for rjob in rjobs:
            jobs = [j for j in run.jobs.values() if j.rjob == rjob["name"] and j.attempt == run.restarts]
            ready = sum(
                1
                for j in jobs
                if j.condition is None
                and not j.suspended
                and j.active()
                and len(j.succeeded) + j.ready() >= min(j.parallelism, j.completions)
            )
            out.append(
                {
                    "name": rjob["name"],
                    "ready": ready,
                    "succeeded": sum(1 for j in jobs if j.condition == "Complete"),
                    "failed": sum(1 for j in jobs if j.condition == "Failed"),
                    "active": sum(1 for j in jobs if j.active()),
                    "suspended": sum(1 for j in jobs if j.suspended),
                    "_replicas": int(rjob.get("replicas", 1)),
                }
            )
        return out

    def _condition(self, run: JobSetRun, type_: str, status: bool, reason: str, message: str) -> None:
        """``updateCondition``: a condition that is absent is added only when True; a status change moves
        lastTransitionTime, a reason/message change alone does not."""
        current = run.conditions.get(type_)
        value = "True" if status else "False"
        if current is None:
            if status:
                run.conditions[type_] = {
                    "type": type_,
                    "status": value,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": _now(),
                }
            return
        if current["status"] != value:
            current["lastTransitionTime"] = _now()
        current.update(status=value, reason=reason, message=message)

    def _failure_policy(self, js: dict[str, Any], run: JobSetRun, failed: list[ChildJob]) -> None:
        """``executeFailurePolicy``: the first rule that matches a failed Job (the earliest such Job) decides;
        without one, the default action RestartJobSet on the earliest failed Job."""
        first = failed[0]
        policy = js["spec"].get("failurePolicy")
        if policy is None:
            self._fail(
                run, "FailedJobs", f"jobset failed due to one or more job failures (first failed job: {first.name})"
            )
            return
        action, reason = "RestartJobSet", "DefaultFailurePolicy"
        for rule in policy.get("rules") or []:
            match = next((job for job in failed if self._rule_applies(rule, job)), None)
            if match is not None:
                first, action, reason = match, rule["action"], f"FailurePolicy_{rule['name']}"
                break
        if action == "FailJobSet":
            self._fail(
                run,
                "FailJobSetFailurePolicyAction",
                f"applying FailJobSet failure policy action (first failed job: {first.name})",
            )
            return
        counts = action != "RestartJobSetAndIgnoreMaxRestarts"
        if counts and run.restarts_towards_max >= int(policy.get("maxRestarts") or 0):
            self._fail(
                run,
                "ReachedMaxRestarts",
                f"jobset failed due to reaching max number of restarts (first failed job: {first.name})",
            )
            return
        run.restarts += 1
        run.restarts_towards_max += int(counts)
        run.log.append(f"RestartingJobSet {run.restarts} ({reason}; first failed job: {first.name})")
        self._condition(
            run,
            "RestartingJobSet",
            True,
            reason,
            f"applying {action} failure policy action (first failed job: {first.name})",
        )
        print(
            f"pod executor: JobSet {run.name}: restart {run.restarts} ({reason}; first failed job: {first.name})",
            file=sys.stderr,
        )
        for job in list(run.jobs.values()):  # the previous attempt's Jobs are deleted (Foreground)
            self._delete_job(run, job)
            del run.jobs[job.name]

    @staticmethod
    def _rule_applies(rule: dict[str, Any], job: ChildJob) -> bool:
        """``ruleIsApplicable``: the Job's failure reason, message and replicated job against the rule's filters."""
        import re

        if rule.get("onJobFailureReasons") and job.reason not in rule["onJobFailureReasons"]:
            return False
        patterns = rule.get("onJobFailureMessagePatterns") or []
        if patterns and not any(re.search(p, job.message) for p in patterns):
            return False
        return not rule.get("targetReplicatedJobs") or job.rjob in rule["targetReplicatedJobs"]

    def _fail(self, run: JobSetRun, reason: str, message: str) -> None:
        run.terminal = "Failed"
        run.log.append(f"Failed {reason}")
        self._condition(run, "Failed", True, reason, message)
        self._condition(run, "RestartingJobSet", False, "JobSetFailed", "jobset failed")
        for job in [j for j in run.jobs.values() if j.condition is None]:  # active Jobs deleted
            self._delete_job(run, job)
            del run.jobs[job.name]

    def _ensure_service(self, js: dict[str, Any]) -> None:
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames", True) is False:
            return
        name = network.get("subdomain") or js["metadata"]["name"]
        try:
            self.core.read_namespaced_service(name, self.namespace)
            return
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise
        self.core.create_namespaced_service(
            self.namespace,
            {
                "metadata": {"name": name, "ownerReferences": [self._owner(js, "JobSet")]},
                "spec": {
                    "clusterIP": "None",
                    "selector": {f"{JOBSET_PREFIX}jobset-name": js["metadata"]["name"]},
                    "publishNotReadyAddresses": network.get("publishNotReadyAddresses", True),
                },
            },
        )

    @staticmethod
    def _owner(obj: dict[str, Any], kind: str) -> dict[str, Any]:
        api_version = obj.get("apiVersion") or f"{JOBSET_GROUP}/{JOBSET_VERSION}"
        return {
            "apiVersion": api_version,
            "kind": kind,
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _jobset_labels(
        self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], index: int, before: int
    ) -> dict[str, str]:
        import hashlib

        rjobs = js["spec"]["replicatedJobs"]
        group = rjob.get("groupName", "default")
        in_group = [r for r in rjobs if r.get("groupName", "default") == group]
        group_before = 0
        for r in in_group:
            if r["name"] == rjob["name"]:
                break
            group_before += int(r.get("replicas", 1))
        job_name = f"{js['metadata']['name']}-{rjob['name']}-{index}"
        return {
            f"{JOBSET_PREFIX}jobset-name": js["metadata"]["name"],
            f"{JOBSET_PREFIX}jobset-uid": js["metadata"]["uid"],
            f"{JOBSET_PREFIX}replicatedjob-name": rjob["name"],
            f"{JOBSET_PREFIX}restart-attempt": str(run.restarts),
            f"{JOBSET_PREFIX}replicatedjob-replicas": str(rjob.get("replicas", 1)),
            f"{JOBSET_PREFIX}global-replicas": str(sum(int(r.get("replicas", 1)) for r in rjobs)),
            f"{JOBSET_PREFIX}job-index": str(index),
            f"{JOBSET_PREFIX}job-key": hashlib.sha1(f"{self.namespace}/{job_name}".encode()).hexdigest(),
            f"{JOBSET_PREFIX}job-global-index": str(before + index),
            f"{JOBSET_PREFIX}group-name": group,
            f"{JOBSET_PREFIX}group-replicas": str(sum(int(r.get("replicas", 1)) for r in in_group)),
            f"{JOBSET_PREFIX}job-group-index": str(group_before + index),
        }

    def _create_job(
        self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], index: int, before: int, suspend: bool
    ) -> None:
        import copy

        name = f"{js['metadata']['name']}-{rjob['name']}-{index}"
        template = copy.deepcopy(rjob["template"])
        labels = self._jobset_labels(js, run, rjob, index, before)
        spec = template.get("spec") or {}
        spec["suspend"] = suspend
        spec.setdefault("completionMode", "Indexed")
        pod_template = spec.setdefault("template", {})
        pod_meta = pod_template.setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
        pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **labels}
        network = js["spec"].get("network") or {}
        if network.get("enableDNSHostnames", True):
            pod_template.setdefault("spec", {})["subdomain"] = network.get("subdomain") or js["metadata"]["name"]
        meta = template.get("metadata") or {}
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "labels": {**(meta.get("labels") or {}), **labels},
                "annotations": {**(meta.get("annotations") or {}), **labels},
                "ownerReferences": [self._owner(js, "JobSet")],
            },
            "spec": spec,
        }
        status, created = self._call("POST", f"/apis/batch/v1/namespaces/{self.namespace}/jobs", body)
        if status not in (200, 201):
            raise RuntimeError(f"creating job {name}: HTTP {status}")
        job = ChildJob(name, rjob["name"], index, created["metadata"]["uid"], spec, run.restarts, suspend)
        run.jobs[name] = job
        run.log.append(f"created job {name} (attempt {run.restarts}{', suspended' if suspend else ''})")
        for container in spec["template"]["spec"].get("containers", []):
            for port in container.get("ports", []):
                key = (rjob["name"], int(port["containerPort"]))
                if key not in run.ports:
                    run.ports[key] = self.host_ports.get(port.get("name", ""), 0) or _free_port()
        if not suspend:
            self._start_job(js, run, job)

    def _start_job(self, js: dict[str, Any], run: JobSetRun, job: ChildJob) -> None:
        for index in range(min(job.parallelism, job.completions)):
            if index not in job.succeeded:
                self._start_index(js, run, job, index)

    def _suspend_job(self, run: JobSetRun, job: ChildJob) -> None:
        job.suspended = True
        job.spec["suspend"] = True
        for pod in job.pods.values():  # a suspended Job's pods are deleted
            pod.kill()
            self._delete_pod_object(pod.name, job.uid)
        job.pods.clear()
        self._patch_job(job, {"spec": {"suspend": True}})
        run.log.append(f"suspended job {job.name}")

    def _resume_job(self, js: dict[str, Any], run: JobSetRun, rjob: dict[str, Any], job: ChildJob) -> None:
        """``resumeJobsIfNecessary``: the JobSet's pod-template scheduling fields merged in, then unsuspended."""
        current = (rjob["template"].get("spec") or {}).get("template") or {}
        mine = job.spec["template"]
        for key in ("labels", "annotations"):
            merged = {
                **(mine.setdefault("metadata", {}).get(key) or {}),
                **((current.get("metadata") or {}).get(key) or {}),
            }
            mine["metadata"][key] = merged
        for key in ("nodeSelector",):
            merged = {**(mine["spec"].get(key) or {}), **((current.get("spec") or {}).get(key) or {})}
            if merged:
                mine["spec"][key] = merged
        for key in ("tolerations", "schedulingGates"):
            if (current.get("spec") or {}).get(key):
                mine["spec"][key] = current["spec"][key]
        job.suspended = False
        job.spec["suspend"] = False
        self._patch_job(job, {"spec": {"suspend": False, "template": mine}})
        run.log.append(f"resumed job {job.name}")
        self._start_job(js, run, job)

    def _patch_job(self, job: ChildJob, body: dict[str, Any]) -> None:
        self._call(
            "PATCH", f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}", body, "application/merge-patch+json"
        )

    def _delete_job(self, run: JobSetRun, job: ChildJob) -> None:
        for pod in job.pods.values():
            pod.kill()
            self._delete_pod_object(pod.name, job.uid)
        self._call("DELETE", f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}")
        run.log.append(f"deleted job {job.name}")

    # ------------------------------------------------------------------ Job controller + kubelet parts

    def _start_index(self, js: dict[str, Any], run: JobSetRun, job: ChildJob, index: int) -> None:
        template = job.spec["template"]
        spec = template["spec"]
        container = spec["containers"][0]
        pod_name = f"{job.name}-{index}-{secrets_token()}"
        pod = Replica(
            job.name,
            job.rjob,
            index,
            index,
            template,
            "Never",
            run.root,
            container=container["name"],
            pod_name=pod_name,
        )
        job.pods[index] = pod
        hostname = f"{job.name}-{index}" if job.indexed else None
        self._create_jobset_pod(job, pod, hostname)
        ports = {p: h for (r, p), h in run.ports.items() if r == job.rjob}
        rewrite = self._network_rewrite(js, run, ports)
        env = {"HOSTNAME": hostname or pod_name}
        if job.indexed and not any(v["name"] == "JOB_COMPLETION_INDEX" for v in container.get("env", [])):
            env["JOB_COMPLETION_INDEX"] = str(index)
        argv = None
        model = _vllm_served(container.get("command", []) + container.get("args", []))
        if model is not None:
            port = self._standin_port(container, ports)
            argv = [sys.executable, "-c", VLLM_STANDIN, str(port), model, VLLM_STANDIN_ANSWER]
            message = f"pod executor: {pod_name}: `vllm serve {model}` runs as the local vLLM stand-in on :{port}"
            print(message, file=sys.stderr)
            run.log.append(message)
        self._spawn(js, pod, container, env, ports, rewrite, argv)
        self._write_pod_status(
            pod,
            "Running",
            {"state": {"running": {"startedAt": pod.started_at}}, "ready": False, "started": True},
            self._pod_conditions(False),
        )

    @staticmethod
    def _standin_port(container: dict[str, Any], ports: dict[int, int]) -> int:
        argv = container.get("command", []) + container.get("args", [])
        port = 8000  # vllm serve's default
        for i, arg in enumerate(argv):
            if arg == "--port" and i + 1 < len(argv):
                port = int(argv[i + 1])
            elif arg.startswith("--port="):
                port = int(arg.split("=", 1)[1])
        return ports.get(port, port)

    def _network_rewrite(self, js: dict[str, Any], run: JobSetRun, own_ports: dict[int, int]):
        import re

        network = js["spec"].get("network") or {}
        subdomain = network.get("subdomain") or js["metadata"]["name"]
        hosts: dict[str, str] = {}  # hostname → replicated job
        for rjob in js["spec"]["replicatedJobs"]:
            spec = rjob["template"].get("spec") or {}
            for job_index in range(int(rjob.get("replicas", 1))):
                for pod_index in range(int(spec.get("completions") or spec.get("parallelism") or 1)):
                    hosts[f"{js['metadata']['name']}-{rjob['name']}-{job_index}-{pod_index}"] = rjob["name"]
        if not hosts:
            return None
        names = "|".join(sorted((re.escape(h) for h in hosts), key=len, reverse=True))
        suffix = rf"(?:\.{re.escape(subdomain)}(?:\.{re.escape(self.namespace)}(?:\.svc(?:\.cluster\.local)?)?)?)?"
        pattern = re.compile(rf"(?<![\w.-])({names}){suffix}(?::(\d+))?(?![\w-])")

        def host(match: re.Match) -> str:
            port = match.group(2)
            if port is None:
                return "127.0.0.1"
            return f"127.0.0.1:{run.ports.get((hosts[match.group(1)], int(port)), int(port))}"

        own = {str(p): str(h) for p, h in own_ports.items()}
        own_arg = re.compile(r"^(--[\w-]*port=)(\d+)$")

        def rewrite(text: str) -> str:
            text = pattern.sub(host, text)
            if text in own:
                return own[text]
            match = own_arg.match(text)
            if match and match.group(2) in own:
                return match.group(1) + own[match.group(2)]
            return text

        return rewrite

    def _create_jobset_pod(self, job: ChildJob, pod: Replica, hostname: str | None) -> None:
        meta = pod.template.get("metadata") or {}
        labels = {
            **(meta.get("labels") or {}),
            "batch.kubernetes.io/job-name": job.name,
            "job-name": job.name,
            "batch.kubernetes.io/controller-uid": job.uid,
            "controller-uid": job.uid,
        }
        annotations = dict(meta.get("annotations") or {})
        if job.indexed:
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(pod.index)
        spec = {**pod.template["spec"], "restartPolicy": pod.template["spec"].get("restartPolicy", "Never")}
        if hostname:
            spec["hostname"] = hostname
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod.name,
                "namespace": self.namespace,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": job.name,
                        "uid": job.uid,
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        status, _ = self._call("POST", self._pods_path(), body)
        if status not in (200, 201):
            raise RuntimeError(f"creating pod {pod.name}: HTTP {status}")

    @staticmethod
    def _pod_conditions(ready: bool) -> dict[str, Any]:
        value = "True" if ready else "False"
        at = _now()
        return {
            "conditions": [
                {"type": "Ready", "status": value, "lastTransitionTime": at},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": at},
            ]
        }

    def _env_value(self, job, var: dict[str, Any]) -> str:
        field_path = ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        if COMPLETION_INDEX in field_path:  # metadata.labels['batch.kubernetes.io/job-completion-index']
            return self._current_index
        if field_path == "metadata.name":
            return self._current_pod
        return super()._env_value(job, var)

    _current_index = _current_pod = ""

    def _spawn(self, job, pod, container, extra_env, ports, rewrite=None, argv=None, expand=True) -> None:
        self._current_index, self._current_pod = str(pod.index), pod.name  # the fieldRefs' values
        super()._spawn(job, pod, container, extra_env, ports, rewrite, argv, expand)

    def _probe(self, pod: Replica, ports: dict[int, int]) -> bool:
        import urllib.error
        import urllib.request

        container = next(c for c in pod.template["spec"]["containers"] if c["name"] == pod.container)
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return True
        port = probe["port"]
        if isinstance(port, str) and not port.isdigit():
            port = next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)
        port = ports.get(int(port), int(port))
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe.get('path', '/')}", timeout=0.5) as answer:
                return 200 <= answer.status < 400
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _supervise_job(self, js: dict[str, Any], run: JobSetRun, job: ChildJob) -> None:
        if job.condition is not None or job.suspended:
            return
        ports = {p: h for (r, p), h in run.ports.items() if r == job.rjob}
        backoff_limit = int(job.spec.get("backoffLimit", 6))
        for index, pod in list(job.pods.items()):
            if pod.proc is None or pod.exit_code is not None:
                continue
            code = pod.proc.poll()
            if code is None:
                ready = self._probe(pod, ports)
                if ready != (pod.ready_at is not None):
                    pod.ready_at = time.monotonic() if ready else None
                    self._write_pod_status(
                        pod,
                        "Running",
                        {"state": {"running": {"startedAt": pod.started_at}}, "ready": ready, "started": True},
                        self._pod_conditions(ready),
                    )
                continue
            pod.exit_code = code
            pod.ready_at = None
            self._write_pod_status(
                pod,
                "Succeeded" if code == 0 else "Failed",
                {"state": {"terminated": self._terminated_state(pod, code)}, "ready": False, "started": False},
                self._pod_conditions(False),
            )
            run.log.append(f"pod {pod.name} exited {code}")
            if code == 0:
                job.succeeded.add(index)
            else:
                rule = self._pod_failure_rule(job, pod, code)
                if rule is not None and rule[1]["action"] == "Ignore":
                    self._start_index(js, run, job, index)  # not counted against backoffLimit
                    continue
                job.failed += 1
                if rule is not None and rule[1]["action"] == "FailJob":
                    job.reason = "PodFailurePolicy"
                    job.message = (
                        f"Container {pod.container} for pod {self.namespace}/{pod.name} failed with exit code {code} "
                        f"matching FailJob rule at index {rule[0]}"
                    )
                elif job.failed > backoff_limit:
                    job.reason, job.message = "BackoffLimitExceeded", "Job has reached the specified backoff limit"
                if job.reason:
                    job.condition, job.failed_at = "Failed", time.monotonic()
                    for other in job.active():  # the Job controller ends the Job's other pods
                        other.kill()
                        other.proc.wait(10)
                        other.exit_code = -9
                else:  # within backoffLimit: a new pod for the index
                    self._start_index(js, run, job, index)
        if job.condition is None and len(job.succeeded) >= job.completions:
            job.condition = "Complete"
        self._write_job_status(job)

    @staticmethod
    def _pod_failure_rule(job: ChildJob, pod: Replica, code: int) -> tuple[int, dict[str, Any]] | None:
        """The Job's first ``podFailurePolicy`` rule whose ``onExitCodes`` match the failed container (index, rule);
        ``onPodConditions`` rules are not emulated."""
        for index, rule in enumerate((job.spec.get("podFailurePolicy") or {}).get("rules") or []):
            codes = rule.get("onExitCodes")
            if not codes or codes.get("containerName", pod.container) != pod.container:
                continue
            if (code in codes.get("values", [])) == (codes.get("operator") == "In"):
                return index, rule
        return None

    def _write_job_status(self, job: ChildJob) -> None:
        status: dict[str, Any] = {
            "active": len(job.active()),
            "ready": job.ready(),
            "succeeded": len(job.succeeded),
            "failed": job.failed,
        }
        if job.indexed and job.succeeded:
            status["completedIndexes"] = ",".join(str(i) for i in sorted(job.succeeded))
        if job.condition == "Complete":
            status["conditions"] = [{"type": "Complete", "status": "True", "reason": "CompletionsReached"}]
        elif job.condition == "Failed":
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": job.reason, "message": job.message}]
        if status != job.written:
            self._call(
                "PATCH",
                f"/apis/batch/v1/namespaces/{self.namespace}/jobs/{job.name}/status",
                {"status": status},
                "application/merge-patch+json",
            )
            job.written = status

    def _write_jobset_status(self, js: dict[str, Any], run: JobSetRun, statuses: list[dict[str, Any]]) -> None:
        status: dict[str, Any] = {
            "restarts": run.restarts,
            "replicatedJobsStatus": [{k: v for k, v in s.items() if not k.startswith("_")} for s in statuses],
            "conditions": list(run.conditions.values()),
        }
        if run.restarts_towards_max:
            status["restartsCountTowardsMax"] = run.restarts_towards_max
        if run.terminal:
            status["terminalState"] = run.terminal
        if status != run.written:
            self.custom.patch_namespaced_custom_object_status(
                JOBSET_GROUP, JOBSET_VERSION, self.namespace, "jobsets", run.name, {"status": status}
            )
            run.written = json.loads(json.dumps(status))


def secrets_token() -> str:
    import secrets

    return secrets.token_hex(3)[:5]
