"""The operator process (`atlas operator`) with the TrainJob backend (Kubeflow Trainer v2), against the emulated API.

No controller runs: the tests write by hand what the Trainer and JobSet controllers would
(tests/support/jobset_world.py: the chart's runtime, the Trainer's JobSet, the TrainJob's and the JobSet's statuses;
the real controllers run in tests/kube/test_runs.py); assertions read the emulator's stored objects and its request
log.
"""

from __future__ import annotations

import pytest

from harness.kube_emulator import JOBSETS, TRAINER_RESOURCES, TRAINJOBS
from harness.manifests import NS, teacher, training
from harness.polling import wait_for
from tests.support.jobset_world import (
    condition,
    create_trainer_jobset,
    ensure_pvc,
    install_trainjob_runtime,
    set_jobset_status,
    set_trainjob_status,
    trainer_pod,
)
from tests.support.operator_cluster import TIMEOUT, own_cluster, wait_children

pytestmark = pytest.mark.timeout(300)

OPERATOR = "atlas-operator/"


def wait_trainjob(cluster, name: str, other_than: str | None = None) -> dict:
    return wait_for(
        lambda: (tj := cluster.emu.get(TRAINJOBS, NS, name)) is not None and tj["metadata"]["uid"] != other_than and tj,
        timeout=TIMEOUT,
        what=f"TrainJob {name}" + (" recreated" if other_than else ""),
    )


def prerequisite(cluster, manifest) -> dict:
    return cluster.condition(manifest, "PrerequisitesMet")


def test_without_the_trainer_or_its_runtime_a_trainjob_run_waits_naming_what_to_install(tmp_path):
    with own_cluster(tmp_path, trainer=False) as cluster:
        run, plain = training("notrainer", backend="TrainJob"), training("notrainer-pytorch")
        cluster.apply(run)
        cluster.apply(plain)
        cluster.wait_status(run, lambda s: prerequisite(cluster, run).get("reason") == "TrainJobCRDMissing", "no CRD")
        message = prerequisite(cluster, run)["message"]
        assert "trainer.kubeflow.org/v1alpha1 TrainJob CRD" in message and "kubeflow/trainer" in message
        assert "children" not in cluster.status(run) and not cluster.emu.writes(
            "v1/configmaps", name="notrainer-config"
        )
        wait_children(cluster, "notrainer-pytorch", teacher_run=False)  # the other backends keep working
        # The Trainer installed, but not the chart's runtime: still nothing, and the message says which runtime.
        cluster.emu.declare(TRAINER_RESOURCES)
        cluster.wait_status(
            run, lambda s: prerequisite(cluster, run).get("reason") == "TrainingRuntimeMissing", "no runtime"
        )
        message = prerequisite(cluster, run)["message"]
        assert "ClusterTrainingRuntime atlas-grpo" in message and "trainJob.runtime.enabled" in message
        assert cluster.emu.get(TRAINJOBS, NS, "notrainer") is None
        # A runtime whose restarts differ from the run's: refused, naming both numbers and the chart value.
        runtime = install_trainjob_runtime(cluster, max_restarts=5)
        cluster.wait_status(
            run, lambda s: prerequisite(cluster, run).get("reason") == "MaxRestartsNotTheRuntimes", "restarts differ"
        )
        message = prerequisite(cluster, run)["message"]
        assert "spec.maxRestarts: 3" in message and "maxRestarts: 5" in message and "set spec.maxRestarts: 5" in message
        assert cluster.emu.get(TRAINJOBS, NS, "notrainer") is None
        cluster.patch_spec(run, {"maxRestarts": 5})
        tj = wait_trainjob(cluster, "notrainer")
        assert tj["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
        cluster.wait_status(run, lambda s: prerequisite(cluster, run).get("status") == "True", "PrerequisitesMet")


def test_the_phase_restarts_and_result_follow_the_trainjob_and_the_trainers_jobset(tmp_path):
    """Running from the Trainer's JobSet (the TrainJob has no condition while it runs), restarts from that JobSet,
    Succeeded with the Trainer's reason, the result from the rank-0 pod of the JobSet's node job. The operator writes
    only its TrainJob, never the Trainer's JobSet."""
    from atlas_contract.results import result_message

    with own_cluster(tmp_path) as cluster:
        runtime = install_trainjob_runtime(cluster)
        ensure_pvc(cluster, "ckpt")
        manifest = teacher("tj-phase", backend="TrainJob", checkpoint={"pvc": "ckpt"})
        cluster.apply(manifest)
        tj = wait_trainjob(cluster, "tj-phase")
        for server in ("tj-phase-rollout", "tj-phase-student"):  # the servers beside the TrainJob
            wait_for(lambda s=server: cluster.emu.get("apps/v1/deployments", NS, s), timeout=TIMEOUT, what=server)
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")
        js = create_trainer_jobset(cluster, tj, runtime)
        set_jobset_status(cluster, "tj-phase", {"node": {"active": 2}})
        set_trainjob_status(cluster, "tj-phase", jobs={"node": {"active": 2}})  # no condition while it runs
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
        restarting = [condition("RestartingJobSet", True, "FailedJobs", "jobset restarting")]
        set_jobset_status(cluster, "tj-phase", {"node": {"active": 2}}, restarting, restarts=1)
        cluster.wait_status(manifest, lambda s: s.get("restarts") == 1, ".status.restarts from the Trainer's JobSet")
        trainer_pod(cluster, js, 0, 1, result_message(42, 0.75))
        done = [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
        set_jobset_status(cluster, "tj-phase", {"node": {"succeeded": 1}}, done, restarts=1, terminal="Completed")
        complete = condition("Complete", True, "AllJobsCompleted", "jobset completed successfully")  # the JobSet's
        set_trainjob_status(cluster, "tj-phase", [complete], jobs={"node": {"succeeded": 1}})
        status = cluster.wait_status(manifest, lambda s: s.get("result"), "the result")
        assert status["phase"] == "Succeeded" and status["result"] == {"step": 42, "reward": 0.75}
        training_condition = cluster.condition(manifest, "Training")
        assert training_condition["reason"] == "AllJobsCompleted", training_condition
        assert not [
            c for c in cluster.emu.writes(JOBSETS, name="tj-phase") if (c.user_agent or "").startswith(OPERATOR)
        ]


def test_a_failed_trainjob_fails_the_run_in_the_trainers_words(tmp_path):
    with own_cluster(tmp_path) as cluster:
        runtime = install_trainjob_runtime(cluster)
        manifest = training("tj-fail", backend="TrainJob")
        cluster.apply(manifest)
        tj = wait_trainjob(cluster, "tj-fail")
        create_trainer_jobset(cluster, tj, runtime)
        failed = [
            condition("Failed", True, "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
        ]
        set_jobset_status(cluster, "tj-fail", {"node": {"failed": 1}}, failed, restarts=3, terminal="Failed")
        set_trainjob_status(cluster, "tj-fail", failed, jobs={"node": {"failed": 1}})  # the JobSet's Failed
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Failed", "Failed")
        training_condition = cluster.condition(manifest, "Training")
        assert (
            training_condition["reason"] == "ReachedMaxRestarts"
            and "max number of restarts" in training_condition["message"]
        )
        assert cluster.status(manifest)["restarts"] == 3


def test_a_queued_trainjob_is_created_suspended_and_shows_queued(tmp_path):
    with own_cluster(tmp_path) as cluster:
        install_trainjob_runtime(cluster)
        manifest = training("tj-queued", backend="TrainJob", queueName="team-a")
        cluster.apply(manifest)
        tj = wait_trainjob(cluster, "tj-queued")
        assert tj["spec"]["suspend"] is True and tj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        suspended = condition("Suspended", True, "Suspended", "TrainJob is suspended")  # in the Trainer's words
        set_trainjob_status(cluster, "tj-queued", [suspended])
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Queued", "Queued")
        # Kueue admits it: spec.suspend false (the real Kueue's admission: tests/kube/test_runs.py)
        admitted = cluster.custom.patch_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", "tj-queued", {"spec": {"suspend": False}}
        )
        set_trainjob_status(cluster, "tj-queued", [condition("Suspended", False, "Resumed", "TrainJob is resumed")])
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending once admitted")
        # The operator leaves the admitted TrainJob's spec alone (a queued job's suspend is Kueue's): no write after
        # its create.
        wait_for(lambda: cluster.status(manifest).get("phase") == "Pending", timeout=TIMEOUT)
        assert cluster.emu.get(TRAINJOBS, NS, "tj-queued")["spec"] == admitted["spec"]
        writes = [
            c for c in cluster.emu.writes(TRAINJOBS, name="tj-queued") if (c.user_agent or "").startswith(OPERATOR)
        ]
        assert [c.verb for c in writes] == ["create"], [(c.verb, c.body) for c in writes]


def test_a_spec_change_recreates_the_trainjob_with_a_checkpoint_volume(tmp_path):
    """The TrainJob's trainer is immutable (its CRD's CEL): a changed run is a new TrainJob, resuming from the PVC."""
    with own_cluster(tmp_path) as cluster:
        install_trainjob_runtime(cluster)
        ensure_pvc(cluster, "ckpt")
        manifest = training("tj-change", backend="TrainJob", checkpoint={"pvc": "ckpt"})
        cluster.apply(manifest)
        before = wait_trainjob(cluster, "tj-change")
        cluster.patch_spec(manifest, {"resources": {"nodes": 4, "gpusPerNode": 8}})
        after = wait_trainjob(cluster, "tj-change", other_than=before["metadata"]["uid"])
        assert after["spec"]["trainer"]["numNodes"] == 4
        # The Event is posted after the new TrainJob's create: wait for it, not for the job alone.
        events = wait_for(
            lambda: [e for e in cluster.events("tj-change") if e["reason"] == "JobRecreated"],
            timeout=TIMEOUT,
            what="the JobRecreated Event",
        )
        assert "TrainJob tj-change" in events[0]["message"], events
