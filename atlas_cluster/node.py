"""The process node: a stand-in for the kubelet and its container runtime, for the local cluster's real control plane
(atlas_cluster/controlplane.py) and the real kube-scheduler (:class:`Scheduler`).

:class:`ProcessNodes` registers N Nodes (``atlas-node-0..N-1``: cpu, memory, pods and a fake ``nvidia.com/gpu``
count), keeps their Leases (kube-node-lease) renewed, and runs every pod the scheduler binds to one of them as
local processes, one process group per container, reporting the pod's status as the kubelet does. It authenticates
as each node (a client certificate ``CN=system:node:<name>, O=system:nodes`` signed by the cluster CA); the API
server runs RBAC only (no Node authorizer), so :func:`ensure_node_rbac` binds the bootstrap ClusterRole
``system:node`` to the group ``system:nodes``, as clusters did before the Node authorizer.

What a pod gets (honoured):

* its own network namespace (atlas_cluster/podnet.py): a pod IP from a private /16 on a host bridge, reachable from
  the host and from every other pod; ``/etc/hosts`` names the pod itself and every Service's ready endpoints (all
  of them for a headless Service with ``publishNotReadyAddresses``), ``<hostname>.<subdomain>`` for pods of a
  headless Service named by their subdomain — short names for the pod's own namespace, ``.<ns>``, ``.<ns>.svc``
  and ``.svc.cluster.local`` forms for every namespace — rewritten as pods come and go; no DNS server
  (resolv.conf points nowhere). A non-headless Service's name resolves to one ready pod IP (no kube-proxy, no
  ClusterIP), so its ``port`` must equal the ``targetPort``. ``hostNetwork: true`` pods run in the host's network.
* its own mount and UTS namespaces: every volume is a host folder bind-mounted at its real ``mountPath``
  (``subPath``, ``readOnly``) — so commands, config files and code see the paths they name, nothing is rewritten
  (a mount point missing on the host is created there, empty, and removed on stop unless a pod of another cluster
  on this host still mounts it: :func:`mounted_anywhere`), except a volume whose
  ``mountPath`` holds the node's own work folder (``/tmp`` where the cluster's folder is there, as in the tests: the
  servers' ``/tmp`` emptyDir): mounted, it would hide the node's files and the host programs' and caches beside them,
  so the container shares the host's folder there. Volumes: emptyDir (medium
  Memory: a tmpfs), configMap, secret, downwardAPI, projected (configMap, secret, downwardAPI,
  serviceAccountToken by TokenRequest), persistentVolumeClaim (one shared folder per claim, or the bound PV's
  hostPath), hostPath. The termination message file is a fresh per-start file mounted at
  ``terminationMessagePath``. The hostname is the pod's (``spec.hostname`` or its name).
* command/args with ``$(VAR)`` expansion; env: envFrom (configMapRef, secretRef, prefix), value, fieldRef
  (metadata.name/namespace/uid/labels/annotations, spec.nodeName/serviceAccountName, status.podIP(s)/hostIP(s)),
  resourceFieldRef, configMapKeyRef, secretKeyRef (read from the API as the node); the host's PATH (this Python's
  bin folder first, after the node's ``nslookup`` that answers from /etc/hosts: ``SHIMS``), HOME, locale, caches
  (``HOST_ENV``); ``HOSTNAME``; ``NVIDIA_VISIBLE_DEVICES`` with the fake
  GPU indices a container's ``nvidia.com/gpu`` limit got.
* init containers one after another before the containers (a sidecar init container, ``restartPolicy: Always``,
  runs beside them); probes (startup, readiness, liveness: httpGet, tcpSocket — a connection to the pod's IP at the
  port, named or numbered —, exec — exec inside the container's
  namespaces; initialDelay, period, timeout, success/failure thresholds); a failed liveness probe restarts the
  container; restartPolicy Never/OnFailure/Always with a crash-loop backoff (1 s doubling to 30 s: shorter than
  the kubelet's 10 s to 5 min); pod phase Pending → Running → Succeeded/Failed, conditions
  PodReadyToStartContainers/Initialized/ContainersReady/Ready; ``containerStatuses`` with state, lastState, exit
  code, reason Completed/Error and the termination message (4096 bytes at most; FallbackToLogsOnError: the log
  tail of a failed run).
* deletion: SIGTERM to each container's main process (its PID 1), SIGKILL to all of the container after the
  deletion's grace period (``metadata.deletionGracePeriodSeconds``), then the final status and a delete with grace
  0, as the kubelet does. A container's processes are tracked in a cgroup (v2) of their own when the host has one,
  so whatever a container started (in sessions of their own too) dies with it.
* logs: ``<workdir>/pods/<ns>_<pod>/logs/<container>.log`` (stdout and stderr, every run appended):
  :meth:`ProcessNodes.logs`.
* PersistentVolumeClaims: the real scheduler places no pod whose claim is unbound, and this cluster has no
  provisioner, so the nodes provision (``provision_claims``): each Pending claim without a volume gets a
  ``hostPath`` PersistentVolume (its folder ``<workdir>/pvc/<ns>/<claim>``, the claim's class, size and access modes,
  pre-bound to it) that the controller manager's PV controller binds. Made as the admin (nodes may not create PVs).

Not honoured: images (every container runs the host's programs and this Python's environment, as root; the fake GPUs
are indices only: a host's real GPUs are all visible to every pod), the outside world from a pod (no NAT), resource
limits and requests at run time (no cgroup limits, no ephemeral-storage limit or emptyDir ``sizeLimit`` enforced;
the scheduler still places pods by their cpu, memory, ephemeral-storage and GPU requests against each Node's
capacity, ``ephemeral-storage`` 100Gi among it), securityContext (``readOnlyRootFilesystem`` too: a container writes
wherever the host lets root write; ``runAsUser`` and the rest likewise),
lifecycle hooks (postStart, preStop), grpc probes (always pass), ephemeral containers, ``kubectl exec/logs/
port-forward`` (no kubelet server), Service env vars and the API server from inside a pod (it listens on the host's
127.0.0.1), DNS beyond the hosts file, ConfigMap/Secret volume updates after the pod starts (they are written
once, when it starts), ImagePullBackOff and the like, eviction, static pods. Needs root (network, mount and UTS
namespaces; ``ip`` from iproute2, ``unshare`` and ``nsenter`` from util-linux).

``python -m atlas_cluster.node --cluster-dir DIR --nodes N`` runs the nodes in a process of their own (SIGTERM stops
them cleanly): what ``atlas cluster up --nodes N`` starts under its Supervisor.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import http.client
import json
import math
import os
import re
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from atlas_cluster import podnet
from atlas_cluster.controlplane import free_port, go_env, kubeconfig, write_kubeconfig
from atlas_cluster.pki import CLIENT, sign_certificate
from atlas_cluster.processes import Supervisor

HOST_ENV = (
    "HOME", "LANG", "LC_ALL", "TMPDIR", "VIRTUAL_ENV", "PYTHONPATH", "ATLAS_CACHE_DIR", "HF_HOME", "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM", "TORCH_HOME", "XDG_CACHE_HOME",
    "LD_LIBRARY_PATH", "CUDA_HOME",
)  # fmt: skip
NODE_PREFIX = "atlas-node-"
GPU_RESOURCE = "nvidia.com/gpu"
NODE_RBAC_BINDING = "atlas:process-nodes"
PV_LABEL = "app.kubernetes.io/managed-by=atlas-process-node"  # the PersistentVolumes the nodes provision
MAX_TERMINATION_MESSAGE = 4096  # bytes the kubelet keeps of a termination message
FALLBACK_LOG_LINES = 80  # FallbackToLogsOnError: the log tail (at most 80 lines, at most 4096 bytes)
DEFAULT_GRACE_S = 30
LEASE_S = 40  # the kubelet's lease duration; renewed every RENEW_S
RENEW_S = 10
NODE_STATUS_S = 60  # the Ready condition's heartbeat (the lease is what the node lifecycle controller reads)
BACKOFF_S = (1, 2, 4, 8, 16, 30)
TICK_S = 0.1  # a pod worker's loop
CGROUP_V2 = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
VERSION = "v1.36.3"
# Programs first on every container's PATH. nslookup: the training-operator gives each PyTorchJob worker an init
# container that loops on ``nslookup <job>-master-0``; a real nslookup asks a DNS server, here names are in the
# pod's /etc/hosts, so it is answered from there (``getent hosts``), in nslookup's format.
SHIMS = {
    "nslookup": """#!/bin/sh
# atlas process node: nslookup answered from the pod's /etc/hosts (there is no cluster DNS server)
name=""
for arg in "$@"; do case "$arg" in -*) ;; *) [ -z "$name" ] && name="$arg" ;; esac; done
found=$(getent hosts "$name") || { echo "** server can't find $name: NXDOMAIN"; exit 1; }
echo "Server:		127.0.0.1"
echo "Address:	127.0.0.1#53"
echo
echo "Name:	$name"
echo "$found" | while read -r address rest; do echo "Address: $address"; done
""",
}


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class ConfigError(RuntimeError):
    """What the kubelet reports as CreateContainerConfigError: a missing ConfigMap, Secret, key, command…"""


# ---------------------------------------------------------------------- credentials


def client_certificate(pki: Path, stem: str, subject: str) -> tuple[Path, Path]:
    """A client certificate ``<stem>.crt``/``.key`` in the cluster's ``pki`` folder, signed by its CA (made once)."""
    crt, key = pki / f"{stem}.crt", pki / f"{stem}.key"
    if not (crt.exists() and key.exists()):
        sign_certificate(stem, subject, CLIENT, pki)
    return crt, key


def _server_of(admin_kubeconfig: Path) -> str:
    config = yaml.safe_load(admin_kubeconfig.read_text())
    return config["clusters"][0]["cluster"]["server"]


def user_kubeconfig(cluster_dir: Path, stem: str, subject: str) -> Path:
    """A kubeconfig in ``cluster_dir`` for a client certificate of ``subject``."""
    pki = cluster_dir / "pki"
    crt, key = client_certificate(pki, stem, subject)
    server = _server_of(cluster_dir / "admin.kubeconfig")
    config = kubeconfig(server, pki / "ca.crt", {"client-certificate": str(crt), "client-key": str(key)})
    return write_kubeconfig(cluster_dir / f"{stem}.kubeconfig", config)


class Api:
    """Plain JSON requests (dicts in, dicts out) with one kubeconfig's credentials."""

    def __init__(self, config: Path):
        self.client = kubernetes.config.new_client_from_config(str(config))

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, dict]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self.client.param_serialize(
            method, path, query_params=list((query or {}).items()), header_params=headers, body=body,
            auth_settings=["BearerToken"],
        )  # fmt: skip
        response = self.client.call_api(method, url, header_params=headers, body=body, _request_timeout=30)
        data = response.read()
        try:
            return response.status, json.loads(data) if data else {}
        except ValueError:
            return response.status, {"raw": data[:500]}

    def ok(self, method: str, path: str, body: Any = None, **kwargs) -> dict:
        status, data = self.call(method, path, body, **kwargs)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data.get('message', data)}")
        return data


def ensure_node_rbac(admin: Api) -> None:
    """Bind the bootstrap ClusterRole ``system:node`` to the group ``system:nodes`` (what a node may read and write:
    Nodes, their status and Leases, pods and their status, ConfigMaps, Secrets, Services, PVCs, TokenRequests)."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NODE_RBAC_BINDING, "labels": {"app.kubernetes.io/managed-by": "atlas-cluster"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }
    status, data = admin.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    if status not in (201, 409):
        raise RuntimeError(f"ClusterRoleBinding {NODE_RBAC_BINDING}: HTTP {status}: {data.get('message')}")


# ---------------------------------------------------------------------- the scheduler


class Scheduler:
    """The real kube-scheduler as a process of the cluster's Supervisor, as user ``system:kube-scheduler`` (whose
    bootstrap RBAC exists), leader election off."""

    NAME = "kube-scheduler"

    def __init__(self, cluster_dir: Path, binary: Path, supervisor: Supervisor | None = None):
        self.cluster_dir = cluster_dir
        self.binary = binary
        self.supervisor = supervisor or Supervisor(cluster_dir)
        self.port = 0

    @staticmethod
    def find(bin_dir: Path | None = None) -> Path | None:
        """``kube-scheduler`` in ``bin_dir``, else ``$ATLAS_KUBE_SCHEDULER``; None when neither is there."""
        for candidate in (bin_dir / "kube-scheduler" if bin_dir else None, os.environ.get("ATLAS_KUBE_SCHEDULER")):
            if candidate and os.access(candidate, os.X_OK):
                return Path(candidate)
        return None

    def start(self, timeout: float = 60.0) -> Scheduler:
        config = user_kubeconfig(self.cluster_dir, "scheduler", "/CN=system:kube-scheduler")
        settings = self.cluster_dir / "scheduler-config.yaml"
        settings.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(config)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self.port = free_port()
        self.supervisor.start(
            self.NAME,
            [
                str(self.binary),
                f"--config={settings}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                "--v=1",
            ],
            env=go_env(),
        )
        context = ssl._create_unverified_context()  # its serving certificate is self-signed

        def healthy() -> bool:
            connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=2)
            connection.request("GET", "/readyz")
            return connection.getresponse().status == 200

        self.supervisor.wait_until(self.NAME, healthy, timeout, "kube-scheduler")
        return self

    def stop(self) -> None:
        self.supervisor.stop(self.NAME)


# ---------------------------------------------------------------------- small helpers

_SUFFIX = {
    "m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def quantity(text: Any) -> float:
    """A Kubernetes quantity (``500m``, ``2Gi``, ``1e3``) as a number."""
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)", str(text).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def mounted_anywhere(path: Path, proc: Path = Path("/proc")) -> bool:
    """Whether a mount sits at or under ``path`` in some process's mount namespace (``/proc/<pid>/mountinfo``): a
    pod of another process node on this host (two clusters at once, as two test sessions run them). Linux detaches
    such mounts when their mount point is removed, so a node leaves the mount points it made alone while one does."""
    target = str(path)
    for info in proc.glob("[0-9]*/mountinfo"):
        try:
            lines = info.read_text().splitlines()
        except OSError:  # the process ended
            continue
        for line in lines:
            fields = line.split(" ", 5)
            if len(fields) > 4 and (fields[4] == target or fields[4].startswith(target + "/")):
                return True
    return False


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: a defined VAR replaced, an undefined one left as written, ``$$`` → ``$``."""

    def one(match: re.Match) -> str:
        return "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


def descendants(root: int) -> list[int]:
    """Every process ``root`` started, and theirs (from /proc)."""
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


def selector_matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_ready(pod: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _cgroup_root(name: str) -> Path | None:
    """A cgroup v2 folder of our own, None when the host has no writable v2 hierarchy."""
    for base in CGROUP_V2:
        if (base / "cgroup.procs").exists() and (base / "cgroup.subtree_control").exists():
            root = base / name
            try:
                root.mkdir(exist_ok=True)
                return root
            except OSError:
                continue
    return None


# ---------------------------------------------------------------------- one container


@dataclass
class Probe:
    spec: dict
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    passed: bool | None = None  # the last verdict after thresholds (None: none yet)

    def due(self, started: float) -> bool:
        t = time.monotonic()
        if t < max(self.next_at, started + self.spec.get("initialDelaySeconds", 0)):
            return False
        self.next_at = t + self.spec.get("periodSeconds", 10)
        return True

    def record(self, ok: bool) -> None:
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.spec.get("successThreshold", 1):
                self.passed = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.spec.get("failureThreshold", 3):
                self.passed = False


@dataclass
class Container:
    spec: dict
    init: bool
    log: Path
    termination_file: Path
    sidecar: bool = False
    proc: subprocess.Popen | None = None
    restarts: int = 0
    runs: int = 0
    state: dict = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict | None = None
    ready: bool = False
    started: bool = False  # the startup probe passed (or there is none) in this run
    done: bool = False  # terminated and not to be restarted
    exit_code: int | None = None
    next_start: float = 0.0
    kill_at: float | None = None
    started_mono: float = 0.0
    log_offset: int = 0
    cgroup: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    probes: dict[str, Probe] = field(default_factory=dict)
    gpus: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec["name"]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_main(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)

    def kill_all(self) -> None:
        """SIGKILL everything of the container: its process group, what it started, its cgroup's processes."""
        if self.proc is None:
            return
        pids = set(descendants(self.proc.pid)) | {self.proc.pid}
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                (self.cgroup / "cgroup.kill").write_text("1")
            with contextlib.suppress(OSError):
                pids |= {int(p) for p in (self.cgroup / "cgroup.procs").read_text().split()}
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def reap(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        if self.cgroup is not None:
            for _ in range(50):
                try:
                    self.cgroup.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
            self.cgroup = None


# ---------------------------------------------------------------------- one pod


class PodWorker(threading.Thread):
    """Runs one pod bound to ``node`` on a thread of its own until the pod object is gone."""

    def __init__(self, nodes: ProcessNodes, node: Node, pod: dict):
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.nodes, self.node, self.pod = nodes, node, pod
        self.namespace, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.directory = nodes.workdir / "pods" / f"{self.namespace}_{self.pod_name}"
        self.gone = False  # the object was deleted (force-deleted, or by us)
        self.halt = False  # the node stops: kill, report nothing
        self.ip: str | None = None
        self.netns = False
        self.tmpfs: list[Path] = []
        self.start_time = now()
        self.phase = "Pending"
        self.init_done = False
        self.failed_reason: str | None = None
        self.volumes: dict[str, Path] = {}
        self.read_only_volumes: set[str] = set()
        self.reported: dict | None = None
        self.transitions: dict[str, tuple[str, str]] = {}
        spec = pod["spec"]
        self.host_network = bool(spec.get("hostNetwork"))
        self.hostname = spec.get("hostname") or self.pod_name
        self.policy = spec.get("restartPolicy", "Always")
        self.init = [self._container(c, True) for c in spec.get("initContainers") or []]
        self.main = [self._container(c, False) for c in spec.get("containers") or []]

    def _container(self, spec: dict, init: bool) -> Container:
        name = spec["name"]
        c = Container(
            spec,
            init,
            self.directory / "logs" / f"{name}.log",
            self.directory / "containers" / name / "termination-log",
            sidecar=init and spec.get("restartPolicy") == "Always",
        )
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if spec.get(kind):
                c.probes[kind] = Probe(spec[kind])
        if not init:
            c.state = {"waiting": {"reason": "PodInitializing" if self.pod["spec"].get("initContainers") else
                                   "ContainerCreating"}}  # fmt: skip
        return c

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            self.nodes.log(f"process node: pod {self.namespace}/{self.pod_name}: {traceback.format_exc()}")
        finally:
            for c in self.init + self.main:
                c.kill_all()
                c.reap()
            self._teardown()
            self.nodes.forget(self)

    def _run(self) -> None:
        if (self.pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            self.phase = self.pod["status"]["phase"]  # finished before we (re)started: only its deletion is left
            while not (self.gone or self.halt or self.pod["metadata"].get("deletionTimestamp")):
                time.sleep(TICK_S * 3)
            if not (self.gone or self.halt):
                self._final_delete()
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        self._network()
        self._report()
        while not self._volumes_ready():
            if self.gone or self.halt or self.pod["metadata"].get("deletionTimestamp"):
                break
            time.sleep(1.0)
        while True:
            if self.gone or self.halt:
                return
            if self.pod["metadata"].get("deletionTimestamp"):
                self._terminate(self.pod["metadata"].get("deletionGracePeriodSeconds"))
                if not self.gone:
                    self._final_delete()
                return
            if self.phase not in ("Succeeded", "Failed"):
                self._step()
            self._report()
            time.sleep(TICK_S)

    def _volumes_ready(self) -> bool:
        try:
            self.volumes = self._make_volumes()
            return True
        except Exception as exc:  # a missing ConfigMap, Secret, claim… (or the API away): tried again
            message = str(exc) if isinstance(exc, ConfigError) else f"volumes: {exc!r}"
            for c in self.init + self.main:
                c.state = {"waiting": {"reason": "ContainerCreating", "message": message}}
            self._report()
            return False

    def _step(self) -> None:
        for c in self.init + self.main:
            self._watch(c)
        if not self.init_done:
            for c in self.init:
                if c.sidecar:
                    if c.proc is None and not c.done and time.monotonic() >= c.next_start:
                        self._start(c)
                    if not c.started:
                        return  # the next init container waits for the sidecar's startup
                    continue
                if c.exit_code == 0 and c.done:
                    continue
                if c.done:  # failed with restartPolicy Never
                    self._finish("Failed")
                    return
                if c.proc is None and time.monotonic() >= c.next_start:
                    self._start(c)
                return
            self.init_done = True
        for c in self.main + [s for s in self.init if s.sidecar]:
            if c.proc is None and not c.done and time.monotonic() >= c.next_start:
                self._start(c)
        if self.main and all(c.done for c in self.main):
            self._finish("Succeeded" if all(c.exit_code == 0 for c in self.main) else "Failed")
        elif self.main and all(c.runs for c in self.main):
            self.phase = "Running"

    def _finish(self, phase: str) -> None:
        for c in self.init:  # sidecars end with the pod
            if c.sidecar and c.alive():
                self._stop_container(c, self._grace(None))
                self._wait_stopped([c])
        self.phase = phase
        for c in self.main + self.init:
            c.ready = False
        self._release_network()

    def _watch(self, c: Container) -> None:
        """Exits, probes, a due SIGKILL."""
        if c.proc is None:
            return
        if c.kill_at is not None and time.monotonic() >= c.kill_at and c.alive():
            c.kill_all()
        code = c.proc.poll()
        if code is not None:
            self._exited(c, code if code >= 0 else 128 - code)
            return
        self._probe_all(c)

    def _exited(self, c: Container, code: int, final: bool = False) -> None:
        """Record the run's end; restart it later (per restartPolicy, after a backoff) unless ``final``."""
        c.kill_all()  # what the container left behind goes with it
        c.reap()
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.state.get("running", {}).get("startedAt", now()),
            "finishedAt": now(),
            "containerID": f"process://{c.proc.pid}",
        }
        message = self._termination_message(c, code)
        if message:
            terminated["message"] = message
        c.state = {"terminated": terminated}
        c.exit_code, c.proc, c.ready, c.started, c.kill_at = code, None, False, False, None
        policy = "Always" if c.sidecar else self.policy
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if final or (c.init and not c.sidecar and code == 0) or not restart:
            c.done = True
            return
        delay = BACKOFF_S[min(c.runs - 1, len(BACKOFF_S) - 1)]
        c.last_state = terminated
        c.next_start = time.monotonic() + delay
        c.state = {"waiting": {"reason": "CrashLoopBackOff",
                               "message": f"back-off {delay}s restarting container {c.name}"}}  # fmt: skip

    def _termination_message(self, c: Container, code: int) -> str:
        data = b""
        with contextlib.suppress(OSError):
            data = c.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
        if not data and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError), open(c.log, "rb") as log:
                log.seek(c.log_offset)
                lines = log.read().splitlines()[-FALLBACK_LOG_LINES:]
                data = b"\n".join(lines)[-MAX_TERMINATION_MESSAGE:]
        return data.decode("utf-8", "replace")

    # ------------------------------------------------------------------ probes

    def _probe_all(self, c: Container) -> None:
        startup = c.probes.get("startupProbe")
        if startup and not c.started:
            if startup.due(c.started_mono):
                startup.record(self._probe(c, startup.spec))
                if startup.passed:
                    c.started = True
                elif startup.passed is False:
                    self._restart_for_probe(c, "startup")
            return
        c.started = True
        readiness = c.probes.get("readinessProbe")
        if readiness is None:
            c.ready = True
        elif readiness.due(c.started_mono):
            readiness.record(self._probe(c, readiness.spec))
            c.ready = bool(readiness.passed)
        liveness = c.probes.get("livenessProbe")
        if liveness and c.kill_at is None and liveness.due(c.started_mono):
            liveness.record(self._probe(c, liveness.spec))
            if liveness.passed is False:
                self._restart_for_probe(c, "liveness")

    def _restart_for_probe(self, c: Container, kind: str) -> None:
        self.nodes.log(f"process node: {self.namespace}/{self.pod_name}/{c.name}: {kind} probe failed, killing it")
        grace = c.probes[f"{kind}Probe"].spec.get("terminationGracePeriodSeconds")
        self._stop_container(c, self._grace(grace))
        for probe in c.probes.values():
            probe.successes = probe.failures = 0
            probe.passed = None

    def _port(self, c: Container, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"no container port named {port}")

    def _probe(self, c: Container, spec: dict) -> bool:
        timeout = spec.get("timeoutSeconds", 1)
        try:
            if "httpGet" in spec:
                get = spec["httpGet"]
                host = get.get("host") or self.ip
                scheme = get.get("scheme", "HTTP").upper()
                connection = (
                    http.client.HTTPSConnection(host, self._port(c, get["port"]), timeout=timeout,
                                                context=ssl._create_unverified_context())
                    if scheme == "HTTPS"
                    else http.client.HTTPConnection(host, self._port(c, get["port"]), timeout=timeout)
                )  # fmt: skip
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                connection.request("GET", get.get("path", "/"), headers={"User-Agent": "kube-probe/1.36", **headers})
                status = connection.getresponse().status
                connection.close()
                return 200 <= status < 400
            if "tcpSocket" in spec:
                sock = spec["tcpSocket"]
                with socket.create_connection((sock.get("host") or self.ip, self._port(c, sock["port"])), timeout):
                    return True
            if "exec" in spec:
                argv = ["nsenter", "-t", str(c.proc.pid), "-m", "-n", "-u", "--", *spec["exec"]["command"]]
                done = subprocess.run(argv, env=c.env, capture_output=True, timeout=timeout, check=False,
                                      cwd=self.directory)  # fmt: skip
                return done.returncode == 0
            return True  # grpc: not probed
        except (OSError, subprocess.TimeoutExpired, ValueError, http.client.HTTPException):
            return False

    # ------------------------------------------------------------------ starting a container

    def _start(self, c: Container) -> None:
        try:
            env, command = self._environment(c)
        except Exception as exc:
            c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}}
            c.next_start = time.monotonic() + 2
            return
        c.env = env
        c.termination_file.parent.mkdir(parents=True, exist_ok=True)
        c.termination_file.write_bytes(b"")  # a fresh, empty file each run
        mounts = self._mounts(c)
        lines = ["set -e", "read _ || true", "exec </dev/null"]  # wait until the node has put us in our cgroup
        if not self.host_network:
            lines.append(f"hostname {shlex.quote(self.hostname)}")
        for target, source, read_only in mounts:
            self.nodes.mount_point(target, source.is_dir())
            q = shlex.quote(target)
            lines.append(
                f"mkdir -p {q}" if source.is_dir() else f"[ -e {q} ] || {{ mkdir -p $(dirname {q}); : > {q}; }}"
            )
            lines.append(f"mount --bind {shlex.quote(str(source))} {q}")
            if read_only:
                lines.append(f"mount -o remount,bind,ro {q}")
        working = c.spec.get("workingDir")
        lines.append(f"mkdir -p {shlex.quote(working)}; cd {shlex.quote(working)}" if working
                     else f"cd {shlex.quote(str(self.directory))}")  # fmt: skip
        lines.append('exec "$@"')
        unshare = ["unshare", "--mount", "--propagation", "slave"] + ([] if self.host_network else ["--uts"])
        prefix = [] if self.host_network else self.nodes.network.exec_prefix(self.ip)
        argv = [*prefix, *unshare, "--", "/bin/sh", "-c", "\n".join(lines), c.name, *command]
        c.log.parent.mkdir(parents=True, exist_ok=True)
        with open(c.log, "ab") as log:
            c.log_offset = log.tell()
            c.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, cwd=self.directory)  # fmt: skip
        if self.nodes.cgroups is not None:
            c.cgroup = self.nodes.cgroups / f"{self.uid[:13]}-{c.name}-{c.runs}"
            with contextlib.suppress(OSError):
                c.cgroup.mkdir(exist_ok=True)
                (c.cgroup / "cgroup.procs").write_text(str(c.proc.pid))
        with contextlib.suppress(OSError):
            c.proc.stdin.write(b"\n")
            c.proc.stdin.close()
        if c.runs:
            c.restarts += 1
        c.runs += 1
        c.started_mono = time.monotonic()
        c.started = "startupProbe" not in c.probes
        c.ready = False
        c.state = {"running": {"startedAt": now()}}
        for probe in c.probes.values():
            probe.next_at, probe.successes, probe.failures, probe.passed = 0.0, 0, 0, None

    def _mounts(self, c: Container) -> list[tuple[str, Path, bool]]:
        """(mountPath, host folder or file, read only), outer paths first, the termination file last."""
        mounts = []
        for mount in c.spec.get("volumeMounts") or []:
            if self.nodes.workdir.is_relative_to(mount["mountPath"]):
                continue  # over the node's own folder (/tmp where the cluster lives): the host's folder stays
            source = self.volumes[mount["name"]]
            if mount.get("subPath"):
                source = source / mount["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            # ConfigMap, Secret, downwardAPI and projected volumes are read-only, as the kubelet mounts them
            read_only = bool(mount.get("readOnly")) or mount["name"] in self.read_only_volumes
            mounts.append((mount["mountPath"], source, read_only))
        mounts.sort(key=lambda m: m[0].count("/"))
        mounts.append((c.spec.get("terminationMessagePath") or "/dev/termination-log", c.termination_file, False))
        return mounts

    def _environment(self, c: Container) -> tuple[dict[str, str], list[str]]:
        env = {k: os.environ[k] for k in self.nodes.host_env if k in os.environ}
        host_path = os.environ.get("PATH", "/usr/bin:/bin")
        env["PATH"] = os.pathsep.join((str(self.nodes.shims), str(self.nodes.python_bin), host_path))
        env["HOSTNAME"] = self.hostname
        env.update(self.nodes.extra_env)
        declared: dict[str, str] = {}
        for source in c.spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_map(source["configMapRef"]["name"], source["configMapRef"].get("optional"))
            else:
                data = self._secret(source["secretRef"]["name"], source["secretRef"].get("optional"))
            for key, value in data.items():
                if re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", prefix + key):
                    declared[prefix + key] = value
        for var in c.spec.get("env") or []:
            if "valueFrom" in var:
                value = self._env_source(c, var["valueFrom"])
                if value is None:
                    continue
                declared[var["name"]] = value
            else:
                declared[var["name"]] = expand(str(var.get("value", "")), declared)
        gpus = self._gpus(c)
        if gpus is not None:
            env["NVIDIA_VISIBLE_DEVICES"] = gpus
        env.update(declared)
        command = [expand(part, declared) for part in (c.spec.get("command") or []) + (c.spec.get("args") or [])]
        if not c.spec.get("command"):
            raise ConfigError(f"container {c.name} has no command: the process node runs no images")
        return env, command

    def _gpus(self, c: Container) -> str | None:
        limits = (c.spec.get("resources") or {}).get("limits") or {}
        wanted = int(quantity(limits.get(GPU_RESOURCE, 0)))
        if not wanted:
            return None
        if not c.gpus:
            c.gpus = self.node.take_gpus(wanted)
        return ",".join(map(str, c.gpus))

    def _env_source(self, c: Container, source: dict) -> str | None:
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource(source["resourceFieldRef"], c.spec)
        for kind, read in (("configMapKeyRef", self._config_map), ("secretKeyRef", self._secret)):
            if kind in source:
                ref = source[kind]
                data = read(ref["name"], ref.get("optional"))
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f"key {ref['key']} not in {kind[:-6]} {ref['name']}")
                return data[ref["key"]]
        raise ConfigError(f"unsupported env source {sorted(source)}")

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if match:
            return (meta.get(match.group(1)) or {}).get(match.group(2), "")
        values = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "metadata.labels": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("labels") or {}).items())),
            "metadata.annotations": "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get("annotations") or {}).items())),
            "spec.nodeName": self.node.name,
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
            "status.hostIP": self.node.ip,
            "status.hostIPs": self.node.ip,
            "status.podIP": self.ip or "",
            "status.podIPs": self.ip or "",
        }
        if path not in values:
            raise ConfigError(f"unsupported fieldRef {path}")
        return values[path]

    def _resource(self, ref: dict, container: dict | None) -> str:
        if container is None or ref.get("containerName"):
            wanted = ref.get("containerName")
            container = next(
                (x for x in self.pod["spec"].get("containers", []) if x["name"] == wanted), container or {}
            )
        kind, _, name = ref["resource"].partition(".")
        resources = (container.get("resources") or {}).get(kind) or {}
        if name in resources:
            value = quantity(resources[name])
        elif kind == "limits":
            value = quantity(self.node.allocatable.get(name, 0))
        else:
            value = 0.0
        divisor = quantity(ref.get("divisor") or "1")
        return str(max(math.ceil(value / divisor - 1e-9), 1 if value else 0))

    def _config_map(self, name: str, optional: bool | None) -> dict[str, str]:
        return self._read("configmap", name, optional)

    def _secret(self, name: str, optional: bool | None) -> dict[str, str]:
        return self._read("secret", name, optional)

    def _read(self, kind: str, name: str, optional: bool | None) -> dict[str, str]:
        """A ConfigMap's data and binaryData, or a Secret's data, decoded; {} for a missing optional one."""
        status, data = self.node.api.call("GET", f"/api/v1/namespaces/{self.namespace}/{kind}s/{name}")
        if status == 404 and optional:
            return {}
        if status != 200:
            raise ConfigError(f'{kind} "{name}" not found' if status == 404 else f"{kind} {name}: {status}")
        encoded = data.get("binaryData") if kind == "configmap" else data.get("data")
        decoded = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (encoded or {}).items()}
        return {**(data.get("data") or {}), **decoded} if kind == "configmap" else decoded

    # ------------------------------------------------------------------ volumes

    def _make_volumes(self) -> dict[str, Path]:
        volumes: dict[str, Path] = {}
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            local = self.directory / "volumes" / name
            if "persistentVolumeClaim" in volume:
                volumes[name] = self._claim(volume["persistentVolumeClaim"]["claimName"])
            elif "hostPath" in volume:
                path = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") in ("DirectoryOrCreate", None, "") and not path.exists():
                    path.mkdir(parents=True, exist_ok=True)
                volumes[name] = path
            elif "emptyDir" in volume:
                if not local.exists():
                    local.mkdir(parents=True)
                    if (volume["emptyDir"] or {}).get("medium") == "Memory":
                        size = (volume["emptyDir"] or {}).get("sizeLimit")
                        options = ["-o", f"size={int(quantity(size))}"] if size else []
                        subprocess.run(["mount", "-t", "tmpfs", *options, "tmpfs", str(local)], check=True)
                        self.tmpfs.append(local)
                volumes[name] = local
            else:
                files = self._projected_files(volume)
                self.read_only_volumes.add(name)
                local.mkdir(parents=True, exist_ok=True)
                mode = next((volume[k].get("defaultMode") for k in volume if isinstance(volume[k], dict)), None)
                for relative, (content, file_mode) in files.items():
                    path = local / relative
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(content)
                    if file_mode or mode:
                        path.chmod(file_mode or mode)
                volumes[name] = local
        return volumes

    def _projected_files(self, volume: dict) -> dict[str, tuple[bytes, int | None]]:
        """A configMap/secret/downwardAPI/projected volume's files: path → (content, mode)."""
        if "projected" in volume:
            files: dict[str, tuple[bytes, int | None]] = {}
            for source in volume["projected"].get("sources") or []:
                files.update(self._projected_files(source))
            return files
        if "configMap" in volume or "secret" in volume:
            kind = "configMap" if "configMap" in volume else "secret"
            ref = volume[kind]
            name = ref.get("name") or ref.get("secretName")
            data = (self._config_map if kind == "configMap" else self._secret)(name, ref.get("optional"))
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            out = {}
            for item in items:
                if item["key"] not in data:
                    if ref.get("optional"):
                        continue
                    raise ConfigError(f"key {item['key']} not in {kind} {name}")
                out[item["path"]] = (data[item["key"]].encode(), item.get("mode"))
            return out
        if "downwardAPI" in volume:
            out = {}
            for item in volume["downwardAPI"].get("items") or []:
                if "fieldRef" in item:
                    value = self._field(item["fieldRef"]["fieldPath"])
                else:
                    value = self._resource(item["resourceFieldRef"], None)
                out[item["path"]] = (value.encode(), item.get("mode"))
            return out
        if "serviceAccountToken" in volume:
            spec = volume["serviceAccountToken"]
            return {spec["path"]: (self._token(spec).encode(), None)}
        if "clusterTrustBundle" in volume:
            return {}
        raise ConfigError(f"unsupported volume {sorted(k for k in volume if k != 'name')}")

    def _token(self, spec: dict) -> str:
        account = self.pod["spec"].get("serviceAccountName", "default")
        request = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "audiences": [spec["audience"]] if spec.get("audience") else [],
                "expirationSeconds": spec.get("expirationSeconds", 3607),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name, "uid": self.uid},
            },
        }
        status, data = self.node.api.call(
            "POST", f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token", request
        )
        if status != 201:
            raise ConfigError(f"token of serviceaccount {account}: HTTP {status}: {data.get('message')}")
        return data["status"]["token"]

    def _claim(self, claim: str) -> Path:
        """The bound PV's hostPath, else the claim's shared folder."""
        status, pvc = self.node.api.call("GET", f"/api/v1/namespaces/{self.namespace}/persistentvolumeclaims/{claim}")
        if status == 404:
            raise ConfigError(f'persistentvolumeclaim "{claim}" not found')
        volume = (pvc.get("spec") or {}).get("volumeName")
        if volume:
            status, pv = self.node.api.call("GET", f"/api/v1/persistentvolumes/{volume}")
            path = ((pv.get("spec") or {}).get("hostPath") or (pv.get("spec") or {}).get("local") or {}).get("path")
            if status == 200 and path:
                Path(path).mkdir(parents=True, exist_ok=True)
                return Path(path)
        local = self.nodes.claim_dir(self.namespace, claim)
        local.mkdir(parents=True, exist_ok=True)
        return local

    # ------------------------------------------------------------------ network

    def _network(self) -> None:
        if self.host_network:
            self.ip = self.node.ip
            return
        self.ip = self.nodes.network.allocate(self.node.index)
        self.nodes.network.add_pod(self.ip)
        self.netns = True
        self.nodes.refresh_hosts(self)

    def _release_network(self) -> None:
        if self.netns:
            self.nodes.network.remove_pod(self.ip)
            self.netns = False

    def _teardown(self) -> None:
        self._release_network()
        for path in self.tmpfs:
            subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)
        self.tmpfs.clear()
        for c in self.init + self.main:
            self.node.give_gpus(c.gpus)
            c.gpus = []

    def hosts_text(self, records: list[tuple[str, str, list[str], list[str]]]) -> str:
        """This pod's /etc/hosts: itself, then ``records`` (namespace, ip, names, short names)."""
        ns = self.namespace
        subdomain = self.pod["spec"].get("subdomain")
        own = f"{self.hostname}.{subdomain}.{ns}.svc.cluster.local {self.hostname}" if subdomain else self.hostname
        lines = ["# Kubernetes-managed hosts file (atlas process node).", "127.0.0.1\tlocalhost",
                 "::1\tlocalhost ip6-localhost ip6-loopback", f"{self.ip}\t{own}"]  # fmt: skip
        for namespace, ip_, names, short in records:
            shown = names + (short if namespace == ns else [])
            lines.append(f"{ip_}\t{' '.join(shown)}")
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ stopping

    def _grace(self, grace: Any) -> float:
        if grace is None:
            grace = self.pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return max(float(grace), 0.0)

    def _stop_container(self, c: Container, grace: float) -> None:
        if c.alive():
            c.signal_main(signal.SIGTERM)
            c.kill_at = time.monotonic() + grace

    def _wait_stopped(self, containers: list[Container]) -> None:
        while any(c.alive() for c in containers):
            if self.gone:
                for c in containers:
                    c.kill_all()
            for c in containers:
                if c.kill_at is not None and time.monotonic() >= c.kill_at and c.alive():
                    c.kill_all()
            time.sleep(0.05)
        for c in containers:
            if c.proc is not None:
                code = c.proc.returncode
                self._exited(c, code if code >= 0 else 128 - code, final=True)

    def _terminate(self, grace: Any) -> None:
        """The pod's deletion: SIGTERM to every container's main process, SIGKILL after the grace period."""
        seconds = self._grace(grace)
        started = time.monotonic()
        running = [c for c in self.main + self.init if c.alive()]
        for c in running:
            self._stop_container(c, seconds)
        if running:
            self._wait_stopped(running)
            codes = [c.exit_code for c in running]
            self.nodes.terminations.append(
                (f"{self.namespace}/{self.pod_name}", time.monotonic() - started, max(codes, key=abs))
            )
        for c in self.main + self.init:
            c.done, c.ready = True, False
            if "terminated" not in c.state:
                c.state = {"terminated": {"exitCode": 0 if c.runs == 0 else 137, "reason": "ContainerStatusUnknown"
                                          if c.runs == 0 else "Error", "finishedAt": now()}}  # fmt: skip
        if self.phase not in ("Succeeded", "Failed"):
            codes = [(c.state.get("terminated") or {}).get("exitCode", 0) for c in self.main]
            self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self._release_network()
        self._report()

    def _final_delete(self) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}}  # fmt: skip
        for _ in range(20):
            try:
                status, _ = self.node.api.call(
                    "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}", body
                )
                if status in (200, 202, 404, 409):  # 409: the precondition failed, the pod is another one now
                    break
            except Exception:
                pass
            time.sleep(0.5)
        self.gone = True

    # ------------------------------------------------------------------ status

    def _container_status(self, c: Container) -> dict:
        entry = {
            "name": c.name,
            "state": c.state,
            "lastState": c.last_state and {"terminated": c.last_state} or {},
            "ready": c.ready,
            "restartCount": c.restarts,
            "image": c.spec.get("image") or "none",
            "imageID": "",
            "started": c.started and c.proc is not None,
        }
        if c.proc is not None:
            entry["containerID"] = f"process://{c.proc.pid}"
        elif "terminated" in c.state:
            entry["containerID"] = c.state["terminated"].get("containerID", "")
        return entry

    def _condition(self, type_: str, ok: bool, reason: str | None = None) -> dict:
        status = "True" if ok else "False"
        previous = self.transitions.get(type_)
        if previous is None or previous[0] != status:
            self.transitions[type_] = (status, now())
        condition = {"type": type_, "status": status, "lastProbeTime": None,
                     "lastTransitionTime": self.transitions[type_][1]}  # fmt: skip
        if reason and not ok:
            condition["reason"] = reason
        return condition

    def _report(self) -> None:
        if self.gone or self.halt:
            return
        terminal = self.phase in ("Succeeded", "Failed")
        ready = bool(self.main) and all(c.ready for c in self.main) and not terminal
        sandbox = self.netns or self.host_network
        conditions = [
            self._condition("PodReadyToStartContainers", sandbox and not terminal),
            self._condition("Initialized", self.init_done or not self.init, "ContainersNotInitialized"),
            self._condition("ContainersReady", ready, "ContainersNotReady"),
            self._condition("Ready", ready, "ContainersNotReady"),
        ]
        kept = [c for c in (self.pod.get("status") or {}).get("conditions") or []
                if c.get("type") not in {x["type"] for x in conditions}]  # fmt: skip
        status = {
            "phase": self.phase,
            "conditions": kept + conditions,
            "hostIP": self.node.ip,
            "hostIPs": [{"ip": self.node.ip}],
            "startTime": self.start_time,
            "containerStatuses": [self._container_status(c) for c in self.main],
        }
        if self.ip:
            status["podIP"], status["podIPs"] = self.ip, [{"ip": self.ip}]
        if self.init:
            status["initContainerStatuses"] = [self._container_status(c) for c in self.init]
        if status == self.reported and _says_the_same((self.pod.get("status") or {}), status):
            return
        try:
            code, data = self.node.api.call(
                "PATCH",
                f"/api/v1/namespaces/{self.namespace}/pods/{self.pod_name}/status",
                {"status": status},
                content_type="application/merge-patch+json",
            )
        except Exception as exc:  # the API server away for a moment: the containers run on, reported next tick
            code, data = 0, {"error": repr(exc)}
        if code == 404:
            self.gone = True
        elif code == 200:
            if self.reported is None or self.reported["conditions"] != status["conditions"]:
                self.nodes.wake.set()  # its DNS records may change: resync now
            self.reported = status
            self.pod = data
        else:
            self.nodes.log(f"process node: status of {self.namespace}/{self.pod_name}: HTTP {code} {data}")


# ---------------------------------------------------------------------- one node


class Node:
    """One registered Node: its object, its Lease and its fake GPUs."""

    def __init__(self, nodes: ProcessNodes, index: int):
        self.nodes = nodes
        self.index = index
        self.name = f"{NODE_PREFIX}{index}"
        self.ip = nodes.network.node_ip(index)
        self.api = Api(user_kubeconfig(nodes.cluster_dir, f"node-{self.name}",
                                       f"/O=system:nodes/CN=system:node:{self.name}"))  # fmt: skip
        self.capacity = {
            "cpu": str(nodes.cpu),
            "memory": str(nodes.memory),
            "pods": str(nodes.max_pods),
            "ephemeral-storage": "100Gi",
            GPU_RESOURCE: str(nodes.gpus),
        }
        self.allocatable = dict(self.capacity)
        self.free_gpus = list(range(nodes.gpus))
        self._lock = threading.Lock()
        self.renewed = 0.0
        self.status_at = 0.0

    def take_gpus(self, count: int) -> list[int]:
        with self._lock:
            taken, self.free_gpus = self.free_gpus[:count], self.free_gpus[count:]
            return taken

    def give_gpus(self, gpus: list[int]) -> None:
        with self._lock:
            self.free_gpus = sorted(set(self.free_gpus) | set(gpus))

    def _status(self) -> dict:
        t = now()
        conditions = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
        return {
            "capacity": self.capacity,
            "allocatable": self.allocatable,
            "conditions": [
                {
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": "atlas process node",
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": self.nodes.started_at,
                }
                for type_, status, reason in conditions
            ],  # fmt: skip
            "addresses": [{"type": "InternalIP", "address": self.ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": os.uname().release,
                "osImage": "atlas process node",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
            },  # fmt: skip
        }

    def register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": self._status()["nodeInfo"]["architecture"],
            "node.kubernetes.io/instance-type": "atlas-process-node",
            **({"nvidia.com/gpu.present": "true"} if self.nodes.gpus else {}),
            **self.nodes.node_labels,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {
                "podCIDR": self.nodes.network.pod_cidr(self.index),
                "podCIDRs": [self.nodes.network.pod_cidr(self.index)],
            },  # fmt: skip
        }
        status, data = self.api.call("POST", "/api/v1/nodes", body)
        if status == 409:  # left by an earlier run: take it over
            self.api.ok("PATCH", f"/api/v1/nodes/{self.name}", {"metadata": {"labels": labels}},
                        content_type="application/merge-patch+json")  # fmt: skip
        elif status != 201:
            raise RuntimeError(f"registering node {self.name}: HTTP {status}: {data.get('message')}")
        self.report_status()
        self.renew_lease()

    def report_status(self) -> None:
        self.api.ok("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": self._status()},
                    content_type="application/merge-patch+json")  # fmt: skip
        self.status_at = time.monotonic()

    def renew_lease(self) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_S, "renewTime": micro_now()}
        status, _ = self.api.call("PATCH", f"{path}/{self.name}", {"spec": spec},
                                  content_type="application/merge-patch+json")  # fmt: skip
        if status == 404:
            status, data = self.api.call("POST", path, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": "kube-node-lease"}, "spec": spec,
            })  # fmt: skip
            if status not in (201, 409):
                raise RuntimeError(f"lease of node {self.name}: HTTP {status}: {data.get('message')}")
        self.renewed = time.monotonic()

    def heartbeat(self) -> None:
        if time.monotonic() - self.renewed >= RENEW_S:
            self.renew_lease()
        if time.monotonic() - self.status_at >= NODE_STATUS_S:
            self.report_status()

    def deregister(self) -> None:
        """Delete the Node as the admin (the system:node role may not delete Nodes), then its Lease."""
        self.nodes.admin.call("DELETE", f"/api/v1/nodes/{self.name}")
        self.api.call("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}")


# ---------------------------------------------------------------------- the nodes


class ProcessNodes:
    """N process nodes of the cluster in ``cluster_dir`` (its ``pki/`` and ``admin.kubeconfig``), served by one
    thread that lists pods and Services every ``sync_s`` and one thread per pod. ``start()`` returns once every
    node is Ready and untainted (the node lifecycle controller of kube-controller-manager lifts the
    ``not-ready`` taint the API server puts on a new Node)."""

    def __init__(
        self,
        cluster_dir: Path,
        count: int = 2,
        gpus: int = 8,
        cpu: str | int = 16,
        memory: str = "64Gi",
        max_pods: int = 110,
        workdir: Path | None = None,
        python_bin: Path | None = None,
        host_env: tuple[str, ...] = HOST_ENV,
        extra_env: dict[str, str] | None = None,
        node_labels: dict[str, str] | None = None,
        network_prefix: str = "atlas",
        cidr: str | None = None,
        sync_s: float = 0.3,
        deregister: bool = True,
        provision_claims: bool = True,
        log=None,
    ):
        self.cluster_dir = Path(cluster_dir)
        self.count, self.gpus, self.cpu, self.memory, self.max_pods = count, gpus, cpu, memory, max_pods
        self.workdir = Path(workdir or self.cluster_dir / "nodes")
        self.python_bin = Path(python_bin or Path(sys.executable).parent)
        self.host_env, self.extra_env = host_env, dict(extra_env or {})
        self.node_labels = dict(node_labels or {})
        self.sync_s = sync_s
        self.deregister = deregister
        self.provision_claims = provision_claims
        self.log = log or (lambda line: print(line, file=sys.stderr))
        self.network = podnet.PodNetwork(self.workdir, network_prefix, cidr, count)
        self.cgroups: Path | None = None
        self.nodes: list[Node] = []
        self.workers: dict[str, PodWorker] = {}  # pod uid → its worker
        self.terminations: list[tuple[str, float, int]] = []  # (ns/pod, seconds from SIGTERM to exit, exit code)
        self.started_at = now()
        self._records: list[tuple[str, str, list[str], list[str]]] = []
        self._mount_points: set[Path] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-nodes", daemon=True)
        self.passes = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> ProcessNodes:
        reason = podnet.available()
        if reason:
            raise podnet.NetworkError(f"process nodes need pod networks: {reason}")
        self.admin = Api(self.cluster_dir / "admin.kubeconfig")
        ensure_node_rbac(self.admin)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_shims()
        self.network.start()
        self.cgroups = _cgroup_root(f"atlas-{self.network.prefix}-{os.getpid()}")
        self.nodes = [Node(self, i) for i in range(self.count)]
        for node in self.nodes:
            node.register()
        self._host_base = podnet.host_hosts_base()
        self.host_hosts.write_text(podnet.host_hosts_text(self._host_base, []))
        self._thread.start()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            while True:
                _, data = self.admin.call("GET", f"/api/v1/nodes/{node.name}")
                taints = [t["key"] for t in (data.get("spec") or {}).get("taints") or []]
                if not any(t.startswith("node.kubernetes.io/") for t in taints):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {node.name} still tainted {taints} after {timeout:.0f} s "
                                       "(is kube-controller-manager running?)")  # fmt: skip
                time.sleep(0.2)

    def current_workers(self) -> list[PodWorker]:
        """The pods' workers now (a copy: the nodes' thread adds and removes them)."""
        with self._lock:
            return list(self.workers.values())

    def stop(self) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread.is_alive():
            self._thread.join(30)
        workers = self.current_workers()
        for worker in workers:
            worker.halt = True
        for worker in workers:
            worker.join(15)
        if self.deregister:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    node.deregister()
        self.network.stop()
        self.host_hosts.unlink(missing_ok=True)
        if self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.rmdir()
        for path in sorted(self._mount_points, key=lambda p: -len(p.parts)):
            if mounted_anywhere(path):  # another cluster's pod mounts there: removing it would detach that mount
                continue
            with contextlib.suppress(OSError):
                path.unlink() if path.is_file() else path.rmdir()

    def __enter__(self) -> ProcessNodes:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def host_hosts(self) -> Path:
        """The cluster's names as the host sees them (atlas_cluster/podnet.py ``with_cluster_names``)."""
        return podnet.host_hosts_file(self.cluster_dir)

    @property
    def shims(self) -> Path:
        return self.workdir / "bin"

    def _write_shims(self) -> None:
        self.shims.mkdir(parents=True, exist_ok=True)
        for name, text in SHIMS.items():
            (self.shims / name).write_text(text)
            (self.shims / name).chmod(0o755)

    # ------------------------------------------------------------------ what tests and users read

    def pod_dir(self, namespace: str, pod: str) -> Path:
        return self.workdir / "pods" / f"{namespace}_{pod}"

    def log_file(self, namespace: str, pod: str, container: str) -> Path:
        return self.pod_dir(namespace, pod) / "logs" / f"{container}.log"

    def logs(self, namespace: str, pod: str, container: str) -> str:
        path = self.log_file(namespace, pod, container)
        return path.read_text(errors="replace") if path.exists() else ""

    def claim_dir(self, namespace: str, claim: str) -> Path:
        return self.workdir / "pvc" / namespace / claim

    # ------------------------------------------------------------------ shared by the workers

    def mount_point(self, target: str, directory: bool) -> None:
        """Note the topmost part of ``target`` missing on the host (a container's mount creates it), to remove
        it on stop."""
        path = Path(target)
        if path.exists():
            return
        while not path.parent.exists():
            path = path.parent
        with self._lock:
            self._mount_points.add(path)

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self.workers.get(worker.uid) is worker:
                del self.workers[worker.uid]

    def refresh_hosts(self, worker: PodWorker) -> None:
        if worker.netns and worker.ip:
            self.network.write_hosts(worker.ip, worker.hosts_text(self._records))

    # ------------------------------------------------------------------ the sync loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
                for node in self.nodes:
                    node.heartbeat()
            except Exception:
                self.log(f"process node: {traceback.format_exc()}")
            self.passes += 1
            self.wake.wait(self.sync_s)
            self.wake.clear()

    def _sync(self) -> None:
        api = self.nodes[0].api
        pods = api.ok("GET", "/api/v1/pods")["items"]
        services = api.ok("GET", "/api/v1/services")["items"]
        ours = {node.name: node for node in self.nodes}
        seen = set()
        for pod in pods:
            node = ours.get((pod.get("spec") or {}).get("nodeName") or "")
            if node is None:
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self._lock:
                worker = self.workers.get(uid)
                if worker is None and not self._stop.is_set():
                    worker = self.workers[uid] = PodWorker(self, node, pod)
                    worker.start()
                elif worker is not None and int(pod["metadata"].get("resourceVersion", 0)) >= int(
                    worker.pod["metadata"].get("resourceVersion", 0)
                ):
                    worker.pod = pod
        workers = self.current_workers()
        for worker in workers:
            if worker.uid not in seen:
                worker.gone = True
        self._records = dns_records(pods, services)
        for worker in workers:
            self.refresh_hosts(worker)
        podnet.rewrite_in_place(self.host_hosts, podnet.host_hosts_text(self._host_base, self._records))
        if self.provision_claims and self.passes % 3 == 0:
            self._provision()

    def _provision(self) -> None:
        """A pre-bound hostPath PV for each Pending claim that has none (see the module's docstring)."""
        ours = self.admin.ok("GET", "/api/v1/persistentvolumes", query={"labelSelector": PV_LABEL})["items"]
        for volume in ours:  # its claim is gone: so is the volume (the folder stays until the nodes' workdir goes)
            if (volume.get("status") or {}).get("phase") == "Released":
                self.admin.call("DELETE", f"/api/v1/persistentvolumes/{volume['metadata']['name']}")
        for claim in self.admin.ok("GET", "/api/v1/persistentvolumeclaims")["items"]:
            meta, spec = claim["metadata"], claim.get("spec") or {}
            if spec.get("volumeName") or (claim.get("status") or {}).get("phase") not in (None, "Pending"):
                continue
            if meta.get("deletionTimestamp"):
                continue
            folder = self.claim_dir(meta["namespace"], meta["name"])
            folder.mkdir(parents=True, exist_ok=True)
            size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            volume = {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"pvc-{meta['uid']}", "labels": dict([PV_LABEL.split("=")])},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": spec.get("accessModes") or ["ReadWriteOnce"],
                    "volumeMode": spec.get("volumeMode", "Filesystem"),
                    "storageClassName": spec.get("storageClassName") or "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": meta["namespace"],
                                 "name": meta["name"], "uid": meta["uid"]},
                },
            }  # fmt: skip
            status, data = self.admin.call("POST", "/api/v1/persistentvolumes", volume)
            if status not in (201, 409):
                self.log(f"process node: volume for claim {meta['namespace']}/{meta['name']}: HTTP {status} {data}")


def _says_the_same(posted: dict, ours: dict) -> bool:
    """Whether the API's copy of a pod's status says what its node would post: the phase and each condition's status.
    The node lifecycle controller marks the pods of a node it has not heard from NotReady (the API server was away,
    so were the heartbeats); as the kubelet's status manager does, the node puts back what it knows once it is heard
    from again (else the pod's Service had no DNS record for the rest of its life)."""
    conditions = {c.get("type"): c.get("status") for c in posted.get("conditions") or []}
    agree = all(conditions.get(c["type"]) == c["status"] for c in ours["conditions"])
    return agree and posted.get("phase") == ours["phase"]


def dns_records(pods: list[dict], services: list[dict]) -> list[tuple[str, str, list[str], list[str]]]:
    """What cluster DNS would answer, as hosts-file records (namespace, ip, qualified names, short names): each
    Service with a selector → its endpoints' pod IPs (ready ones; all with ``publishNotReadyAddresses``), and for a
    headless one, ``<hostname>.<service>`` of each endpoint pod whose ``subdomain`` is the Service."""
    by_namespace: dict[str, list[dict]] = {}
    for pod in pods:
        status = pod.get("status") or {}
        if (
            status.get("podIP")
            and status.get("phase") not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp")
        ):
            by_namespace.setdefault(pod["metadata"]["namespace"], []).append(pod)
    records = []
    for service in services:
        spec, meta = service.get("spec") or {}, service["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        selector = spec.get("selector") or {}
        members = [
            pod
            for pod in by_namespace.get(namespace, [])
            if selector_matches(selector, pod["metadata"].get("labels") or {})
            and (spec.get("publishNotReadyAddresses") or pod_ready(pod))
        ]
        qualified = [f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
        for pod in members:
            records.append((namespace, pod["status"]["podIP"], qualified, [name]))
        if spec.get("clusterIP") == "None":
            for pod in members:
                host = pod["spec"].get("hostname")
                if host and pod["spec"].get("subdomain") == name:
                    names = [f"{host}.{q}" for q in qualified]
                    records.append((namespace, pod["status"]["podIP"], names, [f"{host}.{name}"]))
    # Every pod's own A record (``10-244-1-5.<ns>.pod.cluster.local``), also as the IPv4-mapped IPv6 address: reverse
    # lookups of a peer's address (torch's c10d store does one per client, on a dual-stack socket) are answered
    # from the file too.
    for namespace, members in sorted(by_namespace.items()):
        for pod in members:
            address = pod["status"]["podIP"]
            name = f"{address.replace('.', '-')}.{namespace}.pod.cluster.local"
            records.append((namespace, address, [name], []))
            records.append((namespace, f"::ffff:{address}", [name], []))  # as a dual-stack listener sees a peer
    return records


# ---------------------------------------------------------------------- python -m atlas_cluster.node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run process nodes for a local atlas cluster.")
    parser.add_argument("--cluster-dir", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cpu", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--network-prefix", default="atlas", help="names of the bridge and pod namespaces (<= 9)")
    args = parser.parse_args(argv)
    nodes = ProcessNodes(
        args.cluster_dir, args.nodes, args.gpus, args.cpu, args.memory, network_prefix=args.network_prefix
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    nodes.start()
    print(f"process nodes ready: {', '.join(n.name for n in nodes.nodes)}", flush=True)
    try:
        stopped.wait()
    finally:
        nodes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
