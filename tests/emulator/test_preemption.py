"""Preemption on the operator's side (#32), with the Reconciler in this process on the API emulator
(tests.support.reconciler): a queued run Kueue suspends again after admitting it is Queued with reason Preempted, and
a trainer's save on SIGTERM (its stop report, the termination message) is counted once per run and step in
.status.preemption, an Event PreemptionSave and atlas_training_preemption_saves_total."""

from __future__ import annotations

import copy

import jsonschema
import kopf
import pytest
from atlas_operator import metrics
from atlas_operator.crd import custom_resource_definition
from atlas_operator.status_update import job_ran, status_update, stop_report

from atlas_contract.names import STOP_EXIT_CODE, WATCHDOG_EXIT_CODE
from atlas_contract.stops import StopReport
from harness.kube_emulator import JOBSETS, PYTORCHJOBS
from harness.manifests import NS, teacher, training
from tests.support.k8s_schemas import crd_jsonschema
from tests.support.reconciler import ReconcilerCluster, merge_patch

AT = "2026-01-01T00:00:00Z"


@pytest.fixture
def cluster():
    with ReconcilerCluster() as own:
        yield own


class Run:
    """One run reconciled by one Reconciler (an operator process), its status patched as kopf would."""

    def __init__(self, cluster: ReconcilerCluster, manifest: dict, reconciler=None):
        self.cluster = cluster
        self.reconciler = reconciler or cluster.reconciler()
        self.body = copy.deepcopy(manifest)
        self.body["metadata"]["uid"] = f"{manifest['metadata']['name']}-uid"
        self.name = manifest["metadata"]["name"]
        self.status: dict = {}
        self.events: list = []
        self.saves = 0

    def reconcile(self) -> dict:
        result = self.reconciler.reconcile({**copy.deepcopy(self.body), "status": self.status}, kopf.adopt)
        patch, events = status_update(self.status, None, result, AT)
        self.events += events
        self.saves += result.preemption_saves
        self.status = merge_patch(self.status, patch)
        return patch

    def training(self) -> dict:
        return next(c for c in self.status["conditions"] if c["type"] == "Training")


def _pytorchjob_status(cluster: ReconcilerCluster, name: str, *conditions: tuple[str, str, str]) -> None:
    """What the Kubeflow Training Operator v1.9 writes: conditions (type, status, reason) in order."""
    cluster.set_job_status(
        name,
        {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": f"PyTorchJob {name} is {t.lower()}."}
                for t, s, r in conditions
            ]
        },
    )


def _suspend_pytorchjob(cluster: ReconcilerCluster, name: str, suspend: bool) -> None:
    """Kueue's admission (False) or preemption (True): runPolicy.suspend."""
    cluster.custom.patch_namespaced_custom_object(
        "kubeflow.org", "v1", NS, "pytorchjobs", name, {"spec": {"runPolicy": {"suspend": suspend}}}
    )


CREATED = ("Created", "True", "PyTorchJobCreated")


def test_a_pytorchjob_kueue_suspends_after_it_ran_is_preempted_and_one_never_admitted_is_not(cluster):
    """The Kubeflow Training Operator keeps a suspended job's Running condition (status False, reason
    PyTorchJobSuspended); a job Kueue never admitted has only Created and Suspended."""
    run = Run(cluster, training("queued-run", queueName="team-a"))
    run.reconcile()
    assert cluster.emu.get(PYTORCHJOBS, NS, "queued-run")["spec"]["runPolicy"]["suspend"] is True
    _pytorchjob_status(cluster, "queued-run", CREATED, ("Suspended", "True", "PyTorchJobSuspended"))
    run.reconcile()
    assert run.status["phase"] == "Queued" and run.training()["reason"] != "Preempted"

    _suspend_pytorchjob(cluster, "queued-run", False)  # admitted
    _pytorchjob_status(
        cluster, "queued-run", CREATED, ("Suspended", "False", "PyTorchJobResumed"), ("Running", "True", "Running")
    )
    run.reconcile()
    assert run.status["phase"] == "Running"

    _suspend_pytorchjob(cluster, "queued-run", True)  # preempted
    _pytorchjob_status(
        cluster,
        "queued-run",
        CREATED,
        ("Running", "False", "PyTorchJobSuspended"),
        ("Suspended", "True", "PyTorchJobSuspended"),
    )
    fresh = Run(cluster, training("queued-run", queueName="team-a"))  # an operator with no memory of the run
    fresh.reconcile()
    assert fresh.status["phase"] == "Queued"
    training_condition = fresh.training()
    assert training_condition["reason"] == "Preempted" and training_condition["status"] == "False"
    assert "resumes from its newest checkpoint when Kueue admits it again" in training_condition["message"]
    assert "checkpoint-" not in training_condition["message"]  # no save seen: no step claimed
    assert ("Normal", "Queued") in [(e.type, e.reason) for e in fresh.events]


def test_a_jobset_kueue_suspends_again_is_preempted_from_the_runs_own_status(cluster):
    """A JobSet's Suspended condition reads the same before its first admission and after a preemption: the run's
    previous phase (Running) tells them apart, and Preempted stays until Kueue admits it again."""
    run = Run(cluster, training("js-queued", backend="JobSet", queueName="team-a"))
    run.reconcile()

    def jobset(suspend: bool, status: dict) -> None:
        cluster.custom.patch_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "js-queued", {"spec": {"suspend": suspend}}
        )
        cluster.custom.patch_namespaced_custom_object_status(
            "jobset.x-k8s.io", "v1alpha2", NS, "jobsets", "js-queued", {"status": status}
        )

    suspended = {"conditions": [{"type": "Suspended", "status": "True", "reason": "SuspendedJobs", "message": "x"}]}
    jobset(True, suspended)
    run.reconcile()
    assert run.status["phase"] == "Queued" and run.training()["reason"] != "Preempted"  # never admitted
    running = {
        "conditions": [{"type": "Suspended", "status": "False", "reason": "ResumeJobs", "message": "x"}],
        "replicatedJobsStatus": [
            {"name": "rollout", "ready": 1, "active": 1},
            {"name": "trainer", "ready": 2, "active": 2},
        ],
    }
    jobset(False, running)
    run.reconcile()
    assert run.status["phase"] == "Running"
    jobset(True, suspended)
    for _ in range(2):  # and it stays so
        run.reconcile()
        assert run.status["phase"] == "Queued" and run.training()["reason"] == "Preempted"
    assert cluster.emu.get(JOBSETS, NS, "js-queued")["spec"]["suspend"] is True
    # A spec change makes a new JobSet: waiting for its first admission, not preempted.
    uid = cluster.emu.get(JOBSETS, NS, "js-queued")["metadata"]["uid"]
    run.body["spec"]["training"] = {**run.body["spec"]["training"], "maxSteps": 20}
    run.body["metadata"]["generation"] = 2
    run.reconcile()
    run.reconcile()
    assert cluster.emu.get(JOBSETS, NS, "js-queued")["metadata"]["uid"] != uid
    assert run.status["phase"] == "Queued" and run.training()["reason"] != "Preempted"


def _stopped_pod(name: str, run: str, report: StopReport | None, exit_code: int = STOP_EXIT_CODE, last=False):
    terminated = {"exitCode": exit_code, "reason": "Error", "finishedAt": "2026-01-01T01:02:03Z"}
    if report is not None:
        terminated["message"] = report.message()
    state = {"lastState": {"terminated": terminated}, "state": {"running": {}}} if last else {}
    state = state or {"state": {"terminated": terminated}}
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/instance": run,
                "app.kubernetes.io/component": "trainer",
                "app.kubernetes.io/managed-by": "atlas-operator",
            },
        },
        "status": {"containerStatuses": [{"name": "trainer", **state}]},
    }


def test_stop_reports_are_read_from_a_trainer_pods_state_or_last_state():
    report = StopReport(step=40, seconds=12.5)
    assert stop_report(_stopped_pod("p", "r", report)) == (report, "2026-01-01T01:02:03Z")
    assert stop_report(_stopped_pod("p", "r", report, last=True))[0] == report  # restarted in place (PyTorchJob)
    assert stop_report(_stopped_pod("p", "r", report, exit_code=1)) is None  # the launcher's code was not the stop's
    assert stop_report(_stopped_pod("p", "r", report, exit_code=WATCHDOG_EXIT_CODE)) is None
    assert stop_report(_stopped_pod("p", "r", None)) is None  # 143 without a save: no report
    assert job_ran({"status": {"conditions": [{"type": "Running", "status": "False"}]}})
    assert not job_ran({"status": {"conditions": [{"type": "Created", "status": "True"}]}})
    assert not job_ran({"kind": "JobSet", "status": {"conditions": [{"type": "Running", "status": "False"}]}})


def _series(namespace: str, run: str, kind: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "atlas_training_preemption_saves_total", {"namespace": namespace, "run": run, "kind": kind}
    )
    return value or 0.0


def test_a_save_on_sigterm_is_counted_once_per_run_and_step(cluster):
    """Every node reports the same step, a pod is seen again (MODIFIED, then DELETED with its last status), an
    operator restarted sees the pods again: one save per step; a later step is another. Through the handlers' own
    accounting (handlers.reconcile_counted is what increments the counter from each result)."""
    manifest = teacher("pre-run", backend="JobSet")
    run = Run(cluster, manifest)
    run.reconcile()
    first = StopReport(step=120, seconds=41.5)
    reconciler = run.reconciler
    assert reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-0-a", "pre-run", first)) == (
        "AtlasTeacher",
        "pre-run",
    )
    # the second node's pod, the same pod deleted with its last status: nothing new
    assert reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-1-b", "pre-run", first)) is None
    assert reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-0-a", "pre-run", first), deleted=True) is None
    patch = run.reconcile()
    assert patch["preemption"] == {"saves": 1, "step": 120, "seconds": 41.5, "time": "2026-01-01T01:02:03Z"}
    assert [(e.type, e.message) for e in run.events if e.reason == "PreemptionSave"] == [
        ("Normal", "every rank saved checkpoint-120 (step 120) on SIGTERM in 41.5 s; training resumes from it")
    ]
    assert run.saves == 1
    run.reconcile()
    assert run.saves == 1 and len([e for e in run.events if e.reason == "PreemptionSave"]) == 1

    # An operator restarted: it sees the pods again, and the status says step 120 was counted.
    restarted = Run(cluster, manifest, reconciler=cluster.reconciler())
    restarted.status = copy.deepcopy(run.status)
    restarted.reconciler.reconcile({**copy.deepcopy(restarted.body), "status": restarted.status}, kopf.adopt)
    restarted.reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-1-b", "pre-run", first), deleted=True)
    assert restarted.reconcile().get("preemption") is None and restarted.saves == 0

    # A later preemption, at a later step: counted, saves 2.
    second = StopReport(step=180, seconds=38.0)
    assert restarted.reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-0-c", "pre-run", second)) is not None
    patch = restarted.reconcile()
    assert patch["preemption"]["saves"] == 2 and patch["preemption"]["step"] == 180 and restarted.saves == 1
    # An older report seen late changes nothing.
    restarted.reconciler.pod_changed(_stopped_pod("pre-run-trainer-0-0-a", "pre-run", first))
    assert restarted.reconcile().get("preemption") is None

    # The status field is in the CRD's schema (nothing pruned: every key declared, camelCase as the rest).
    schema = crd_jsonschema(custom_resource_definition("AtlasTeacher"))
    preemption = schema["properties"]["status"]["properties"]["preemption"]
    assert set(preemption["properties"]) == {"saves", "step", "seconds", "time"}
    jsonschema.validate(restarted.status["preemption"], preemption)


def test_two_passes_before_either_writes_its_status_count_a_save_once(cluster):
    """A pod's change and the run's timer reconcile it from the same stored status: the second pass sees this
    process's count."""
    run = Run(cluster, training("race-run", backend="JobSet"))
    run.reconcile()
    run.reconciler.pod_changed(_stopped_pod("race-run-trainer-0-0-a", "race-run", StopReport(7, 3.0)))
    body = {**copy.deepcopy(run.body), "status": copy.deepcopy(run.status)}
    first = run.reconciler.reconcile(copy.deepcopy(body), kopf.adopt)
    second = run.reconciler.reconcile(copy.deepcopy(body), kopf.adopt)
    assert (first.preemption_saves, second.preemption_saves) == (1, 0)


def test_a_save_of_an_earlier_run_of_the_same_name_is_not_counted(cluster):
    """A run deleted and made again under its name: the old run's pods go after it (garbage collection), and their
    last status still carries a stop report. It ended before the new run was created: not the new run's save."""
    manifest = training("again-run", backend="JobSet")
    manifest["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"  # after the old pod's finishedAt
    run = Run(cluster, manifest)
    run.reconcile()
    run.reconciler.pod_changed(_stopped_pod("again-run-trainer-0-0-a", "again-run", StopReport(9, 2.0)), deleted=True)
    assert run.reconcile().get("preemption") is None and run.saves == 0


def test_the_handlers_count_a_save_in_the_operator_metric(cluster):
    """handlers.reconcile_counted increments atlas_training_preemption_saves_total{namespace,run,kind} from the
    reconciliation's result, as for every run the operator reconciles."""
    from atlas_operator import handlers

    reconciler = cluster.reconciler()
    body = training("metric-run", backend="JobSet")
    body["metadata"]["uid"] = "metric-run-uid"

    class Memo:
        pass

    memo = Memo()
    memo.reconciler = reconciler
    memo.phases = metrics.RunPhases()
    before = _series(NS, "metric-run", "AtlasTraining")
    handlers.reconcile_counted(copy.deepcopy(body), memo)
    reconciler.pod_changed(_stopped_pod("metric-run-trainer-0-0-a", "metric-run", StopReport(9, 1.0)))
    patch, events = handlers.reconcile_counted(copy.deepcopy(body), memo)
    assert _series(NS, "metric-run", "AtlasTraining") == before + 1
    assert patch["preemption"]["step"] == 9 and "PreemptionSave" in [e.reason for e in events]
