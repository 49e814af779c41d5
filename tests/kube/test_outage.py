"""The API server unreachable for two minutes while a run trains, on the tier's real control plane: kube-apiserver
SIGKILLed and started again 120 s later (same flags, ports and etcd), with a PyTorchJob run training on a process
node (the real training-operator and kube-scheduler). The pod trains on through the outage — its node needs no API
server to keep its containers running — and once the API server is back the run's status (phase, step) catches up
within two of the operator's progress intervals: the status patch the outage held lands within one, the next tick's
with the current step one later.

SIGKILL, not SIGSTOP: a stopped API server would hold every client's connection open and the operator's requests would
wait on their timeouts (kopf's 5 minutes); a killed one refuses them at once, as a crashed or restarting control
plane does, so what is measured is the operator's own recovery."""

from __future__ import annotations

import json
import time
from pathlib import Path

import kubernetes
import pytest

from harness.manifests import tiny_training
from tests.kube.conftest import Kube, eventually, process_nodes, upstream_controllers

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OUTAGE_S = 120
PROGRESS_INTERVAL_S = 5  # ATLAS_PROGRESS_INTERVAL: the operator's resync of a running run's progress
STEPS = 5000  # far more than the test waits for: the run is deleted once the status has caught up


def logged_steps(out: Path) -> list[int]:
    """The optimizer steps the trainer logged to its output folder (rank 0's metrics.jsonl)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line)["step"] for line in lines[:-1] if '"loss"' in line]  # the last may be half-written


def test_the_api_server_down_for_two_minutes_training_goes_on_and_the_status_catches_up(
    kube: Kube, namespace, operator_release
):
    plane = kube.cluster.control_plane
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    core = kubernetes.client.CoreV1Api(kube.api())
    with (
        upstream_controllers(kube, ("training-operator",)),
        process_nodes(kube, count=1, gpus=0, cpu=4, memory="8Gi") as nodes,
    ):
        # Its own namespace only (runs earlier tests left are no work of this test's); no leader election: a leader
        # that cannot renew its Lease for 7 s exits by design (atlas_operator/leader.py), and its pod's restart is the
        # kubelet's — what is measured here is the operator's own recovery.
        values = {"watchNamespaces": [namespace], "operator": {"leaderElection": False}}
        operator_release(values, env={"ATLAS_PROGRESS_INTERVAL": str(PROGRESS_INTERVAL_S)})
        run = tiny_training(
            "outage",
            resources={"nodes": 1, "gpusPerNode": 0, "cpu": "1", "memory": "1Gi"},
            checkpoint={"path": "/checkpoints", "saveSteps": STEPS},
        )
        run["spec"]["training"]["maxSteps"] = STEPS
        run["metadata"]["namespace"] = namespace
        kube.kubectl("apply", "-f", "-", input=json.dumps(run))

        def status() -> dict:
            body = custom.get_namespaced_custom_object(
                "atlas.arc.computer", "v1alpha1", namespace, "atlastrainings", "outage"
            )
            return body.get("status") or {}

        def trainer() -> str | None:
            pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/instance=outage").items
            return next((p.metadata.name for p in pods if p.status.phase == "Running"), None)

        pod = eventually("the trainer pod running", trainer, timeout=240)
        out = nodes.pod_dir(namespace, pod) / "volumes" / "checkpoints" / "outage"
        eventually(
            "the status showing training progress",
            lambda: (status().get("progress") or {}).get("step") and logged_steps(out),
            timeout=300,
        )

        plane.kill_apiserver()
        killed = time.monotonic()
        at_kill = logged_steps(out)[-1]
        eventually("steps while the API server is down", lambda: logged_steps(out)[-1] > at_kill, timeout=OUTAGE_S / 2)
        mid = logged_steps(out)[-1]
        while time.monotonic() < killed + OUTAGE_S:  # the outage itself: watching the steps go on
            assert trainer_alive(nodes, pod), "the trainer died while the API server was down"
            time.sleep(1.0)
        at_restart = logged_steps(out)[-1]
        plane.start_apiserver()
        back = time.monotonic()
        assert at_restart > mid > at_kill, (at_kill, mid, at_restart)  # training went on through the whole outage

        def current() -> dict | None:  # the status, once it shows the run Running at the step trained by now
            now = status()
            return (
                now
                if now.get("phase") == "Running" and (now.get("progress") or {}).get("step", 0) >= at_restart
                else None
            )

        caught_up = eventually(
            "the run's status catching up with the steps trained during the outage", current, timeout=120
        )
        took = time.monotonic() - back
        print(
            f"API server down {OUTAGE_S} s: steps {at_kill} -> {at_restart} meanwhile; ready again in "
            f"{plane.ready_after['kube-apiserver']:.1f} s, then the run's status at step "
            f"{caught_up['progress']['step']} (>= {at_restart}) {took:.1f} s later "
            f"(progress interval {PROGRESS_INTERVAL_S} s)"
        )
        kube.kubectl("delete", "atlastraining", "outage", "-n", namespace, "--wait=false")
        # The status patch the outage held (the step of its last tick) lands within an interval of the API server's
        # return (atlas_operator/reconcile/retry.py: RetryForever), the next tick's, with the current step, an
        # interval later.
        assert took <= 2 * PROGRESS_INTERVAL_S + 3, took


def trainer_alive(nodes, pod: str) -> bool:
    worker = next((w for w in nodes.current_workers() if w.pod_name == pod), None)
    return worker is not None and all(c.alive() for c in worker.main)
