"""N process nodes of one cluster: registered, their Leases renewed, every pod the scheduler binds to one of them
run by a worker of its own (pod.py), every pod's hosts file rewritten as pods and Services come and go, and a
hostPath PersistentVolume provisioned for each Pending claim (the cluster has no provisioner)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from atlas_cluster.api import Api
from atlas_cluster.node import podnet
from atlas_cluster.node.container import cgroup_root
from atlas_cluster.node.dns import dns_records
from atlas_cluster.node.lease import Node
from atlas_cluster.node.pod import PodWorker
from atlas_cluster.node.timestamps import now
from atlas_cluster.node.volumes import mounted_anywhere

HOST_ENV = (
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "ATLAS_CACHE_DIR",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "TORCH_HOME",
    "XDG_CACHE_HOME",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
)
NODE_RBAC_BINDING = "atlas:process-nodes"
PV_LABEL = "app.kubernetes.io/managed-by=atlas-process-node"  # the PersistentVolumes the nodes provision
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
        self.cgroups = cgroup_root(f"atlas-{self.network.prefix}-{os.getpid()}")
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
                    raise TimeoutError(
                        f"node {node.name} still tainted {taints} after {timeout:.0f} s "
                        "(is kube-controller-manager running?)"
                    )
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
        """The cluster's names as the host sees them (podnet.py ``with_cluster_names``)."""
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
                    "claimRef": {
                        "apiVersion": "v1",
                        "kind": "PersistentVolumeClaim",
                        "namespace": meta["namespace"],
                        "name": meta["name"],
                        "uid": meta["uid"],
                    },
                },
            }
            status, data = self.admin.call("POST", "/api/v1/persistentvolumes", volume)
            if status not in (201, 409):
                self.log(f"process node: volume for claim {meta['namespace']}/{meta['name']}: HTTP {status} {data}")
