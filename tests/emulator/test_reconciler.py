"""The Reconciler in this process, with the operator's own API client on the API emulator (no kopf, no operator
process; tests.support.reconciler): the owner of what it creates, the default backend, stuck pods, drift of a
NetworkPolicy, and the run's result read from the finished Master pod's termination message."""

from __future__ import annotations

import copy
import json

import jsonschema
import kopf
import pytest
from atlas_operator.config import OperatorConfig
from atlas_operator.crd import custom_resource_definition
from atlas_operator.status_update import status_update

from harness.kube_emulator import JOBSETS, NETWORK_POLICIES, PYTORCHJOBS
from harness.manifests import NS, teacher, training
from tests.support.reconciler import ReconcilerCluster, ResultCluster


@pytest.fixture
def cluster():
    with ReconcilerCluster() as own:
        yield own


def test_jobset_is_owned_by_the_run_like_the_pytorchjob():
    """Through the reconciler (kopf's adopt, as the handlers pass it): the JobSet gets the run as its controller
    owner, as the PyTorchJob does; the operator's default backend applies to a run without spec.backend, and
    spec.backend wins over it."""

    def reconciled(manifest, default_backend):
        with ReconcilerCluster() as cluster:
            body = copy.deepcopy(manifest)
            body["metadata"]["uid"] = "run-uid"
            reconciler = cluster.reconciler(OperatorConfig(default_backend=default_backend))
            result = reconciler.reconcile(body, kopf.adopt)
            return (
                cluster.stored(),
                {key: cluster.emu.get(key, NS, "teacher-run") for key in (JOBSETS, PYTORCHJOBS)},
                result,
            )

    stored, jobs, result = reconciled(teacher(), "JobSet")
    assert {plural for plural, _, _ in stored} == {"networkpolicies", "configmaps", "services", "jobsets"}
    assert [name for plural, _, name in stored if plural == "services"] == ["teacher-run-metrics"]
    assert result.children == {
        "jobSet": "teacher-run",
        "configMap": "teacher-run-config",
        "metricsService": "teacher-run-metrics",
        "networkPolicy": "teacher-run-network",
        "trainerNetworkPolicy": "teacher-run-network-trainer",
    }
    js = jobs[JOBSETS]
    assert js["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "atlas.arc.computer/v1alpha1",
            "kind": "AtlasTeacher",
            "name": "teacher-run",
            "uid": "run-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert js["metadata"]["labels"]["app.kubernetes.io/instance"] == "teacher-run"
    pytorch_stored, pytorch_jobs, _ = reconciled(teacher(backend="PyTorchJob"), "JobSet")  # spec.backend wins
    assert not any(plural == "jobsets" for plural, _, _ in pytorch_stored)
    job = pytorch_jobs[PYTORCHJOBS]
    assert job["metadata"]["ownerReferences"] == js["metadata"]["ownerReferences"]
    default_stored, _, _ = reconciled(teacher(), "PyTorchJob")
    assert ("pytorchjobs", NS, "teacher-run") in default_stored


def test_a_stuck_pod_is_its_runs_condition_and_event_once(cluster):
    """The pod watch's bookkeeping (Reconciler.pod_changed, pods_condition): a container the kubelet keeps waiting
    (init containers too) makes PodsStarted False with its reason and message; a pod that starts or goes clears
    it; only a change asks for a refresh, and only for a run this process has reconciled (its kind is known)."""
    reconciler = cluster.reconciler()
    labels = {"app.kubernetes.io/instance": "stuck-run", "app.kubernetes.io/managed-by": "atlas-operator"}

    def pod(name, state, init=False):
        statuses = [{"name": "pytorch", "state": state}]
        key = "initContainerStatuses" if init else "containerStatuses"
        return {"metadata": {"name": name, "namespace": NS, "labels": labels}, "status": {key: statuses}}

    backoff = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}
    creating = {"waiting": {"reason": "ContainerCreating"}}  # passes by itself: not stuck
    assert reconciler.pod_changed(pod("stuck-run-master-0", backoff)) is None  # run not reconciled here yet
    body = training("stuck-run")
    body["metadata"]["uid"] = "uid-stuck"
    result = reconciler.reconcile(body, kopf.adopt)
    (started,) = [c for c in result.conditions if c["type"] == "PodsStarted"]
    assert (started["status"], started["reason"]) == ("False", "ImagePullBackOff")
    assert (
        'pod stuck-run-master-0, container pytorch: ImagePullBackOff: Back-off pulling image "x"' in started["message"]
    )
    assert "ImagePullBackOff" in [e.reason for e in result.events if e.type == "Warning"]
    patch, events = status_update({}, 1, result, "t0")
    assert "ImagePullBackOff" in [e.reason for e in events]
    again = reconciler.reconcile(body, kopf.adopt)
    assert "ImagePullBackOff" not in [e.reason for e in status_update(patch, 1, again, "t1")[1]]  # said once
    assert reconciler.pod_changed(pod("stuck-run-master-0", backoff)) is None  # no news
    assert reconciler.pod_changed(pod("stuck-run-worker-0", backoff, init=True)) == ("AtlasTraining", "stuck-run")
    (started,) = [c for c in reconciler.reconcile(body, kopf.adopt).conditions if c["type"] == "PodsStarted"]
    assert started["message"].endswith("(1 more pods stuck)")
    assert reconciler.pod_changed(pod("stuck-run-worker-0", creating)) == ("AtlasTraining", "stuck-run")
    assert reconciler.pod_changed(pod("stuck-run-master-0", backoff), deleted=True) == ("AtlasTraining", "stuck-run")
    (started,) = [c for c in reconciler.reconcile(body, kopf.adopt).conditions if c["type"] == "PodsStarted"]
    assert (started["status"], started["reason"]) == ("True", "NoneStuck")
    assert cluster.operator_calls()  # the reconciler did talk to the API server ...
    assert not [c for c in cluster.operator_calls() if c.resource in ("pods", "secrets")]  # ... never of pods


def test_a_narrowed_network_policy_is_put_back_exactly(cluster):
    """A key added to a run's NetworkPolicy (a matchLabels entry that selects no pod would leave the run open) is
    drift: the patch removes it; an unchanged policy is not patched."""
    reconciler = cluster.reconciler()
    body = training("narrowed-run")
    body["metadata"]["uid"] = "uid-narrowed"
    reconciler.reconcile(body, kopf.adopt)
    name = "narrowed-run-network"
    policy = cluster.emu.get(NETWORK_POLICIES, NS, name)
    rendered = copy.deepcopy(policy["spec"])
    policy["spec"]["podSelector"]["matchLabels"]["nothing"] = "selected"
    policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"] = []
    cluster.networking.replace_namespaced_network_policy(name, NS, policy)  # someone else's edit (kubectl edit)
    assert cluster.emu.get(NETWORK_POLICIES, NS, name)["spec"] == policy["spec"]
    result = reconciler.reconcile(body, kopf.adopt)
    assert result.actions.get(f"NetworkPolicy/{name}") == "patched"
    assert cluster.emu.get(NETWORK_POLICIES, NS, name)["spec"] == rendered
    patches = len(cluster.operator_calls("patch", "networkpolicies", name))
    assert f"NetworkPolicy/{name}" not in reconciler.reconcile(body, kopf.adopt).actions
    assert len(cluster.operator_calls("patch", "networkpolicies", name)) == patches


# --------------------------------------------------------------------------- the run's result

EVAL_REPORT = {
    "problems": 4,
    "student_accuracy": 0.25,
    "guided_accuracy": 0.75,
    "accuracy_delta": 0.5,
    "accuracy_delta_low": 0.0,
    "accuracy_delta_high": 1.0,
    "non_degradation_rate": 1.0,
    "guidance_tokens_mean": 12.5,
    "student_tokens_alone": 99,  # in eval.json, not in the status summary
}


def test_result_is_read_once_from_the_succeeded_masters_termination_message(cluster):
    from atlas_contract import results

    run = ResultCluster(cluster, "result-run")
    assert run.pod_reads() == 0 and "result" not in run.status  # not finished: no pod read
    message = results.result_message(4, 0.625, EVAL_REPORT)
    run.put_master_pod(message)
    run.succeed_job()
    patch = run.reconcile()
    assert run.status["phase"] == "Succeeded"
    assert patch["result"] == results.parse_result_message(message)
    assert patch["result"] == {
        "step": 4,
        "reward": 0.625,
        "evaluation": {
            "problems": 4,
            "studentAccuracy": 0.25,
            "guidedAccuracy": 0.75,
            "accuracyDelta": 0.5,
            "accuracyDeltaLow": 0.0,
            "accuracyDeltaHigh": 1.0,
            "nonDegradationRate": 1.0,
            "guidanceTokensMean": 12.5,
        },
    }
    assert run.pod_reads() == 1
    for _ in range(5):  # shown: never read again, nothing more to write
        assert run.reconcile() == {}
    assert run.pod_reads() == 1


OUT_OF_RANGE = {
    "step-1e308": ('{"step":1e308}', None, "result.step"),
    "step-over-int64": ('{"step":9223372036854775808}', None, "result.step"),
    "negative-step": ('{"step":-3,"reward":0.5}', None, "result.step"),
    "accuracy-55": (
        '{"step":5,"evaluation":{"problems":4,"studentAccuracy":55,"guidedAccuracy":0.5}}',
        {"step": 5, "evaluation": {"problems": 4, "guidedAccuracy": 0.5}},
        "result.evaluation.studentAccuracy",
    ),
    "negative-problems": ('{"step":5,"evaluation":{"problems":-1}}', {"step": 5}, "result.evaluation.problems"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_result_value_out_of_its_schema_range_is_never_shown(cluster, case):
    """A termination message is the trainer's word: a value outside the range the CRD's schema states is left out
    (without a step, no result at all) with one Warning Event naming it, never written where the API server would
    refuse the status patch or show a 309-digit step."""
    message, shown, field = OUT_OF_RANGE[case]
    run = ResultCluster(cluster, f"range-{case}")
    run.put_master_pod(message)
    run.succeed_job()
    for _ in range(4):
        run.reconcile()
    assert run.status["phase"] == "Succeeded"
    assert run.status.get("result") == shown
    (warning,) = [e for e in run.events if e.reason == "ResultOutOfRange"]
    assert warning.type == "Warning" and field + ": expected a number from" in warning.message
    crd = custom_resource_definition("AtlasTeacher")
    result_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    # Parity with the schema: what is shown passes it, what was dropped fails it.
    jsonschema.Draft4Validator(result_schema["result"]).validate(shown or {})
    assert list(jsonschema.Draft4Validator(result_schema["result"]).iter_errors(json.loads(message)))


@pytest.mark.parametrize(
    "case", ["garbage", "log-tail", "empty", "missing-pod", "earlier-job", "forbidden", "running-container"]
)
def test_no_result_without_a_readable_message_and_no_loop(cluster, case):
    """A missing pod, a pod of an earlier job of the same name, no message, one that is not ours, or an API error:
    no result, no exception, nothing written, and the pod read at most MAX_RESULT_READS times for the job."""
    from atlas_operator.reconcile import MAX_RESULT_READS

    run = ResultCluster(cluster, f"{case}-run")
    messages = {
        "garbage": ('{"step": "many"} not json', 0),
        "log-tail": ("Traceback (most recent call last):\n  ...\nValueError: x", 1),
        "empty": (None, 0),
    }
    if case in messages:
        run.put_master_pod(*messages[case])
    elif case == "earlier-job":
        run.put_master_pod('{"step":3}', job_uid="uid-of-an-earlier-job")
    elif case == "running-container":
        pod = run.put_master_pod(None)
        pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "pytorch", "state": {"running": {}}}]}
        cluster.put_pod(pod)
    elif case == "forbidden":  # RBAC refuses every read of the pod (no state change)
        cluster.emu.fail_next(
            "GET", "v1/pods", status=403, times=10**6, namespace=NS, name=f"{case}-run-master-0", message="forbidden"
        )
    run.succeed_job()
    first = run.reconcile()
    assert run.status["phase"] == "Succeeded" and "result" not in first
    for _ in range(2 * MAX_RESULT_READS):
        assert run.reconcile() == {}
    assert "result" not in run.status
    assert run.pod_reads() == MAX_RESULT_READS
    if case == "forbidden":
        assert {c.status for c in cluster.operator_calls("get", "pods")} == {403}
    assert run.reconciler.memory.holds(NS, run.name)
    run.reconciler.memory.forget(NS, run.name)  # the run deleted: nothing kept for it
    assert not run.reconciler.memory.holds(NS, run.name)


def test_a_recreated_job_drops_the_result_of_the_one_before(cluster):
    """A spec change after success recreates the job: the old result is removed until the new job reports."""
    from atlas_contract import results

    run = ResultCluster(cluster, "again-run")
    run.put_master_pod(results.result_message(4, 0.5))
    run.succeed_job()
    run.reconcile()
    assert run.status["result"] == {"step": 4, "reward": 0.5}
    first_uid = run.job["metadata"]["uid"]
    run.body["spec"]["training"]["maxSteps"] = 11  # the job is finished: recreated at once
    patch = run.reconcile()
    assert cluster.operator_calls("delete", "pytorchjobs", "again-run")
    assert run.job["metadata"]["uid"] != first_uid  # a new job of the same name
    assert patch["result"] is None and "result" not in run.status and run.status["phase"] == "Pending"
    # The new job succeeds; the old pod (of the deleted job) is not taken for the new job's.
    run.succeed_job()
    reads = run.pod_reads()
    assert "result" not in run.reconcile() and run.pod_reads() == reads + 1
    run.put_master_pod(results.result_message(11, 0.75))
    assert run.reconcile()["result"] == {"step": 11, "reward": 0.75}


def test_forgetting_a_deleted_run_drops_everything_remembered_about_it():
    """RunMemory.forget (the delete handler's) drops what the reconciler and the handlers keep about the run, of
    either kind and any uid; another run's memory stays."""
    from atlas_operator.reconcile import RunMemory

    from atlas_contract.stops import StopReport

    memory = RunMemory()
    for name in ("gone", "stays"):
        run = ("AtlasTraining", NS, name)
        memory.note_kind(NS, name, "AtlasTraining")
        memory.note_pod(NS, name, f"{name}-pod", ("ErrImagePull", "pull"), (StopReport(3, 1.0), None))
        assert memory.count_save(NS, name, "uid", 3, None)
        memory.restarts_seen((NS, name, "uid", "jobset-uid"), 0, 1)
        assert memory.take_result_read((NS, name, "uid", "job-uid"), 3)
        memory.run_lock(run)
        memory.unreconciled_for(run, True)
    memory.forget(NS, "gone")
    assert not memory.holds(NS, "gone") and memory.holds(NS, "stays")
    assert memory.kind_of(NS, "gone") is None and memory.stuck_pods(NS, "gone") == []
    assert memory.stop_of(NS, "gone") is None and memory.unreconciled_for(("AtlasTraining", NS, "gone"), True) == 0
    assert memory.count_save(NS, "gone", "uid", 3, None)  # counted anew: a run made again under the name
    assert (
        memory.kind_of(NS, "stays") == "AtlasTraining"
        and memory.unreconciled_for(("AtlasTraining", NS, "stays"), True) > 0
    )


def test_a_run_whose_servers_would_be_best_effort_gets_a_warning_event_and_a_condition(cluster):
    """ServersRequestResources: True while every vLLM server requests CPU or memory (the defaults do); a student
    server set to cpu 0 and memory 0, with nothing fetched first, would be a BestEffort pod: False, with one Warning
    Event saying so (not posted again while it still holds), and True again once it requests some."""
    run = ResultCluster(cluster, "best-effort")
    (requested,) = [c for c in run.status["conditions"] if c["type"] == "ServersRequestResources"]
    assert requested["status"] == "True" and requested["reason"] == "Requested", requested
    run.body["spec"]["student"] = {"model": "/models/student", "rollout": {"replicas": 1, "cpu": "0", "memory": "0"}}
    run.events.clear()
    run.reconcile()
    (best_effort,) = [c for c in run.status["conditions"] if c["type"] == "ServersRequestResources"]
    assert best_effort["status"] == "False" and best_effort["reason"] == "ServersBestEffort", best_effort
    assert "the student server (spec.student.rollout.cpu and .memory: 0)" in best_effort["message"]
    assert [e.reason for e in run.events if e.type == "Warning"] == ["ServersBestEffort"]
    assert [e.message for e in run.events if e.type == "Warning"] == [best_effort["message"]]
    run.reconcile()
    assert [e.reason for e in run.events if e.type == "Warning"] == ["ServersBestEffort"]  # said once
    run.body["spec"]["student"]["rollout"]["memory"] = "4Gi"
    run.reconcile()
    (again,) = [c for c in run.status["conditions"] if c["type"] == "ServersRequestResources"]
    assert again["status"] == "True", again
