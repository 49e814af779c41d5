"""The kubelet's part of the local executors (tests.support.pytorchjob_executor, tests.support.jobset_executor): a pod's
container run as a local process group, with what a node would give it.

* the container's ``env`` (values, ``fieldRef`` metadata.namespace, ``secretKeyRef`` read from the API; ``$(VAR)``
  expanded where the executor asks) on top of the host's locale, HOME and caches;
* volumes under a temp dir: a ConfigMap's keys written as files (afresh at each start), an emptyDir per pod, a PVC
  shared by every pod that claims it; every mount path is remapped (in the command, env values and the ConfigMap
  files) to its directory here;
* container ports mapped to host ports, as separate pod networks would keep them apart: a port named in
  ``host_ports`` (e.g. ``{"metrics": <a free port>}``) is served on that host port instead of its ``containerPort``;
  the ConfigMap YAML files' ``*port`` keys set to it are rewritten to the host port;
* the Pod object (one builder, :func:`pod_object`, for the pods of both controllers) and its status as the kubelet
  reports it: Running, then ``containerStatuses[].state.terminated`` with the exit code, reason ``Completed`` or
  ``Error`` and the termination message — the container's ``terminationMessagePath`` is a fresh local file per
  (re)start, read back when the process exits and cut to 4096 bytes as the kubelet cuts it
  (``terminationMessagePolicy: FallbackToLogsOnError`` falls back to the log tail when it is empty and the container
  failed).

A controller subclasses :class:`Kubelet` with its ``_step`` (one pass over its objects, every ``poll_s``) and
``_all_pods`` (what ``stop`` kills).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

# The process node (atlas_cluster/node.py) does these as the kubelet does; one copy, there.
from atlas_cluster.node import descendants
from atlas_cluster.node import expand as expand_vars

HOST_ENV = ("HOME", "LANG", "HF_HUB_OFFLINE", "ATLAS_CACHE_DIR", "TOKENIZERS_PARALLELISM", "TMPDIR")
MAX_TERMINATION_MESSAGE = 4096  # bytes the kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the kubelet's log tail (at most 80 lines, still <= 4096 bytes)


def now() -> str:
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
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when its spec sets none


def _map_ports(value: Any, ports: dict[int, int], key: str = "") -> Any:
    """``value`` with every ``*port`` key whose number is a mapped container port set to its host port."""
    if isinstance(value, dict):
        return {k: _map_ports(v, ports, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_ports(v, ports, key) for v in value]
    if key.endswith("port") and isinstance(value, int) and not isinstance(value, bool) and value in ports:
        return ports[value]
    return value


def _disruption(reason: str) -> dict[str, Any]:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "lastTransitionTime": now()}


def pod_object(
    name: str,
    namespace: str,
    owner: dict[str, Any],
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: dict[str, Any],
) -> dict[str, Any]:
    """A Pod as a workload controller creates it: ``owner`` (apiVersion, kind, name, uid) its controller."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [{**owner, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


class Kubelet:
    """Runs pods' containers as local processes and reports them on the API, on a thread of its own."""

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
        self.passes = 0  # loops done: a test waits for some to show that nothing happens
        self.terminations: list[tuple[str, float, int]] = []  # (pod, seconds from SIGTERM to exit, exit code)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    def start(self):
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        for pod in self._all_pods():
            pod.kill()

    def _all_pods(self) -> list[Replica]:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except Exception as exc:  # keep serving; the test sees the job stall and the log
                print(f"pod executor: {exc!r}", file=sys.stderr)
            self.passes += 1
            time.sleep(self.poll_s)

    # ------------------------------------------------------------------ containers

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
            env[var["name"]] = declared[var["name"]] = expand_vars(value, declared) if expand else value
        command = argv or [remap(part) for part in container.get("command", []) + container.get("args", [])]
        if expand and not argv:
            command = [expand_vars(part, declared) for part in command]
        with open(pod.log, "ab") as log:
            pod.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=pod.root, start_new_session=True
            )
        pod.exit_code = None
        pod.started_at = now()
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

    # ------------------------------------------------------------------ Pod objects

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

    def _create_pod(
        self, pod: Replica, owner: dict[str, Any], labels: dict[str, str], annotations: dict[str, str], spec: dict
    ) -> None:
        body = pod_object(pod.name, self.namespace, owner, labels, annotations, spec)
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
            "finishedAt": now(),
        }
        message = self._termination_message(pod, code)
        if message:
            terminated["message"] = message
        return terminated

    def terminate_pods(self, pods: list[Replica], disruption: str | None = None) -> dict[str, float]:
        """Delete ``pods`` as the kubelet does: SIGTERM to each container's main process (its PID 1: the launch
        script), SIGKILL to all of it when the pod's ``terminationGracePeriodSeconds`` ran out; the terminated
        state (exit code, termination message) posted, then the Pod object deleted — a pod watch sees the message
        before the pod goes. ``disruption`` (e.g. ``EvictionByEvictionAPI``, ``PreemptionByScheduler``) adds
        the ``DisruptionTarget`` condition Kubernetes puts on a pod it stops on purpose. Returns each pod's
        seconds from SIGTERM to exit."""
        started = time.monotonic()
        alive = [pod for pod in pods if pod.proc is not None and pod.proc.poll() is None]
        for pod in alive:
            if disruption:
                self._write_pod_status(pod, "Running", {"state": {"running": {"startedAt": pod.started_at}}},
                                       {"conditions": [_disruption(disruption)]})  # fmt: skip
            os.kill(pod.proc.pid, signal.SIGTERM)
        took: dict[str, float] = {}
        for pod in alive:
            grace = (pod.template.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
            try:
                pod.proc.wait(max(0.0, started + grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                pod.kill()
                pod.proc.wait(10)
            took[pod.name] = time.monotonic() - started
            pod.kill()  # what the container left (a process of its own session) goes with the container
            pod.exit_code = pod.proc.returncode if pod.proc.returncode >= 0 else 128 - pod.proc.returncode
            terminated = self._terminated_state(pod, pod.exit_code)
            phase = "Succeeded" if pod.exit_code == 0 else "Failed"
            extra = {"conditions": [_disruption(disruption)]} if disruption else None
            self._write_pod_status(pod, phase, {"state": {"terminated": terminated}, "ready": False}, extra)
            pod.last_state = terminated
            self.terminations.append((pod.name, took[pod.name], pod.exit_code))
        return took

    def _pod_terminated(self, pod: Replica, code: int, restarts: bool) -> None:
        terminated = self._terminated_state(pod, code)
        phase = "Running" if restarts else ("Succeeded" if code == 0 else "Failed")
        self._write_pod_status(pod, phase, {"state": {"terminated": terminated}, "ready": False, "started": False})
        pod.last_state = terminated
