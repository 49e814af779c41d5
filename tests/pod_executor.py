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
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.root / f"{self.name}.log"

    @property
    def name(self) -> str:
        return f"{self.job}-{self.replica_type.lower()}-{self.index}"

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
        spec = pod.template["spec"]
        (container,) = [c for c in spec["containers"] if c["name"] == "pytorch"]
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
            return text

        ports = {
            p["containerPort"]: self.host_ports[p["name"]]
            for p in container.get("ports", [])
            if p.get("name") in self.host_ports
        }
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
        env.update(
            {
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
        )
        for var in container.get("env", []):
            env[var["name"]] = remap(self._env_value(job, var))
        command = [remap(part) for part in container.get("command", []) + container.get("args", [])]
        pod.master_port = master_port
        with open(pod.log, "ab") as log:
            pod.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=pod.root, start_new_session=True
            )
        pod.exit_code = None
        pod.started_at = _now()
        self._write_pod_status(
            pod,
            "Running",
            {"state": {"running": {"startedAt": pod.started_at}}, "ready": True, "started": True},
        )

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

    def _write_pod_status(self, pod: Replica, phase: str, container: dict[str, Any]) -> None:
        """What the kubelet reports: the pod's phase and its `pytorch` container's status."""
        entry = {"name": "pytorch", "restartCount": pod.restarts, "image": "", "imageID": "", **container}
        if pod.last_state:
            entry["lastState"] = {"terminated": pod.last_state}
        status = {"phase": phase, "containerStatuses": [entry]}
        code, _ = self._call(
            "PATCH", self._pods_path(pod.name, "status"), {"status": status}, "application/merge-patch+json"
        )
        if code != 200:
            raise RuntimeError(f"status of pod {pod.name}: HTTP {code}")

    def _termination_message(self, pod: Replica, code: int) -> str:
        """The termination message the kubelet reads: the file (at most 4096 bytes); with
        FallbackToLogsOnError, a failed container's log tail when the file is empty."""
        (container,) = [c for c in pod.template["spec"]["containers"] if c["name"] == "pytorch"]
        data = b""
        if pod.termination_file is not None and pod.termination_file.is_file():
            data = pod.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
        if not data and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = pod.log.read_bytes().splitlines()[-FALLBACK_LOG_LINES:] if pod.log.exists() else []
            data = b"\n".join(lines)[-MAX_TERMINATION_MESSAGE:]
        return data.decode("utf-8", "ignore")

    def _pod_terminated(self, pod: Replica, code: int, restarts: bool) -> None:
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": pod.started_at,
            "finishedAt": _now(),
        }
        message = self._termination_message(pod, code)
        if message:
            terminated["message"] = message
        phase = "Running" if restarts else ("Succeeded" if code == 0 else "Failed")
        self._write_pod_status(pod, phase, {"state": {"terminated": terminated}, "ready": False, "started": False})
        pod.last_state = terminated
