"""One registered Node: its object (capacity, allocatable, conditions, addresses), its status heartbeat and its
Lease in kube-node-lease (what the node lifecycle controller reads), renewed as the kubelet does, and its fake
``nvidia.com/gpu`` indices."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

from atlas_cluster.api import Api
from atlas_cluster.kubeconfig import user_kubeconfig
from atlas_cluster.node.podnet import PodNetwork
from atlas_cluster.node.timestamps import micro_now, now

NODE_PREFIX = "atlas-node-"
GPU_RESOURCE = "nvidia.com/gpu"
LEASE_S = 40  # the kubelet's lease duration; renewed every RENEW_S
RENEW_S = 10
NODE_STATUS_S = 60  # the Ready condition's heartbeat (the lease is what the node lifecycle controller reads)
VERSION = "v1.36.3"


class NodeHost(Protocol):
    """The process nodes (nodes.py ``ProcessNodes``) as one Node sees them."""

    cluster_dir: Path
    network: PodNetwork
    admin: Api
    cpu: str | int
    memory: str
    max_pods: int
    gpus: int
    node_labels: dict[str, str]
    started_at: str


class Node:
    """One registered Node: its object, its Lease and its fake GPUs."""

    def __init__(self, nodes: NodeHost, index: int):
        self.nodes = nodes
        self.index = index
        self.name = f"{NODE_PREFIX}{index}"
        self.ip = nodes.network.node_ip(index)
        self.api = Api(
            user_kubeconfig(nodes.cluster_dir, f"node-{self.name}", f"/O=system:nodes/CN=system:node:{self.name}")
        )
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
            ],
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
            },
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
            },
        }
        status, data = self.api.call("POST", "/api/v1/nodes", body)
        if status == 409:  # left by an earlier run: take it over
            self.api.ok(
                "PATCH",
                f"/api/v1/nodes/{self.name}",
                {"metadata": {"labels": labels}},
                content_type="application/merge-patch+json",
            )
        elif status != 201:
            raise RuntimeError(f"registering node {self.name}: HTTP {status}: {data.get('message')}")
        self.report_status()
        self.renew_lease()

    def report_status(self) -> None:
        self.api.ok(
            "PATCH",
            f"/api/v1/nodes/{self.name}/status",
            {"status": self._status()},
            content_type="application/merge-patch+json",
        )
        self.status_at = time.monotonic()

    def renew_lease(self) -> None:
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_S, "renewTime": micro_now()}
        status, _ = self.api.call(
            "PATCH", f"{path}/{self.name}", {"spec": spec}, content_type="application/merge-patch+json"
        )
        if status == 404:
            status, data = self.api.call(
                "POST",
                path,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": "kube-node-lease"},
                    "spec": spec,
                },
            )
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
