"""A pod's status as the kubelet reports it: phase, the conditions PodReadyToStartContainers, Initialized,
ContainersReady and Ready, each container's status, the pod's and host's IPs — patched when it changes, or when
the API's copy says otherwise (the node lifecycle controller marked the pod NotReady while the node was away)."""

from __future__ import annotations

from atlas_cluster.node.container import Container
from atlas_cluster.node.timestamps import now
from atlas_cluster.node.worker_state import PodState


class PodStatus(PodState):
    """The worker's part that reports the pod's status."""

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
        condition = {
            "type": type_,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self.transitions[type_][1],
        }
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
        kept = [
            c
            for c in (self.pod.get("status") or {}).get("conditions") or []
            if c.get("type") not in {x["type"] for x in conditions}
        ]
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
        if status == self.reported and says_the_same((self.pod.get("status") or {}), status):
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


def says_the_same(posted: dict, ours: dict) -> bool:
    """Whether the API's copy of a pod's status says what its node would post: the phase and each condition's status.
    The node lifecycle controller marks the pods of a node it has not heard from NotReady (the API server was away,
    so were the heartbeats); as the kubelet's status manager does, the node puts back what it knows once it is heard
    from again (else the pod's Service had no DNS record for the rest of its life)."""
    conditions = {c.get("type"): c.get("status") for c in posted.get("conditions") or []}
    agree = all(conditions.get(c["type"]) == c["status"] for c in ours["conditions"])
    return agree and posted.get("phase") == ours["phase"]
