"""Two operator replicas on the real API server (the chart's ``replicas: 2``, run as two processes under the release's
ServiceAccount): one leads on the Lease ``<fullname>-leader`` (operator/atlas_operator/leader.py), the other stands by
and does nothing; the leader SIGKILLed, the standby takes over within 15 s, and the run created while nobody led is
reconciled once — nothing done twice (the audit log's creates), nothing missed."""

from __future__ import annotations

import json
import signal
import time

import kubernetes

from harness.manifests import tiny_training
from tests.kube.conftest import Kube, eventually, start_operator

TAKEOVER_LIMIT_S = 15.0


def test_two_replicas_elect_one_and_the_standby_takes_over_when_it_is_killed(kube: Kube, namespace, operator_release):
    release = operator_release(start=False)
    lease_name = f"atlas-{namespace}-leader"  # <fullname>-leader (tests/kube/conftest.py install_release)
    coordination = kubernetes.client.CoordinationV1Api(kube.api())
    custom = kubernetes.client.CustomObjectsApi(kube.api())
    supervisor = kube.cluster.supervisor

    def holder() -> str | None:
        try:
            return coordination.read_namespaced_lease(lease_name, namespace).spec.holder_identity
        except kubernetes.client.ApiException:
            return None

    def create_run(name: str) -> None:
        run = tiny_training(name)
        run["metadata"]["namespace"] = namespace
        kube.kubectl("apply", "-f", "-", input=json.dumps(run))

    def pytorchjob(name: str):
        try:
            return custom.get_namespaced_custom_object("kubeflow.org", "v1", namespace, "pytorchjobs", name)
        except kubernetes.client.ApiException:
            return None

    mark = kube.cluster.control_plane.audit_mark()
    try:
        _replicas(kube, release, namespace, holder, create_run, pytorchjob, mark)
    finally:
        for replica in ("a", "b"):
            supervisor.stop(f"{namespace}-{replica}", grace=1.0)
    # One transition (a → b); replica-b stopped gracefully (SIGTERM) gave the Lease up for the next replica.
    lease = coordination.read_namespaced_lease(lease_name, namespace)
    assert lease.spec.lease_transitions == 1 and lease.spec.holder_identity is None, lease.spec


def _replicas(kube: Kube, release, namespace: str, holder, create_run, pytorchjob, mark: int) -> None:
    supervisor = kube.cluster.supervisor
    first = start_operator(kube, release, f"{namespace}-a", {"POD_NAME": "replica-a"})
    eventually("replica-a leads", lambda: holder() == "replica-a")
    start_operator(kube, release, f"{namespace}-b", {"POD_NAME": "replica-b"})
    standby_log = supervisor.log(f"{namespace}-b")
    eventually("replica-b standing by", lambda: "standing by, replica-a leads" in standby_log.read_text())

    create_run("before")
    eventually("the leader's PyTorchJob", lambda: pytorchjob("before"))
    assert holder() == "replica-a"
    assert "Creation is processed" not in standby_log.read_text()  # the standby did nothing

    first.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    create_run("between")  # while nobody may lead
    eventually("replica-b leads", lambda: holder() == "replica-b", timeout=30)
    takeover_s = time.monotonic() - killed_at
    print(f"takeover after SIGKILL of the leader: {takeover_s:.1f} s")
    assert takeover_s < TAKEOVER_LIMIT_S, takeover_s
    eventually("the new leader's PyTorchJob", lambda: pytorchjob("between"))
    create_run("after")
    eventually("the PyTorchJob of a run made after the takeover", lambda: pytorchjob("after"))

    # Each run's job was created exactly once, though two operators saw the first run.
    created = [
        e
        for e in kube.cluster.control_plane.audit_events(mark)
        if e["verb"] == "create"
        and e.get("objectRef", {}).get("resource") == "pytorchjobs"
        and e.get("objectRef", {}).get("namespace") == namespace
        and e.get("responseStatus", {}).get("code") == 201
    ]
    assert len(created) == 3, [(e["objectRef"], e["responseStatus"]) for e in created]
