"""One pod bound to a process node, run on a thread of its own until its object is gone: its network, its volumes,
its init containers one after another (a sidecar, ``restartPolicy: Always``, beside the rest), its containers,
their probes and its status; on deletion, SIGTERM to each container, SIGKILL after the grace period, the final
status and a delete with grace 0, as the kubelet does."""

from __future__ import annotations

import subprocess
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from atlas_cluster.node.container import Container, Probe
from atlas_cluster.node.dns import Record, hosts_text
from atlas_cluster.node.environment import ConfigError
from atlas_cluster.node.lease import Node
from atlas_cluster.node.probes import Probing
from atlas_cluster.node.status import PodStatus
from atlas_cluster.node.timestamps import now
from atlas_cluster.node.volumes import Volumes
from atlas_cluster.node.worker_state import PodHost

TICK_S = 0.1  # a pod worker's loop


class PodWorker(Probing, Volumes, PodStatus, threading.Thread):
    """Runs one pod bound to ``node`` on a thread of its own until the pod object is gone."""

    def __init__(self, nodes: PodHost, node: Node, pod: dict):
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
            c.state = {
                "waiting": {
                    "reason": "PodInitializing" if self.pod["spec"].get("initContainers") else "ContainerCreating"
                }
            }
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
            assert self.ip is not None  # netns: it was allocated
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

    def hosts_text(self, records: list[Record]) -> str:
        """This pod's /etc/hosts: itself, then ``records``."""
        return hosts_text(self.namespace, self.hostname, self.pod["spec"].get("subdomain"), self.ip, records)

    # ------------------------------------------------------------------ stopping

    def _terminate(self, grace: Any) -> None:
        """The pod's deletion: SIGTERM to every container's main process, SIGKILL after the grace period."""
        seconds = self._grace(grace)
        started = time.monotonic()
        running = [c for c in self.main + self.init if c.alive()]
        for c in running:
            self._stop_container(c, seconds)
        if running:
            self._wait_stopped(running)
            codes = [c.exit_code for c in running if c.exit_code is not None]  # every one, once stopped
            self.nodes.terminations.append(
                (f"{self.namespace}/{self.pod_name}", time.monotonic() - started, max(codes, key=abs))
            )
        for c in self.main + self.init:
            c.done, c.ready = True, False
            if "terminated" not in c.state:
                c.state = {
                    "terminated": {
                        "exitCode": 0 if c.runs == 0 else 137,
                        "reason": "ContainerStatusUnknown" if c.runs == 0 else "Error",
                        "finishedAt": now(),
                    }
                }
        if self.phase not in ("Succeeded", "Failed"):
            codes = [(c.state.get("terminated") or {}).get("exitCode", 0) for c in self.main]
            self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self._release_network()
        self._report()

    def _final_delete(self) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": self.uid},
        }
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
