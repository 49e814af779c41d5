"""A local stand-in for the Kubeflow Training Operator, for end-to-end tests (not a product feature).

It watches PyTorchJobs on the Kubernetes API (the kmock emulator) and runs each replica's ``pytorch`` container
through tests.support.kubelet, with what the Kubeflow controller gives it:

* the environment the controller injects: MASTER_ADDR=127.0.0.1, MASTER_PORT (one free port per job), PET_NNODES,
  PET_NODE_RANK, PET_NPROC_PER_NODE, WORLD_SIZE, RANK — plus the container's own ``env``;
* PyTorchJob status written as the controller would: Created → Running → Succeeded, or Failed with the exit code;
  Restarting when a replica exits non-zero and the restart policy (OnFailure) allows it, up to
  runPolicy.backoffLimit; ``replicaStatuses`` with active/succeeded/failed counts;
* Pod objects ``<job>-<replica type, lowercase>-<index>`` in the API, as the controller names them (owner: the job),
  and their status as the kubelet reports it.

Jobs run one at a time (a one-node cluster: every Master would bind the same host ports).
"""

from __future__ import annotations

from typing import Any

from tests.support.env import free_port
from tests.support.kubelet import Kubelet, Replica, now


class PyTorchJobExecutor(Kubelet):
    """The Kubeflow Training Operator (PyTorchJob) and the kubelet, for PyTorchJobs on the emulator."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.replicas: dict[str, list[Replica]] = {}  # job uid → pods
        self.done: set[str] = set()
        self.collected: set[str] = set()  # deleted jobs whose Pod objects are gone too

    def _all_pods(self) -> list[Replica]:
        return [pod for pods in self.replicas.values() for pod in pods]

    def pods(self, job: str) -> list[Replica]:
        return next((pods for pods in self.replicas.values() if pods and pods[0].job == job), [])

    def _step(self) -> None:
        jobs = self.custom.list_namespaced_custom_object("kubeflow.org", "v1", self.namespace, "pytorchjobs")["items"]
        running = [uid for uid, pods in self.replicas.items() if uid not in self.done]
        for job in jobs:
            uid = job["metadata"]["uid"]
            if uid in self.done:
                continue
            if uid in self.replicas and job["spec"].get("runPolicy", {}).get("suspend"):
                self._suspend(job)
                running.remove(uid)
            elif uid in self.replicas:
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

    # ------------------------------------------------------------------ the Kubeflow controller

    def _suspend(self, job: dict[str, Any]) -> None:
        """``runPolicy.suspend`` set on a running job (Kueue's preemption): the controller deletes its pods
        (SIGTERM, the grace period, the terminated state, then the object: tests/support/kubelet.py), marks it
        Running False and Suspended True with reason PyTorchJobSuspended, and starts new pods when it is resumed."""
        uid, name = job["metadata"]["uid"], job["metadata"]["name"]
        pods = self.replicas.pop(uid)
        self.terminate_pods(pods)
        for pod in pods:
            self._delete_pod_object(pod.name, uid)
        at = now()
        conditions = [("Created", "True", "PyTorchJobCreated"), ("Running", "False", "PyTorchJobSuspended"),
                      ("Suspended", "True", "PyTorchJobSuspended")]  # fmt: skip
        status = {
            "conditions": [
                {
                    "type": t,
                    "status": v,
                    "reason": r,
                    "message": f"PyTorchJob {name} is suspended.",
                    "lastUpdateTime": at,
                    "lastTransitionTime": at,
                }
                for t, v, r in conditions
            ],  # fmt: skip
            "replicaStatuses": {},
            "startTime": None,
        }
        self.custom.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", self.namespace, "pytorchjobs", name, {"status": status}
        )

    def _launch(self, job: dict[str, Any]) -> None:
        name, uid = job["metadata"]["name"], job["metadata"]["uid"]
        root = self.workdir / f"{name}-{uid[:8]}"
        root.mkdir(parents=True, exist_ok=True)  # a resumed job's new pods
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
        master_port = free_port()
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
        at = now()
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
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": pod.job, "uid": job["metadata"]["uid"]}
        spec = {**pod.template["spec"], "restartPolicy": pod.restart_policy}
        self._create_pod(pod, owner, labels, dict(meta.get("annotations") or {}), spec)
