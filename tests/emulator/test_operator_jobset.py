"""The operator process (`atlas operator`) with the JobSet backend, against the emulated API (kmock).

No controller runs: the tests write each JobSet's status as the JobSet v0.12.0 controller would (through the status
subresource: conditions, restarts, terminalState, replicatedJobsStatus), the pods the Job controller would
leave, and a queued JobSet's spec.suspend as Kueue sets it (the real Kueue's admission and preemption are in
tests/kube/test_runs.py); assertions read the emulator's stored objects and its request log.
"""

from __future__ import annotations

import pytest
from atlas_operator.ticker import tick_line

from atlas_contract.results import parse_result_message, result_message
from harness.kube_emulator import JOBSET_RESOURCES, JOBSETS, PYTORCHJOBS
from harness.manifests import NS, teacher, training
from harness.polling import wait_for
from tests.support.jobset_world import (
    COMPLETION_INDEX,
    JOBSET_KEY,
    TRAINER_RUNNING,
    condition,
    ensure_pvc,
    set_jobset_status,
    trainer_pod,
    wait_jobset,
)
from tests.support.k8s_schemas import jobset_webhook_problems
from tests.support.operator_cluster import (
    KUEUE_QUEUE_LABEL,
    TIMEOUT,
    cleanup_runs,  # noqa: F401  (autouse: each test's runs deleted)
    own_cluster,
    wait_children,
)

pytestmark = pytest.mark.timeout(300)

OPERATOR = "atlas-operator/"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with own_cluster(tmp_path_factory.mktemp("jobset-cluster")) as shared:
        yield shared


# --------------------------------------------------------------------------- the operator's requests


def operator_writes(cluster, resource: str, name: str) -> list:
    """The operator's own writes of ``name`` (create, patch, delete)."""
    return [c for c in cluster.emu.writes(resource, name=name) if (c.user_agent or "").startswith(OPERATOR)]


def pod_reads(cluster, jobset: str) -> list:
    """The operator's requests for pods: none by name (the names of JobSet pods end in a random suffix), and the lists
    of JobSet ``jobset``'s pods."""
    return cluster.emu.calls(
        lambda c: (
            c.resource == "pods"
            and (c.user_agent or "").startswith(OPERATOR)
            and (
                c.name is not None or f"{JOBSET_KEY}jobset-name={jobset}" in c.query.get("labelSelector", "").split(",")
            )
        )
    )


def ticks(cluster, name: str) -> int:
    """How many status refreshes (timer passes) of run ``name`` the operator has logged."""
    return cluster.operator.output().count(tick_line(NS, name))


# --------------------------------------------------------------------------- tests


def test_a_jobset_run_is_one_jobset_beside_its_config_map_and_metrics_service(cluster):
    manifest = teacher("js-create", backend="JobSet")
    run = cluster.apply(manifest)
    js = wait_jobset(cluster, "js-create")
    config = cluster.emu.get("v1/configmaps", NS, "js-create-config")
    metrics = cluster.emu.get("v1/services", NS, "js-create-metrics")
    for obj in (js, config, metrics):
        (ref,) = obj["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "AtlasTeacher",
            "js-create",
            run["metadata"]["uid"],
            True,
        )
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert [r["name"] for r in js["spec"]["replicatedJobs"]] == ["rollout", "student", "trainer"]
    assert js["spec"]["suspend"] is False and KUEUE_QUEUE_LABEL not in js["metadata"]["labels"]
    assert jobset_webhook_problems(js) == []
    assert metrics["spec"]["selector"][COMPLETION_INDEX] == "0"  # the trainer's rank 0 serves the metrics
    status = cluster.wait_status(manifest, lambda s: s.get("children"), "status.children")
    assert status["children"] == {
        "jobSet": "js-create",
        "configMap": "js-create-config",
        "metricsService": "js-create-metrics",
        "networkPolicy": "js-create-network",
        "trainerNetworkPolicy": "js-create-network-trainer",
    }
    assert status["phase"] == "Pending"
    # The servers are the JobSet's replicated jobs: no Deployment, server Service or PyTorchJob, ever.
    for resource, name in (
        ("apps/v1/deployments", "js-create-rollout"),
        ("apps/v1/deployments", "js-create-student"),
        ("v1/services", "js-create-rollout"),
        ("v1/services", "js-create-student"),
        (PYTORCHJOBS, "js-create"),
    ):
        assert cluster.emu.get(resource, NS, name) is None
        assert not cluster.emu.writes(resource, name=name), f"{resource} {name} written"


def test_the_phase_follows_the_jobset_status(cluster):
    """What the JobSet controller reports, step by step: servers starting (Pending, naming the one not Ready),
    the trainer running, a whole-gang restart (still Running, reason Restarting, .status.restarts), completion;
    and another run failing on its last restart."""
    manifest = teacher("js-phase", backend="JobSet", maxRestarts=2)
    cluster.apply(manifest)
    wait_jobset(cluster, "js-phase")
    set_jobset_status(cluster, "js-phase", {"rollout": {"ready": 1, "active": 1}, "student": {"active": 1}})
    starting = "the trainer starts once the servers are Ready: student 0/1 ready"  # the rollout is Ready: not named
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "Training").get("message") == starting,
        "ServersStarting naming the student only",
    )
    training_condition = cluster.condition(manifest, "Training")
    assert training_condition["reason"] == "ServersStarting" and training_condition["status"] == "False"
    assert cluster.status(manifest)["phase"] == "Pending" and cluster.status(manifest)["restarts"] == 0
    rollout_ready = cluster.condition(manifest, "RolloutReady")
    assert (rollout_ready["status"], rollout_ready["message"]) == ("False", "student 0/1 ready")

    set_jobset_status(cluster, "js-phase", TRAINER_RUNNING)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    training_condition = cluster.condition(manifest, "Training")
    assert (training_condition["status"], training_condition["reason"]) == ("True", "Running")
    assert cluster.condition(manifest, "RolloutReady")["status"] == "True"

    # A server died: the controller restarts every Job (the new attempt's servers start again).
    restarting = condition(
        "RestartingJobSet",
        True,
        "DefaultFailurePolicy",
        "applying RestartJobSet failure policy action (first failed job: js-phase-rollout-0)",
    )
    set_jobset_status(
        cluster, "js-phase", {"rollout": {"active": 1}, "student": {"active": 1}}, [restarting], restarts=1
    )
    status = cluster.wait_status(manifest, lambda s: s.get("restarts") == 1, ".status.restarts 1")
    training_condition = cluster.condition(manifest, "Training")
    assert status["phase"] == "Running"
    assert (training_condition["status"], training_condition["reason"]) == ("True", "Restarting")
    assert "first failed job: js-phase-rollout-0" in training_condition["message"]
    assert "(restart 1 of 2)" in training_condition["message"]

    done = [
        condition("RestartingJobSet", False, "JobsReady", "all jobs are ready"),
        condition("Completed", True, "AllJobsCompleted", "jobset completed successfully"),
    ]
    set_jobset_status(cluster, "js-phase", {"trainer": {"succeeded": 1}}, done, restarts=1, terminal="Completed")
    status = cluster.wait_status(manifest, lambda s: s.get("phase") == "Succeeded", "Succeeded")
    assert status["restarts"] == 1
    assert cluster.condition(manifest, "Training")["reason"] == "AllJobsCompleted"
    assert cluster.condition(manifest, "RolloutReady")["reason"] == "Finished"  # the JobSet deleted its servers
    wait_for(
        lambda: {"Running", "Succeeded"} <= {e["reason"] for e in cluster.events("js-phase")},
        timeout=TIMEOUT,
        what="transition events",
    )

    failing = training("js-fail", backend="JobSet", maxRestarts=1)
    cluster.apply(failing)
    wait_jobset(cluster, "js-fail")
    reached = "jobset failed due to reaching max number of restarts (first failed job: js-fail-trainer-0)"
    failed = [
        condition("RestartingJobSet", False, "JobSetFailed", "jobset failed"),
        condition("Failed", True, "ReachedMaxRestarts", reached),
    ]
    set_jobset_status(cluster, "js-fail", {"rollout": {"ready": 1, "active": 1}}, failed, restarts=1, terminal="Failed")
    status = cluster.wait_status(failing, lambda s: s.get("phase") == "Failed", "Failed")
    assert status["restarts"] == 1
    training_condition = cluster.condition(failing, "Training")
    assert (training_condition["status"], training_condition["reason"]) == ("False", "ReachedMaxRestarts")
    assert training_condition["message"] == reached
    event = wait_for(
        lambda: next((e for e in cluster.events("js-fail") if e["reason"] == "Failed"), None),
        timeout=TIMEOUT,
        what="a Failed event",
    )
    assert event["type"] == "Warning" and event["message"] == reached


def test_the_result_is_read_from_the_rank0_trainer_pod_of_the_last_attempt(cluster):
    """The JobSet completed after one restart: .status.result is the termination message of its trainer pod of
    completion index 0 of restart attempt 1, found by listing pods by label (their names end in a random
    suffix) — not the pod of attempt 0, not the pod of index 1, not a pod of an earlier JobSet of that name."""
    manifest = training("js-result", backend="JobSet", maxRestarts=3)
    cluster.apply(manifest)
    js = wait_jobset(cluster, "js-result")
    # The decoys first: a list that ignored its selector or a check would find them before the right pod.
    earlier = trainer_pod(cluster, js, 0, 0, result_message(5, 0.1))
    other_set = trainer_pod(cluster, js, 0, 1, result_message(99, 0.9), uid="0f0f0f0f-earlier-jobset")
    rank1 = trainer_pod(cluster, js, 1, 1, result_message(12, 0.2))
    rank0 = trainer_pod(cluster, js, 0, 1, result_message(12, 0.75))
    set_jobset_status(cluster, "js-result", TRAINER_RUNNING, restarts=1)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    assert not pod_reads(cluster, "js-result")  # only once the JobSet has succeeded
    done = [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
    set_jobset_status(cluster, "js-result", {"trainer": {"succeeded": 1}}, done, restarts=1, terminal="Completed")
    status = cluster.wait_status(manifest, lambda s: "result" in s, ".status.result")
    assert status["phase"] == "Succeeded"
    assert status["result"] == parse_result_message(result_message(12, 0.75)) == {"step": 12, "reward": 0.75}
    reads = pod_reads(cluster, "js-result")
    assert reads and {(c.verb, c.name) for c in reads} == {("list", None)}  # never a pod by name
    selector = set(reads[0].query["labelSelector"].split(","))
    assert {
        "jobset.sigs.k8s.io/jobset-name=js-result",
        "jobset.sigs.k8s.io/replicatedjob-name=trainer",
        "jobset.sigs.k8s.io/restart-attempt=1",
    } <= selector
    assert {earlier, other_set, rank1, rank0} <= {p["metadata"]["name"] for p in cluster.emu.list("v1/pods", NS)}


def test_a_queued_jobset_is_kueues_to_suspend_and_resume(cluster):
    """spec.queueName: the JobSet is created suspended with Kueue's queue label (phase Queued), and the operator
    never writes its suspend again: Kueue admits it (unsuspends it), and the run follows it to Running. spec.suspend
    on such a run with a checkpoint volume deletes the JobSet (releasing the quota) and creates nothing while
    suspended; resuming queues a new one."""
    ensure_pvc(cluster, "js-ckpt")
    manifest = teacher("js-queued", backend="JobSet", queueName="team-a-queue", checkpoint={"pvc": "js-ckpt"})
    cluster.apply(manifest)
    js = wait_jobset(cluster, "js-queued")
    assert js["spec"]["suspend"] is True and js["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a-queue"
    for rjob in js["spec"]["replicatedJobs"]:  # the whole set is one workload: no pod carries a queue of its own
        assert KUEUE_QUEUE_LABEL not in rjob["template"]["spec"]["template"]["metadata"]["labels"]
    suspended = condition("Suspended", True, "SuspendedJobs", "jobset is suspended")
    set_jobset_status(cluster, "js-queued", {"rollout": {"suspended": 1}, "student": {"suspended": 1}}, [suspended])
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued")

    # Kueue admits it: spec.suspend false (the real Kueue's admission: tests/kube/test_runs.py)
    cluster.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "js-queued", {"spec": {"suspend": False}}
    )
    resumed = condition("Suspended", False, "ResumeJobs", "jobset is resumed")
    set_jobset_status(cluster, "js-queued", TRAINER_RUNNING, [resumed])
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running once admitted")
    wait_for(lambda: ticks(cluster, "js-queued") >= 2, timeout=TIMEOUT, what="status refreshes after admission")
    admitted = cluster.emu.get(JOBSETS, NS, "js-queued")
    assert admitted["spec"]["suspend"] is False  # Kueue's, left alone
    writes = operator_writes(cluster, JOBSETS, "js-queued")
    assert [c.verb for c in writes] == ["create"], [(c.verb, c.body) for c in writes]

    cluster.patch_spec(manifest, {"suspend": True})
    wait_for(lambda: cluster.emu.get(JOBSETS, NS, "js-queued") is None, timeout=TIMEOUT, what="the JobSet deleted")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Suspended", "Suspended")
    wait_for(
        lambda: any(e["reason"] == "QueuedRunSuspended" for e in cluster.events("js-queued")),
        timeout=TIMEOUT,
        what="a QueuedRunSuspended event",
    )
    seen = ticks(cluster, "js-queued")
    wait_for(lambda: ticks(cluster, "js-queued") >= seen + 2, timeout=TIMEOUT, what="status refreshes while suspended")
    assert cluster.emu.get(JOBSETS, NS, "js-queued") is None  # nothing recreated while suspended
    assert cluster.status(manifest)["phase"] == "Suspended"
    training_condition = cluster.condition(manifest, "Training")
    assert (training_condition["reason"], training_condition["status"]) == ("Suspended", "False")
    assert "no JobSet while suspended" in training_condition["message"]
    assert [c.verb for c in operator_writes(cluster, JOBSETS, "js-queued")] == ["create", "delete"]

    cluster.patch_spec(manifest, {"suspend": False})
    again = wait_jobset(cluster, "js-queued", other_than=js["metadata"]["uid"])
    assert again["spec"]["suspend"] is True and again["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-a-queue"
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued again")
    # Never a write of spec.suspend (nor of anything in the spec) after a create: Kueue's alone.
    assert [c.verb for c in operator_writes(cluster, JOBSETS, "js-queued")] == ["create", "delete", "create"]


def test_a_queued_jobset_without_a_checkpoint_volume_is_not_suspended(cluster):
    """Suspending a queued run means deleting its JobSet (Kueue owns its suspend): without spec.checkpoint.pvc that
    would lose all progress, so the JobSet keeps running, untouched, and SpecApplied says why."""
    manifest = training("js-queued-nockpt", backend="JobSet", queueName="team-a-queue")
    cluster.apply(manifest)
    js = wait_jobset(cluster, "js-queued-nockpt")
    # Kueue admits it: spec.suspend false (the real Kueue's admission: tests/kube/test_runs.py)
    cluster.custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "js-queued-nockpt", {"spec": {"suspend": False}}
    )
    set_jobset_status(cluster, "js-queued-nockpt", TRAINER_RUNNING)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running once admitted")
    cluster.patch_spec(manifest, {"suspend": True})
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "SpecApplied").get("reason") == "SuspendNeedsCheckpoint",
        "SpecApplied SuspendNeedsCheckpoint",
    )
    applied = cluster.condition(manifest, "SpecApplied")
    assert applied["status"] == "False" and "JobSet js-queued-nockpt" in applied["message"]
    assert "spec.checkpoint.pvc" in applied["message"]
    assert cluster.status(manifest)["phase"] == "Running"
    current = cluster.emu.get(JOBSETS, NS, "js-queued-nockpt")
    assert current["metadata"]["uid"] == js["metadata"]["uid"] and current["spec"]["suspend"] is False
    assert [c.verb for c in operator_writes(cluster, JOBSETS, "js-queued-nockpt")] == ["create"]


def test_suspending_an_unqueued_jobset_run_patches_its_suspend(cluster):
    manifest = training("js-suspend", backend="JobSet")
    cluster.apply(manifest)
    js = wait_jobset(cluster, "js-suspend")
    set_jobset_status(cluster, "js-suspend", TRAINER_RUNNING)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    cluster.patch_spec(manifest, {"suspend": True})
    wait_for(
        lambda: cluster.emu.get(JOBSETS, NS, "js-suspend")["spec"]["suspend"] is True,
        timeout=TIMEOUT,
        what="the JobSet suspended",
    )
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Suspended", "Suspended")
    suspended = condition("Suspended", True, "SuspendedJobs", "jobset is suspended")
    set_jobset_status(cluster, "js-suspend", {"rollout": {"suspended": 1}, "trainer": {"suspended": 1}}, [suspended])
    cluster.patch_spec(manifest, {"suspend": False})
    wait_for(
        lambda: cluster.emu.get(JOBSETS, NS, "js-suspend")["spec"]["suspend"] is False,
        timeout=TIMEOUT,
        what="the JobSet resumed",
    )
    resumed = condition("Suspended", False, "ResumeJobs", "jobset is resumed")
    set_jobset_status(cluster, "js-suspend", TRAINER_RUNNING, [resumed])
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running again")
    current = cluster.emu.get(JOBSETS, NS, "js-suspend")
    assert current["metadata"]["uid"] == js["metadata"]["uid"]  # patched in place, not recreated
    # Only the suspend flag is ever patched (a reconciliation racing another may send the same patch twice).
    patches = [c.body for c in operator_writes(cluster, JOBSETS, "js-suspend") if c.verb == "patch"]
    distinct = [body for i, body in enumerate(patches) if i == 0 or body != patches[i - 1]]
    assert distinct == [{"spec": {"suspend": True}}, {"spec": {"suspend": False}}]


def test_switching_the_backend_to_jobset_replaces_the_pytorchjob_and_servers(cluster):
    ensure_pvc(cluster, "js-ckpt")
    manifest = teacher("js-switch", checkpoint={"pvc": "js-ckpt"})
    cluster.apply(manifest)
    before = wait_children(cluster, "js-switch")
    cluster.set_job_conditions("js-switch", "Created", "Running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running on the PyTorchJob")
    cluster.patch_spec(manifest, {"backend": "JobSet"})
    wait_jobset(cluster, "js-switch")
    gone = (
        (PYTORCHJOBS, "js-switch"),
        ("apps/v1/deployments", "js-switch-rollout"),
        ("apps/v1/deployments", "js-switch-student"),
        ("v1/services", "js-switch-rollout"),
        ("v1/services", "js-switch-student"),
    )
    wait_for(
        lambda: not any(cluster.emu.get(r, NS, n) for r, n in gone),
        timeout=TIMEOUT,
        what="the PyTorchJob and the server Deployments and Services deleted",
    )
    status = cluster.wait_status(manifest, lambda s: "jobSet" in (s.get("children") or {}), "children: the JobSet")
    assert status["children"] == {
        "jobSet": "js-switch",
        "configMap": "js-switch-config",
        "metricsService": "js-switch-metrics",
        "networkPolicy": "js-switch-network",
        "trainerNetworkPolicy": "js-switch-network-trainer",
    }
    changed = wait_for(
        lambda: [e for e in cluster.events("js-switch") if e["reason"] == "BackendChanged"],
        timeout=TIMEOUT,
        what="BackendChanged events",
    )
    assert any("PyTorchJob/js-switch" in e["message"] and "JobSet" in e["message"] for e in changed)
    # The ConfigMap and metrics Service stay (patched); the Service now selects the JobSet trainer's rank 0 only.
    metrics = cluster.emu.get("v1/services", NS, "js-switch-metrics")
    assert metrics["metadata"]["uid"] == before["metrics"]["metadata"]["uid"]
    assert metrics["spec"]["selector"] == {
        "app.kubernetes.io/instance": "js-switch",
        "app.kubernetes.io/component": "trainer",
        COMPLETION_INDEX: "0",
    }
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending on the JobSet")

    # And back: the JobSet goes, the PyTorchJob and the servers come again, the Service selects the Master.
    cluster.patch_spec(manifest, {"backend": "PyTorchJob"})
    wait_children(cluster, "js-switch")
    wait_for(lambda: cluster.emu.get(JOBSETS, NS, "js-switch") is None, timeout=TIMEOUT, what="the JobSet deleted")
    wait_for(
        lambda: any("JobSet/js-switch" in e["message"] for e in cluster.events("js-switch")),
        timeout=TIMEOUT,
        what="a BackendChanged event for the JobSet",
    )
    status = cluster.wait_status(manifest, lambda s: "pytorchJob" in (s.get("children") or {}), "the PyTorchJob")
    assert set(status["children"]) == {
        "pytorchJob",
        "configMap",
        "metricsService",
        "rollout",
        "student",
        "networkPolicy",
        "trainerNetworkPolicy",
    }
    assert cluster.emu.get("v1/services", NS, "js-switch-metrics")["spec"]["selector"] == {
        "app.kubernetes.io/instance": "js-switch",
        "app.kubernetes.io/component": "trainer",
        "training.kubeflow.org/replica-type": "master",
    }
    assert [c.verb for c in operator_writes(cluster, JOBSETS, "js-switch")] == ["create", "delete"]


def test_a_spec_change_recreates_the_jobset_only_with_a_checkpoint_volume(cluster):
    ensure_pvc(cluster, "js-ckpt")
    changed = {"training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 20}}
    kept, recreated = training("js-nockpt", backend="JobSet"), training("js-ckpt", backend="JobSet")
    recreated["spec"]["checkpoint"] = {"pvc": "js-ckpt"}
    uids = {}
    for manifest in (kept, recreated):
        cluster.apply(manifest)
        uids[manifest["metadata"]["name"]] = wait_jobset(cluster, manifest["metadata"]["name"])["metadata"]["uid"]
        set_jobset_status(cluster, manifest["metadata"]["name"], TRAINER_RUNNING)
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
        cluster.patch_spec(manifest, changed)
    new = wait_jobset(cluster, "js-ckpt", other_than=uids["js-ckpt"])
    assert "max_steps: 20" in cluster.emu.get("v1/configmaps", NS, "js-ckpt-config")["data"]["run.yaml"]
    assert new["spec"]["suspend"] is False
    wait_for(lambda: any(e["reason"] == "JobRecreated" for e in cluster.events("js-ckpt")), timeout=TIMEOUT)
    cluster.wait_status(recreated, lambda s: s.get("phase") == "Pending", "Pending on the new JobSet")

    cluster.wait_status(
        kept, lambda s: cluster.condition(kept, "SpecApplied").get("status") == "False", "SpecApplied False"
    )
    applied = cluster.condition(kept, "SpecApplied")
    assert applied["reason"] == "RestartNeedsCheckpoint" and "JobSet js-nockpt" in applied["message"]
    assert cluster.emu.get(JOBSETS, NS, "js-nockpt")["metadata"]["uid"] == uids["js-nockpt"]
    assert cluster.status(kept)["phase"] == "Running"


# --------------------------------------------------------------------------- clusters of their own


def test_missing_jobset_crd_is_a_condition_and_pytorchjob_runs_still_work(tmp_path):
    with own_cluster(tmp_path, jobsets=False) as cluster:
        first, second = training("nojs-1", backend="JobSet"), teacher("nojs-2", backend="JobSet")
        plain = training("nojs-pytorch")
        for manifest in (first, second, plain):
            cluster.apply(manifest)
        for manifest in (first, second):
            cluster.wait_status(
                manifest,
                lambda s, m=manifest: cluster.condition(m, "PrerequisitesMet").get("reason") == "JobSetCRDMissing",
                "JobSetCRDMissing",
            )
            message = cluster.condition(manifest, "PrerequisitesMet")["message"]
            assert "jobset.x-k8s.io/v1alpha2 JobSet CRD" in message
            assert "kubectl apply --server-side" in message and "jobset/releases/download/v0.12.0" in message
            assert "spec.backend: PyTorchJob" in message  # the other way out
            status = cluster.status(manifest)
            assert status["phase"] == "Pending" and "children" not in status
            name = manifest["metadata"]["name"]
            assert not cluster.emu.writes("v1/configmaps", name=f"{name}-config")
            assert not cluster.emu.writes("v1/services", name=f"{name}-metrics")
        wait_children(cluster, "nojs-pytorch", teacher_run=False)
        cluster.wait_status(plain, lambda s: s.get("phase") == "Pending" and s.get("children"), "the PyTorchJob run")
        assert cluster.condition(plain, "PrerequisitesMet")["status"] == "True"
        cluster.set_job_conditions("nojs-pytorch", "Created", "Running")
        cluster.wait_status(plain, lambda s: s.get("phase") == "Running", "Running")
        assert cluster.operator.alive()
        # The informer holds no JobSet while none can exist, says so once, and does not retry in a loop.
        output = cluster.operator.output()
        assert output.count("not watching jobsets") <= 1 and "failed; listing again" not in output
        # JobSet installed now: the next status refresh finds it and the waiting runs get their JobSets.
        cluster.emu.declare({JOBSETS: JOBSET_RESOURCES[JOBSETS]})
        for manifest in (first, second):
            wait_jobset(cluster, manifest["metadata"]["name"])
            cluster.wait_status(
                manifest,
                lambda s, m=manifest: cluster.condition(m, "PrerequisitesMet").get("status") == "True",
                "PrerequisitesMet once JobSet is installed",
            )


def test_the_operators_default_backend_applies_to_runs_that_name_none(tmp_path):
    with own_cluster(tmp_path, operator_env={"ATLAS_DEFAULT_BACKEND": "JobSet"}) as cluster:
        unset, pinned = training("default-js"), training("pinned-pt", backend="PyTorchJob")
        for manifest in (unset, pinned):
            cluster.apply(manifest)
        wait_jobset(cluster, "default-js")
        status = cluster.wait_status(unset, lambda s: s.get("children"), "status.children")
        assert set(status["children"]) == {
            "jobSet",
            "configMap",
            "metricsService",
            "networkPolicy",
            "trainerNetworkPolicy",
        }
        assert "backend" not in cluster.run(unset)["spec"]  # a setting of the operator, not written into the run
        assert cluster.emu.get(PYTORCHJOBS, NS, "default-js") is None
        wait_children(cluster, "pinned-pt", teacher_run=False)  # spec.backend wins over the default
        assert cluster.emu.get(JOBSETS, NS, "pinned-pt") is None


def test_run_phase_follows_its_jobset_without_waiting_for_the_timer(tmp_path):
    """The operator watches JobSets: a status change shows on the run long before the next status refresh (set
    to 10 minutes here)."""
    with own_cluster(tmp_path, operator_env={"ATLAS_PROGRESS_INTERVAL": "600"}) as cluster:
        manifest = training("js-watch", backend="JobSet")
        cluster.apply(manifest)
        wait_jobset(cluster, "js-watch")
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")
        done = [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
        for jobs, conditions, terminal, phase in (
            (TRAINER_RUNNING, [], None, "Running"),
            ({"trainer": {"succeeded": 1}}, done, "Completed", "Succeeded"),
        ):
            set_jobset_status(cluster, "js-watch", jobs, conditions, terminal=terminal)
            cluster.wait_status(manifest, lambda s, p=phase: s.get("phase") == p, phase, timeout=10)
        assert ticks(cluster, "js-watch") == 0


def test_a_running_run_without_a_checkpoint_volume_keeps_its_backend(cluster):
    """spec.backend moved while the PyTorchJob trains and there is no spec.checkpoint.pvc: a JobSet would start
    from step 0, so the run keeps its job and SpecApplied says why; once the job has finished, the move happens."""
    manifest = training("js-stay")
    cluster.apply(manifest)
    wait_children(cluster, "js-stay", teacher_run=False)
    cluster.set_job_conditions("js-stay", "Created", "Running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running on the PyTorchJob")
    cluster.patch_spec(manifest, {"backend": "JobSet"})
    status = cluster.wait_status(
        manifest,
        lambda s: any(c.get("reason") == "BackendChangeNeedsCheckpoint" for c in s.get("conditions") or []),
        "SpecApplied=False BackendChangeNeedsCheckpoint",
    )
    applied = next(c for c in status["conditions"] if c["type"] == "SpecApplied")
    assert applied["status"] == "False" and "spec.checkpoint.pvc" in applied["message"]
    assert status["phase"] == "Running" and "pytorchJob" in status["children"]
    assert cluster.emu.get(JOBSETS, NS, "js-stay") is None
    assert [c.verb for c in operator_writes(cluster, PYTORCHJOBS, "js-stay")] == ["create"]
    cluster.set_job_conditions("js-stay", "Created", "Running", "Succeeded")
    wait_jobset(cluster, "js-stay")  # finished: nothing to lose, the run moves
    wait_for(lambda: cluster.emu.get(PYTORCHJOBS, NS, "js-stay") is None, timeout=TIMEOUT, what="the PyTorchJob gone")


def test_a_run_keeps_its_backend_when_the_operators_default_changes(tmp_path):
    """The default applies to runs when they are made: an operator restarted with ATLAS_DEFAULT_BACKEND=JobSet
    leaves a run that started on PyTorchJob there (moving it would restart its training), and new runs get JobSet."""

    with own_cluster(tmp_path) as cluster:
        old = training("before-change")
        cluster.apply(old)
        wait_children(cluster, "before-change", teacher_run=False)
        cluster.wait_status(old, lambda s: "pytorchJob" in (s.get("children") or {}), "children: the PyTorchJob")
        cluster.restart_operator(tmp_path / "operator-2.log", ATLAS_DEFAULT_BACKEND="JobSet")
        new = training("after-change")
        cluster.apply(new)
        wait_jobset(cluster, "after-change")
        # The restarted operator has reconciled the old run too (its timer, every second): still a PyTorchJob.
        wait_for(lambda: ticks(cluster, "before-change") >= 3, timeout=TIMEOUT, what="refreshes of the old run")
        assert cluster.emu.get(JOBSETS, NS, "before-change") is None
        assert cluster.emu.get(PYTORCHJOBS, NS, "before-change") is not None
        assert "pytorchJob" in cluster.status(old)["children"]
