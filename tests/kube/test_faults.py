"""Faults on the real control plane: the operator SIGKILLed while runs are created and deleted, then restarted (the same
replica: its Lease comes back at once). Every run that exists gets its job exactly once, every deleted run goes with its
children, and nothing is created twice (the API server's audit log of the operator's creates)."""

from __future__ import annotations

import json
import signal
import time

import kubernetes

from tests.kube.conftest import Kube, eventually, start_operator
from tests.support.manifests import tiny_training

RUNS = 20
DELETED = ("r0", "r1")


def test_the_operator_killed_while_runs_come_and_go_converges_after_its_restart(
    kube: Kube, namespace, operator_release
):
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    mark = kube.cluster.control_plane.audit_mark()
    release = operator_release()
    process = f"operator-{release.name}"

    def create_runs(*names: str) -> None:  # one request per run, back to back (kubectl apply of a List)
        items = [tiny_training(name) for name in names]
        for run in items:
            run["metadata"]["namespace"] = namespace
        kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))

    def names(plural: str, group: str = "kubeflow.org", version: str = "v1") -> set[str]:
        listed = custom.list_namespaced_custom_object(group, version, namespace, plural)["items"]
        return {item["metadata"]["name"] for item in listed}

    def runs() -> set[str]:
        return names("atlastrainings", "atlas.arc.computer", "v1alpha1")

    create_runs(*(f"r{i}" for i in range(RUNS // 2)))
    eventually("the operator's first job", lambda: names("pytorchjobs"), timeout=60)
    kube.cluster.supervisor.children[process].send_signal(signal.SIGKILL)  # mid-burst: some runs not reconciled yet
    had_jobs = names("pytorchjobs")
    create_runs(*(f"r{i}" for i in range(RUNS // 2, RUNS)))
    for name in DELETED:  # a run kopf already finalized stays Terminating until the operator is back
        kube.kubectl("delete", "atlastraining", name, "-n", namespace, "--wait=false")

    start_operator(kube, release, process)
    restarted = time.monotonic()
    kept = {f"r{i}" for i in range(RUNS)} - set(DELETED)
    eventually("every kept run's job, and the deleted runs gone",
                lambda: names("pytorchjobs") == kept and runs() == kept, timeout=120)  # fmt: skip
    print(f"operator killed after {len(had_jobs)} of {RUNS // 2} jobs; converged {time.monotonic() - restarted:.1f} s "
          "after its restart")  # fmt: skip

    created = [
        e["objectRef"].get("name") for e in kube.cluster.control_plane.audit_events(mark)
        if e["verb"] == "create" and e.get("objectRef", {}).get("resource") == "pytorchjobs"
        and e["objectRef"].get("namespace") == namespace and e.get("responseStatus", {}).get("code") == 201
    ]  # fmt: skip
    # Each kept run's job made once; a deleted run's, at most once (before the kill, or never).
    assert len(created) == len(kept) + len(had_jobs & set(DELETED)), created
