"""The operator process (`atlas operator`) against a real HTTP Kubernetes API (kmock's emulator).

Runs, PyTorchJob status and faults go in through the API like kubectl and the Kubeflow controller
would; assertions read the emulator's stored objects and its request log.
"""

from __future__ import annotations

import json

import kubernetes
import pytest
from atlas_operator.crd import custom_resource_definition
from atlas_operator.ticker import TICK_DONE, tick_line

from harness.env import REPO, free_port
from harness.kube_emulator import JOBSETS, PYTORCHJOBS, TEACHERS, TRAININGS
from harness.manifests import NS, teacher, training
from harness.polling import wait_for
from tests.support.k8s_schemas import crd_jsonschema, openapi_validate, pruned_fields
from tests.support.operator_cluster import (
    NETWORK_POLICIES,
    TIMEOUT,
    children_of,
    cleanup_runs,  # noqa: F401  (autouse: each test's runs deleted)
    own_cluster,
    permissions_used,
    wait_children,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trainer_metrics_port():
    """The trainer's real Prometheus endpoint (its own registry), served here on 127.0.0.1."""
    from atlas_core.telemetry.metrics import serve_metrics

    return serve_metrics(free_port(), host="127.0.0.1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, trainer_metrics_port):
    metrics_url = f"http://127.0.0.1:{trainer_metrics_port}/metrics"
    with own_cluster(tmp_path_factory.mktemp("cluster"), metrics_url=metrics_url) as shared:
        yield shared


# --------------------------------------------------------------------------- tests


def test_create_makes_every_child_owned_by_the_run(cluster):
    manifest = teacher("create-run")
    run = cluster.apply(manifest)
    objects = wait_children(cluster, "create-run")
    uid = cluster.run(manifest)["metadata"]["uid"]
    assert uid == run["metadata"]["uid"]
    for obj in objects.values():
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["kind"] == "AtlasTeacher" and ref["controller"] is True
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
    container = objects["job"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example/atlas-trainer:test"  # the operator's default image
    status = cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending" and s.get("children"), "Pending")
    assert status["children"] == {
        "pytorchJob": "create-run",
        "configMap": "create-run-config",
        "metricsService": "create-run-metrics",
        "rollout": "create-run-rollout",
        "student": "create-run-student",
        "networkPolicy": "create-run-network",
        "trainerNetworkPolicy": "create-run-network-trainer",
    }
    assert status["observedGeneration"] == 1
    # What the operator writes survives the CRD's structural schema (nothing would be pruned); kopf writes nothing
    # (it handles no run: atlas_operator/workqueue.py).
    run_schema = custom_resource_definition("AtlasTeacher")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    stored = cluster.wait_status(manifest, lambda s: s.get("observedGeneration") == 1, "the first status write")
    assert "kopf" not in stored
    assert pruned_fields({"status": stored}, run_schema) == []
    openapi_validate(
        {"status": stored},
        {"properties": {"status": crd_jsonschema(custom_resource_definition("AtlasTeacher"))["properties"]["status"]}},
    )
    assert cluster.condition(manifest, "Valid")["status"] == "True"
    assert cluster.condition(manifest, "RolloutReady")["reason"] == "Waiting"
    # Settled: further timer passes write nothing.
    before = len(cluster.emu.writes(name="create-run"))
    wait_for(lambda: len(cluster.operator.output().split(TICK_DONE)) > 6, timeout=TIMEOUT)
    after = cluster.emu.writes(name="create-run")
    assert len(after) == before, [(c.method, c.path, c.user_agent, c.body) for c in after[before:]]
    # A new run's first phase is no news: no Event says it (its status does).
    assert [e["reason"] for e in cluster.events("create-run") if e["reason"] == "Pending"] == []


def test_phase_and_conditions_follow_the_pytorchjob(cluster):
    manifest = training("phase-run")
    cluster.apply(manifest)
    wait_children(cluster, "phase-run", teacher_run=False)
    cluster.set_job_conditions("phase-run", "Created")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")
    cluster.set_job_conditions("phase-run", "Created", "Running", message="all pods are running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    training_condition = cluster.condition(manifest, "Training")
    assert training_condition["status"] == "True" and training_condition["reason"] == "Running"
    assert training_condition["message"] == "all pods are running"
    cluster.set_job_conditions("phase-run", "Created", "Running", "Restarting")
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "Training").get("reason") == "Restarting", "Restarting"
    )
    assert cluster.status(manifest)["phase"] == "Running"
    cluster.set_job_conditions("phase-run", "Created", "Running", "Failed", message="Worker exited with code 1")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Failed", "Failed")
    wait_for(
        lambda: {"Running", "Failed"} <= {e["reason"] for e in cluster.events("phase-run")},
        timeout=TIMEOUT,
        what="transition events",
    )
    failed = next(e for e in cluster.events("phase-run") if e["reason"] == "Failed")
    assert failed["type"] == "Warning" and "code 1" in failed["message"]


def test_deleted_children_are_recreated(cluster):
    manifest = training("recreate-run")
    cluster.apply(manifest)
    objects = wait_children(cluster, "recreate-run", teacher_run=False)
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    apps = kubernetes.client.AppsV1Api(cluster.api_client)
    apps.delete_namespaced_deployment("recreate-run-rollout", NS)
    core.delete_namespaced_config_map("recreate-run-config", NS)
    for key, resource, name in (
        ("rollout", "apps/v1/deployments", "recreate-run-rollout"),
        ("config", "v1/configmaps", "recreate-run-config"),
    ):
        old_uid = objects[key]["metadata"]["uid"]
        wait_for(
            lambda r=resource, n=name, u=old_uid: (
                (cluster.emu.get(r, NS, n) or {}).get("metadata", {}).get("uid") not in (None, u)
            ),
            timeout=TIMEOUT,
            what=f"{name} recreated",
        )
    # Only what was deleted is created again: one successful create per surviving child, two per deleted one.
    wanted = children_of("recreate-run", teacher_run=False)
    created = {
        key: len([c for c in cluster.emu.writes(resource, name=name) if c.verb == "create" and c.status == 201])
        for key, (resource, name) in wanted.items()
    }
    assert created == {key: 2 if key in ("rollout", "config") else 1 for key in wanted}


def test_a_child_deleted_while_the_watch_was_away_is_made_again_after_the_relisting(cluster):
    """A watch that misses events (a dropped connection, an API server restarted) is ended with 410 Gone and the
    operator lists again: a child the listing no longer shows was deleted meanwhile, and its run makes it again."""
    cluster.apply(training("relist-run"))
    old_uid = wait_children(cluster, "relist-run", teacher_run=False)["config"]["metadata"]["uid"]
    lists = len(cluster.emu.calls(lambda c: c.resource == "configmaps" and c.verb == "list"))
    cluster.server.run(cluster.emu.delete_unseen("v1/configmaps", NS, "relist-run-config"))
    cluster.server.run(cluster.emu.expire_watches("v1/configmaps"))
    wait_for(
        lambda: (
            (cluster.emu.get("v1/configmaps", NS, "relist-run-config") or {}).get("metadata", {}).get("uid")
            not in (None, old_uid)
        ),
        timeout=TIMEOUT,
        what="the ConfigMap made again after the relisting",
    )
    assert len(cluster.emu.calls(lambda c: c.resource == "configmaps" and c.verb == "list")) > lists


def test_invalid_spec_gets_every_problem_and_no_children(cluster):
    manifest = training(
        "invalid-run",
        training={"perDeviceTrainBatchSize": 3, "numGenerations": 5},
        rollout={"replicas": 1, "gpus": 3, "tensorParallelSize": 2},
    )
    cluster.apply(manifest)
    status = cluster.wait_status(manifest, lambda s: s.get("phase") == "Invalid", "Invalid")
    message = cluster.condition(manifest, "Valid")["message"]
    assert "spec.training.numGenerations: 5 does not divide" in message
    assert "spec.rollout.gpus: 3 is not spec.rollout.tensorParallelSize (2)" in message
    assert "children" not in status
    assert not any(cluster.emu.get(r, NS, n) for r, n in children_of("invalid-run", False).values())
    assert not cluster.emu.writes("v1/configmaps", name="invalid-run-config")
    wait_for(
        lambda: any(e["reason"] == "Invalid" and e["type"] == "Warning" for e in cluster.events("invalid-run")),
        timeout=TIMEOUT,
        what="an Invalid event",
    )
    # Fixing the spec makes the run whole.
    cluster.patch_spec(
        manifest,
        {
            "training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4},
            "rollout": {"replicas": 1, "gpus": 2, "tensorParallelSize": 2},
        },
    )
    wait_children(cluster, "invalid-run", teacher_run=False)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending after the fix")


def test_api_errors_are_retried_until_the_run_converges(cluster):
    cluster.emu.fail_next("POST", "apps/v1/deployments", status=500, namespace=NS)
    cluster.emu.fail_next("POST", "v1/services", status=409, namespace=NS)  # "already exists", yet it does not
    manifest = teacher("fault-run")
    cluster.apply(manifest)
    wait_children(cluster, "fault-run")
    deployment_posts = cluster.emu.calls(
        lambda c: (
            c.method == "POST" and c.resource == "deployments" and c.body["metadata"]["name"].startswith("fault-run")
        )
    )
    assert [c.status for c in deployment_posts][:2] == [500, 201]
    service_posts = cluster.emu.calls(
        lambda c: c.method == "POST" and c.resource == "services" and c.body["metadata"]["name"].startswith("fault-run")
    )
    assert service_posts[0].status == 409 and all(c.status == 201 for c in service_posts[1:])
    for resource, name in children_of("fault-run").values():
        created = [c for c in cluster.emu.writes(resource, name=name) if c.method == "POST" and c.status == 201]
        assert len(created) == 1, name
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending" and s.get("children"), "converged")


def test_suspend_and_resume(cluster):
    manifest = teacher("suspend-run")
    cluster.apply(manifest)
    wait_children(cluster, "suspend-run")
    cluster.set_job_conditions("suspend-run", "Created", "Running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    cluster.patch_spec(manifest, {"suspend": True})

    def suspended(flag: bool, replicas: int) -> bool:
        job = cluster.emu.get(PYTORCHJOBS, NS, "suspend-run")
        deployments = [cluster.emu.get("apps/v1/deployments", NS, f"suspend-run-{c}") for c in ("rollout", "student")]
        return job["spec"]["runPolicy"]["suspend"] is flag and all(
            d["spec"]["replicas"] == replicas for d in deployments
        )

    wait_for(lambda: suspended(True, 0), timeout=TIMEOUT, what="suspended job and servers")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Suspended", "Suspended")
    job_uid = cluster.emu.get(PYTORCHJOBS, NS, "suspend-run")["metadata"]["uid"]
    cluster.patch_spec(manifest, {"suspend": False})
    wait_for(lambda: suspended(False, 1), timeout=TIMEOUT, what="resumed job and servers")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running again")
    assert cluster.emu.get(PYTORCHJOBS, NS, "suspend-run")["metadata"]["uid"] == job_uid  # patched, not recreated


def test_progress_is_mirrored_from_the_trainer_metrics(cluster, fresh_trainer_metrics):
    metrics = fresh_trainer_metrics
    labels = {"namespace": NS, "run": "progress-run", "kind": "AtlasTraining"}
    manifest = training("progress-run")
    cluster.apply(manifest)
    wait_children(cluster, "progress-run", teacher_run=False)
    metrics.training_step.labels(**labels).set(7)
    metrics.training_reward.labels(**labels).set(0.25)
    cluster.set_job_conditions("progress-run", "Created", "Running")
    status = cluster.wait_status(manifest, lambda s: (s.get("progress") or {}).get("step") == 7, "step 7")
    assert status["progress"]["reward"] == 0.25 and "kl" not in status["progress"]  # beta 0: no KL, no error
    assert status["progress"]["updatedAt"]
    metrics.training_step.labels(**labels).set(8)
    metrics.training_reward.labels(**labels).set(0.5)
    metrics.training_kl.labels(**labels).set(0.013)
    status = cluster.wait_status(manifest, lambda s: (s.get("progress") or {}).get("step") == 8, "step 8")
    assert status["progress"]["reward"] == 0.5 and status["progress"]["kl"] == 0.013


def test_spec_change_recreates_the_job_from_the_checkpoint_volume(cluster):
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    core.create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    manifest = training("change-run", checkpoint={"pvc": "ckpt"})
    cluster.apply(manifest)
    objects = wait_children(cluster, "change-run", teacher_run=False)
    cluster.set_job_conditions("change-run", "Created", "Running")
    cluster.patch_spec(
        manifest,
        {
            "training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 10, "learningRate": 2e-6},
            "rollout": {"replicas": 1, "gpus": 4, "tensorParallelSize": 4},
        },
    )
    old_uid = objects["job"]["metadata"]["uid"]
    wait_for(
        lambda: (
            (cluster.emu.get(PYTORCHJOBS, NS, "change-run") or {}).get("metadata", {}).get("uid") not in (None, old_uid)
        ),
        timeout=TIMEOUT,
        what="a recreated PyTorchJob",
    )
    rollout = cluster.emu.get("apps/v1/deployments", NS, "change-run-rollout")
    assert rollout["metadata"]["uid"] == objects["rollout"]["metadata"]["uid"]  # patched in place
    assert rollout["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "learning_rate: 2.0e-06" in cluster.emu.get("v1/configmaps", NS, "change-run-config")["data"]["run.yaml"]
    wait_for(lambda: any(e["reason"] == "JobRecreated" for e in cluster.events("change-run")), timeout=TIMEOUT)


def test_servers_the_spec_no_longer_wants_are_deleted(cluster):
    """rollout.replicas set to 0 on a live run: its Deployment and Service go (their GPUs with them), and
    status.children stops listing them."""
    manifest = training("shrink-run")
    cluster.apply(manifest)
    wait_children(cluster, "shrink-run", teacher_run=False)
    cluster.wait_status(manifest, lambda s: "rollout" in (s.get("children") or {}), "rollout in status.children")
    cluster.patch_spec(manifest, {"rollout": {"replicas": 0}})
    wait_for(
        lambda: (
            cluster.emu.get("apps/v1/deployments", NS, "shrink-run-rollout") is None
            and cluster.emu.get("v1/services", NS, "shrink-run-rollout") is None
        ),
        timeout=TIMEOUT,
        what="the rollout Deployment and Service deleted",
    )
    cluster.wait_status(manifest, lambda s: "rollout" not in (s.get("children") or {}), "rollout gone from status")
    assert cluster.emu.get("v1/services", NS, "shrink-run-metrics") is not None  # the rest stays


def test_spec_change_without_checkpoint_volume_is_reported(cluster):
    manifest = training("nockpt-run")
    cluster.apply(manifest)
    objects = wait_children(cluster, "nockpt-run", teacher_run=False)
    cluster.set_job_conditions("nockpt-run", "Created", "Running")
    cluster.patch_spec(manifest, {"training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 20}})
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "SpecApplied").get("status") == "False", "SpecApplied False"
    )
    assert cluster.condition(manifest, "SpecApplied")["reason"] == "RestartNeedsCheckpoint"
    assert cluster.emu.get(PYTORCHJOBS, NS, "nockpt-run")["metadata"]["uid"] == objects["job"]["metadata"]["uid"]
    assert cluster.status(manifest)["phase"] == "Running"


def operator_secret_calls(cluster) -> list:
    return cluster.emu.calls(
        lambda c: c.resource == "secrets" and (c.user_agent or "").startswith(("atlas-operator/", "kopf/"))
    )


PULL_BACKOFF = {
    "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.example/private:1"'}
}
PULL_ERROR = {
    "waiting": {
        "reason": "ErrImagePull",
        "message": "failed to pull and unpack image: pull access denied, repository does not exist or may require "
        "authorization",
    }
}


def test_missing_references_are_reported_then_picked_up(cluster):
    """A missing checkpoint PVC holds the run back (Pending, no children). A missing pull Secret is not looked up (the
    operator has no Secret permission): the kubelet's waiting reason on the run's pod shows as PodsStarted=False and
    a Warning Event, from the pod watch, and clears once the pod starts."""
    manifest = teacher("prereq-run", checkpoint={"pvc": "missing-ckpt"}, imagePullSecrets=[{"name": "regcred"}])
    cluster.apply(manifest)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending" and s.get("conditions"), "Pending")
    condition = cluster.condition(manifest, "PrerequisitesMet")
    assert condition["status"] == "False" and condition["reason"] == "CheckpointPVCMissing"
    assert "missing-ckpt" in condition["message"]
    assert cluster.emu.get(PYTORCHJOBS, NS, "prereq-run") is None
    core = kubernetes.client.CoreV1Api(cluster.api_client)
    core.create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": "missing-ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    objects = wait_children(cluster, "prereq-run")
    master = objects["job"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    assert master["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    for state in (PULL_ERROR, PULL_BACKOFF):  # what the kubelet reports, in turn, for a missing pull Secret
        cluster.kubelet_pod("prereq-run-master-0", master, "pytorch", state)
        reason = state["waiting"]["reason"]
        cluster.wait_status(
            manifest, lambda s, r=reason: cluster.condition(manifest, "PodsStarted").get("reason") == r, reason
        )
        started = cluster.condition(manifest, "PodsStarted")
        assert started["status"] == "False"
        assert state["waiting"]["message"] in started["message"] and "prereq-run-master-0" in started["message"]
        assert "spec.imagePullSecrets" in started["message"]  # what to check
        wait_for(
            lambda r=reason: any(
                e["reason"] == r and e["type"] == "Warning" and "prereq-run-master-0" in e["message"]
                for e in cluster.events("prereq-run")
            ),
            timeout=TIMEOUT,
            what=f"a {reason} Event on the run",
        )
    cluster.kubelet_pod("prereq-run-master-0", master, "pytorch", {"running": {"startedAt": "2026-01-01T00:00:00Z"}})
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "PodsStarted").get("status") == "True", "the pod started"
    )
    assert cluster.condition(manifest, "PrerequisitesMet")["status"] == "True"
    assert operator_secret_calls(cluster) == []  # never looked up: the operator holds no Secret permission
    core.delete_namespaced_pod("prereq-run-master-0", NS)


def master_pull_backoff(cluster, manifest: dict, objects: dict) -> None:
    """The run's PyTorchJob Master pod as the kubelet reports it when its image cannot be pulled, and the run saying
    so (PodsStarted=False, ImagePullBackOff)."""
    name = manifest["metadata"]["name"]
    master = objects["job"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    cluster.kubelet_pod(f"{name}-master-0", master, "pytorch", PULL_BACKOFF)
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "PodsStarted").get("reason") == "ImagePullBackOff",
        "the pull failure on the run",
    )


def test_a_missing_env_secret_shows_as_the_kubelet_reports_it(cluster):
    """spec.env naming a Secret that is not there: CreateContainerConfigError on the trainer pod, and the run says so
    until the pod goes."""
    manifest = training(
        "envsecret-run", env=[{"name": "K", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]
    )
    cluster.apply(manifest)
    objects = wait_children(cluster, "envsecret-run", teacher_run=False)
    template = objects["job"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    config_error = {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "nope" not found'}}
    cluster.kubelet_pod("envsecret-run-master-0", template, "pytorch", config_error)
    cluster.wait_status(
        manifest,
        lambda s: cluster.condition(manifest, "PodsStarted").get("reason") == "CreateContainerConfigError",
        "CreateContainerConfigError",
    )
    assert 'secret "nope" not found' in cluster.condition(manifest, "PodsStarted")["message"]
    kubernetes.client.CoreV1Api(cluster.api_client).delete_namespaced_pod("envsecret-run-master-0", NS)
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "PodsStarted").get("status") == "True", "the pod gone"
    )
    assert operator_secret_calls(cluster) == []


def test_a_deleted_runs_children_are_left_to_the_garbage_collector(cluster):
    """No finalizer holds a run: its deletion is the API server's at once, and its children the garbage collector's
    (each names the run its controller owner; tests/kube/test_ownership.py watches the real one collect them). The
    operator writes nothing for it, and its ticks end."""
    manifest, other = teacher("delete-run"), teacher("delete-keep")
    for run in (manifest, other):
        cluster.apply(run)
        wait_children(cluster, run["metadata"]["name"])
    cluster.wait_status(manifest, lambda s: s.get("observedGeneration") == 1, "the first status write")
    run = cluster.run(manifest)
    assert not run["metadata"].get("finalizers"), run["metadata"]
    for resource, name in children_of("delete-run").values():
        (owner,) = cluster.emu.get(resource, NS, name)["metadata"]["ownerReferences"]
        assert (owner["uid"], owner["controller"]) == (run["metadata"]["uid"], True), (resource, name)
    before = len(cluster.emu.writes())
    cluster.delete_run(manifest)
    assert cluster.run(manifest) is None
    ticks = lambda name: cluster.operator.output().count(tick_line(NS, name))  # noqa: E731
    deleted, kept = ticks("delete-run"), ticks("delete-keep")
    wait_for(lambda: ticks("delete-keep") >= kept + 2, timeout=TIMEOUT, what="two ticks of the run kept")
    assert ticks("delete-run") <= deleted + 1  # (one may have been under way)
    operator = [c for c in cluster.emu.writes()[before:] if (c.user_agent or "").startswith(("kopf", "atlas-operator"))]
    assert [(c.method, c.path) for c in operator if "delete-run" in c.path] == []


def _operator_samples(cluster) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    status, text = cluster.operator.get("/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_operator_metrics_and_health(cluster):
    """The shared operator has counted earlier tests' runs too: counters are compared before and after this
    run, and the runs gauge once every earlier run is gone."""
    wait_for(
        lambda: not cluster.emu.list(TRAININGS, NS) and not cluster.emu.list(TEACHERS, NS),
        timeout=TIMEOUT,
        what="earlier tests' runs deleted",
    )
    success = ("atlas_operator_reconcile_total", (("kind", "AtlasTraining"), ("result", "success")))
    durations = ("atlas_operator_reconcile_duration_seconds_count", (("kind", "AtlasTraining"),))
    pending = ("atlas_operator_runs", (("kind", "AtlasTraining"), ("phase", "Pending")))
    before = _operator_samples(cluster)
    manifest = training("metrics-run")
    cluster.apply(manifest)
    wait_children(cluster, "metrics-run", teacher_run=False)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")  # written after the metrics
    status, body = cluster.operator.get("/healthz")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, body = cluster.operator.get("/readyz")  # readiness: its watches have listed (not liveness's probe)
    assert status == 200 and json.loads(body) == {"status": "ready"}
    after = _operator_samples(cluster)
    assert after[success] >= before.get(success, 0) + 1
    assert after[durations] >= before.get(durations, 0) + 1
    assert after[pending] == 1  # this run, the only one left
    assert after[("atlas_operator_runs", (("kind", "AtlasTeacher"), ("phase", "Invalid")))] == 0  # every phase shown
    # One series per run, in its current phase only (what alerts name), gone once the run is deleted.
    run_phases = {k[1]: v for k, v in after.items() if k[0] == "atlas_operator_run_phase"}
    labels = (("kind", "AtlasTraining"), ("namespace", NS), ("phase", "Pending"), ("run", "metrics-run"))
    assert run_phases == {labels: 1}
    # Errors exported before any happened (at zero here): a rate over them is 0, not "no data".
    assert ("atlas_operator_reconcile_total", (("kind", "AtlasTeacher"), ("result", "error"))) in after
    cluster.delete_run(manifest)
    wait_for(
        lambda: not any(k[0] == "atlas_operator_run_phase" for k in _operator_samples(cluster)),
        timeout=TIMEOUT,
        what="the deleted run's phase series removed",
    )


def test_a_finished_runs_result_is_read_from_its_master_pod(cluster):
    """The job succeeds: .status.result is the Master's termination message (what the trainer reported), the
    Delta column's path resolves, and once it is shown the pod is not read again and nothing more is written."""
    from atlas_contract.results import parse_result_message, result_message

    manifest = teacher("result-run", evaluation={"samples": 1, "limit": 4})
    cluster.apply(manifest)
    wait_children(cluster, "result-run")
    report = {"problems": 4, "student_accuracy": 0.25, "guided_accuracy": 0.75, "accuracy_delta": 0.5}
    message = result_message(6, 0.4, {**report, "non_degradation_rate": 1.0, "guidance_tokens_mean": 9.0})
    cluster.finish_master_pod("result-run", message)
    cluster.set_job_conditions("result-run", "Created", "Running", "Succeeded")
    status = cluster.wait_status(manifest, lambda s: "result" in s, ".status.result")
    assert status["phase"] == "Succeeded"
    assert status["result"] == parse_result_message(message)
    assert status["result"]["evaluation"]["accuracyDelta"] == 0.5  # the Delta column (.status.result.evaluation…)
    assert [c.verb for c in cluster.pod_reads("result-run-master-0")] == ["get"]
    # Settled: timer passes neither read the pod again nor write anything.
    reads, writes = len(cluster.pod_reads("result-run-master-0")), len(cluster.emu.writes(name="result-run"))
    ticks = cluster.operator.output().count(TICK_DONE)
    wait_for(lambda: cluster.operator.output().count(TICK_DONE) > ticks + 6, timeout=TIMEOUT)
    assert len(cluster.pod_reads("result-run-master-0")) == reads
    assert len(cluster.emu.writes(name="result-run")) == writes


def test_a_run_whose_evaluation_failed_succeeds_with_its_result_and_a_warning(cluster):
    """The trainer trained and saved, then its evaluation failed: it reported the step, the reward and the
    evaluation's error (exit 0); the run is Succeeded, shows all three, and a Warning Event names the error."""
    from atlas_contract.results import result_message

    manifest = teacher("eval-failed-run", evaluation={"samples": 1})
    cluster.apply(manifest)
    wait_children(cluster, "eval-failed-run")
    error = "evaluation.dataset.source: cannot load 'hf://org/held-out': no network"
    cluster.finish_master_pod("eval-failed-run", result_message(5, 0.3, evaluation_error=error))
    cluster.set_job_conditions("eval-failed-run", "Created", "Running", "Succeeded")
    status = cluster.wait_status(manifest, lambda s: "result" in s, ".status.result")
    assert status["phase"] == "Succeeded"
    assert status["result"] == {"step": 5, "reward": 0.3, "evaluationError": error}
    warnings = wait_for(
        lambda: [e for e in cluster.events("eval-failed-run") if e["reason"] == "EvaluationFailed"],
        timeout=TIMEOUT,
        what="the EvaluationFailed event",
    )
    assert warnings[0]["type"] == "Warning" and error in warnings[0]["message"]


def test_a_finished_run_without_a_readable_result_shows_none_and_does_not_loop(cluster):
    """A message that is not a result (a log tail, garbage) or no Master pod at all: no .status.result, the operator
    keeps serving, the pod is read a bounded number of times and the run's status is not rewritten."""
    from atlas_operator.reconcile import MAX_RESULT_READS

    garbage, missing = training("garbage-run"), training("nopod-run")
    for manifest in (garbage, missing):
        cluster.apply(manifest)
        wait_children(cluster, manifest["metadata"]["name"], teacher_run=False)
    cluster.finish_master_pod("garbage-run", "Traceback (most recent call last):\n  ...\nOSError: disk full", 1)
    for manifest in (garbage, missing):
        cluster.set_job_conditions(manifest["metadata"]["name"], "Created", "Running", "Succeeded")
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Succeeded", "Succeeded")
    wait_for(
        lambda: all(len(cluster.pod_reads(f"{n}-master-0")) == MAX_RESULT_READS for n in ("garbage-run", "nopod-run")),
        timeout=TIMEOUT,
        what="the bounded reads",
    )
    writes = {n: len(cluster.emu.writes(name=n)) for n in ("garbage-run", "nopod-run")}
    logged = len(cluster.operator.output())
    ticks = cluster.operator.output().count(TICK_DONE)
    wait_for(lambda: cluster.operator.output().count(TICK_DONE) > ticks + 6, timeout=TIMEOUT)
    for manifest in (garbage, missing):
        name = manifest["metadata"]["name"]
        assert "result" not in cluster.status(manifest) and cluster.status(manifest)["phase"] == "Succeeded"
        assert len(cluster.pod_reads(f"{name}-master-0")) == MAX_RESULT_READS
        assert len(cluster.emu.writes(name=name)) == writes[name]
    assert [c.status for c in cluster.pod_reads("nopod-run-master-0")] == [404] * MAX_RESULT_READS
    assert cluster.operator.alive() and "Traceback" not in cluster.operator.output()[logged:]


# --------------------------------------------------------------------------- clusters of their own


def test_missing_pytorchjob_crd_is_a_condition_not_a_crash(tmp_path):
    with own_cluster(tmp_path, pytorchjobs=False) as cluster:
        first, second = training("no-crd-1"), teacher("no-crd-2")
        cluster.apply(first)
        cluster.apply(second)
        for manifest in (first, second):
            cluster.wait_status(
                manifest,
                lambda s: (
                    cluster.condition(manifest, "PrerequisitesMet").get("reason")  # noqa: B023
                    == "PyTorchJobCRDMissing"
                ),
                "PyTorchJobCRDMissing",
            )
            condition = cluster.condition(manifest, "PrerequisitesMet")
            assert "Kubeflow Training Operator" in condition["message"] and "kubectl apply" in condition["message"]
            assert cluster.status(manifest)["phase"] == "Pending"
        assert cluster.emu.get("v1/configmaps", NS, "no-crd-1-config") is None
        assert cluster.operator.alive()


def test_operator_killed_mid_reconcile_makes_no_duplicates(tmp_path):
    with own_cluster(tmp_path) as cluster:
        fault = cluster.emu.fail_next("POST", PYTORCHJOBS, status=500, times=10**6)
        manifest = teacher("crash-run")
        cluster.apply(manifest)
        wait_for(
            lambda: cluster.emu.get("apps/v1/deployments", NS, "crash-run-student") and fault.hits >= 1,
            timeout=TIMEOUT,
            what="a reconciliation stuck on the PyTorchJob",
        )
        cluster.operator.kill()
        fault.times = 0
        cluster.operator.start()
        wait_children(cluster, "crash-run")
        cluster.wait_status(manifest, lambda s: s.get("children"), "status after restart")
        for resource, name in children_of("crash-run").values():
            created = [c for c in cluster.emu.writes(resource, name=name) if c.method == "POST" and c.status == 201]
            assert len(created) == 1, f"{name} created {len(created)} times"


def _rules_file() -> dict:
    import yaml

    return yaml.safe_load((REPO / "charts/atlas-operator/files/rbac-rules.yaml").read_text())


def _rbac_rules(*sections: str) -> set[tuple[str, str, str]]:
    rules = _rules_file()
    return {
        (group, resource, verb)
        for scope in sections
        for rule in rules[scope]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def jobset_life(cluster) -> dict:
    """A JobSet run's life, up to its deletion: the JobSet created, its status followed (the jobsets watch),
    suspended and resumed (patched), its result read from the trainer pods it lists. Returns the run."""
    from atlas_contract.results import result_message
    from tests.support.jobset_world import TRAINER_RUNNING, condition, set_jobset_status, trainer_pod, wait_jobset

    manifest = teacher("rbac-jobset", backend="JobSet", checkpoint={"pvc": "ckpt"})
    cluster.apply(manifest)
    js = wait_jobset(cluster, "rbac-jobset")
    set_jobset_status(cluster, "rbac-jobset", TRAINER_RUNNING)
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "the JobSet run Running")
    for suspend in (True, False):
        cluster.patch_spec(manifest, {"suspend": suspend})
        wait_for(
            lambda flag=suspend: cluster.emu.get(JOBSETS, NS, "rbac-jobset")["spec"]["suspend"] is flag,
            timeout=TIMEOUT,
            what=f"the JobSet's suspend {suspend}",
        )
    trainer_pod(cluster, js, 0, 0, result_message(7, 0.5))
    done = [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
    set_jobset_status(cluster, "rbac-jobset", {"trainer": {"succeeded": 1}}, done, terminal="Completed")
    cluster.wait_status(manifest, lambda s: s.get("result") == {"step": 7, "reward": 0.5}, "the JobSet run's result")
    return manifest


def trainjob_life(cluster) -> dict:
    """A TrainJob run's life, up to its deletion: the runtime read, the TrainJob created, the JobSet the Trainer makes
    of it followed (the jobsets watch), suspended and resumed (the TrainJob patched), its result read from the trainer
    pods the JobSet lists. Returns the run."""
    from atlas_contract.results import result_message
    from harness.kube_emulator import TRAINJOBS
    from tests.support.jobset_world import (
        condition,
        create_trainer_jobset,
        install_trainjob_runtime,
        set_jobset_status,
        set_trainjob_status,
        trainer_pod,
    )

    runtime = install_trainjob_runtime(cluster)
    manifest = teacher("rbac-trainjob", backend="TrainJob", checkpoint={"pvc": "ckpt"})
    cluster.apply(manifest)
    tj = wait_for(lambda: cluster.emu.get(TRAINJOBS, NS, "rbac-trainjob"), timeout=TIMEOUT, what="the TrainJob")
    js = create_trainer_jobset(cluster, tj, runtime)
    set_jobset_status(cluster, "rbac-trainjob", {"node": {"active": 1}})
    set_trainjob_status(cluster, "rbac-trainjob", jobs={"node": {"active": 1}})
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "the TrainJob run Running")
    for suspend in (True, False):
        cluster.patch_spec(manifest, {"suspend": suspend})
        wait_for(
            lambda flag=suspend: cluster.emu.get(TRAINJOBS, NS, "rbac-trainjob")["spec"]["suspend"] is flag,
            timeout=TIMEOUT,
            what=f"the TrainJob's suspend {suspend}",
        )
    trainer_pod(cluster, js, 0, 0, result_message(5, 0.25))
    done = [condition("Completed", True, "AllJobsCompleted", "jobset completed successfully")]
    set_jobset_status(cluster, "rbac-trainjob", {"node": {"succeeded": 1}}, done, terminal="Completed")
    complete = condition("Complete", True, "AllJobsCompleted", "jobset completed successfully")
    set_trainjob_status(cluster, "rbac-trainjob", [complete], jobs={"node": {"succeeded": 1}})
    cluster.wait_status(manifest, lambda s: s.get("result") == {"step": 5, "reward": 0.25}, "the TrainJob run's result")
    return manifest


def names_and_backends_life(cluster) -> list[dict]:
    """What deletes a child now that a run's deletion is the garbage collector's: a name found taken (what the pass
    created taken back, every name looked at), a backend changed (the other job deleted), and a run an earlier
    operator gave its finalizer (kopf takes it off: the runs' patch). Returns the runs."""
    from harness.kube_emulator import TRAINJOBS

    taken = []
    for backend, (group, version, plural) in {
        "PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"),
        "TrainJob": ("trainer.kubeflow.org", "v1alpha1", "trainjobs"),
    }.items():
        name = f"rbac-{backend.lower()}-taken"
        foreign = {"apiVersion": f"{group}/{version}", "kind": backend, "metadata": {"name": name}, "spec": {}}
        cluster.custom.create_namespaced_custom_object(group, version, NS, plural, foreign)
        run = teacher(name, backend=backend)
        cluster.apply(run)
        cluster.wait_status(
            run,
            lambda s, r=run: (cluster.condition(r, "ChildrenReady") or {}).get("reason") == "NameConflict",
            "the name conflict",
        )
        wait_for(
            lambda n=name: cluster.emu.get("v1/configmaps", NS, f"{n}-config") is None,
            timeout=TIMEOUT,
            what="what the pass created taken back",
        )
        taken.append(run)
    switched = []
    for backend, job in (("JobSet", JOBSETS), ("TrainJob", TRAINJOBS)):
        run = training(f"rbac-{backend.lower()}-switch", backend=backend, checkpoint={"pvc": "ckpt"})  # keeps progress
        cluster.apply(run)
        wait_for(lambda r=run, j=job: cluster.emu.get(j, NS, r["metadata"]["name"]), timeout=TIMEOUT, what=backend)
        cluster.patch_spec(run, {"backend": "PyTorchJob"})
        wait_for(
            lambda r=run, j=job: cluster.emu.get(j, NS, r["metadata"]["name"]) is None,
            timeout=TIMEOUT,
            what=f"the {backend} deleted at the backend's change",
        )
        switched.append(run)
    legacy = [teacher("rbac-legacy-teacher"), training("rbac-legacy-training")]
    for run in legacy:
        run["metadata"]["finalizers"] = ["atlas.arc.computer/cleanup"]  # tests/fixtures/upgrade/ runs carry it
        cluster.apply(run)
        wait_children(cluster, run["metadata"]["name"], teacher_run=run["kind"] == "AtlasTeacher")
    return [*taken, *switched, *legacy]


def test_chart_rbac_is_exactly_what_the_operator_calls(tmp_path):
    """Every (group, resource, verb) the operator process uses — its own client and kopf's — over the whole life
    of a PyTorchJob run, a JobSet run and a TrainJob run, against the chart's RBAC rules: nothing missing, nothing
    unused."""
    with own_cluster(tmp_path) as cluster:
        core = kubernetes.client.CoreV1Api(cluster.api_client)
        core.create_namespaced_persistent_volume_claim(
            NS,
            {
                "metadata": {"name": "ckpt"},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
            },
        )
        core.create_namespaced_config_map(NS, {"metadata": {"name": "judges"}, "data": {"reward.yaml": "judges: []"}})
        manifest = teacher(
            "rbac-run",
            checkpoint={"pvc": "ckpt"},
            imagePullSecrets=[{"name": "regcred"}],
            reward={"configMapRef": {"name": "judges"}},
        )
        cluster.apply(manifest)
        objects = wait_children(cluster, "rbac-run")
        # The pull Secret is missing: the kubelet says so on the pod, the run shows it (pods: list, watch).
        master_pull_backoff(cluster, manifest, objects)
        core.delete_namespaced_pod("rbac-run-master-0", NS)
        # A drifted NetworkPolicy is patched back (networkpolicies: patch).
        networking = kubernetes.client.NetworkingV1Api(cluster.api_client)
        networking.patch_namespaced_network_policy("rbac-run-network", NS, {"spec": {"ingress": [{}]}})
        wait_for(
            lambda: (
                cluster.emu.get(NETWORK_POLICIES, NS, "rbac-run-network")["spec"]["ingress"]
                == objects["network"]["spec"]["ingress"]
            ),
            timeout=TIMEOUT,
            what="a drifted NetworkPolicy patched back",
        )
        # A deleted one is made again; the watch no longer shows what the operator wrote, so it asks (get).
        networking.delete_namespaced_network_policy("rbac-run-network-trainer", NS)
        wait_for(
            lambda: cluster.emu.get(NETWORK_POLICIES, NS, "rbac-run-network-trainer"),
            timeout=TIMEOUT,
            what="a deleted NetworkPolicy made again",
        )
        cluster.set_job_conditions("rbac-run", "Created", "Running")
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
        cluster.patch_spec(manifest, {"suspend": True})  # patches the job and the servers
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Suspended", "Suspended")
        job_uid = cluster.emu.get(PYTORCHJOBS, NS, "rbac-run")["metadata"]["uid"]
        cluster.patch_spec(
            manifest, {"training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 99}}
        )  # recreates the job
        wait_for(
            lambda: (
                (cluster.emu.get(PYTORCHJOBS, NS, "rbac-run") or {}).get("metadata", {}).get("uid")
                not in (None, job_uid)
            ),
            timeout=TIMEOUT,
            what="the job recreated",
        )
        # The job succeeds: the Master pod's termination message becomes .status.result (pods: get).
        from atlas_contract.results import result_message

        cluster.finish_master_pod("rbac-run", result_message(99, 0.5))
        cluster.set_job_conditions("rbac-run", "Created", "Running", "Succeeded")
        cluster.wait_status(manifest, lambda s: s.get("result") == {"step": 99, "reward": 0.5}, "the result")
        kubernetes.client.AppsV1Api(cluster.api_client).delete_namespaced_deployment("rbac-run-student", NS)
        wait_for(lambda: cluster.emu.get("apps/v1/deployments", NS, "rbac-run-student"), timeout=TIMEOUT)
        core.patch_namespaced_service("rbac-run-metrics", NS, {"spec": {"ports": [{"name": "metrics", "port": 1}]}})
        wait_for(
            lambda: cluster.emu.get("v1/services", NS, "rbac-run-metrics")["spec"]["ports"][0]["port"] == 9400,
            timeout=TIMEOUT,
            what="a drifted Service patched back",
        )
        other = training("rbac-training")
        cluster.apply(other)
        cluster.wait_status(other, lambda s: s.get("phase") == "Pending", "the AtlasTraining reconciled")
        wait_children(cluster, "rbac-training", teacher_run=False)
        cluster.set_job_conditions("rbac-training", "Created", "Running")  # a job event reads its run (get)
        cluster.wait_status(other, lambda s: s.get("phase") == "Running", "the AtlasTraining Running")
        gang = jobset_life(cluster)
        trainjob = trainjob_life(cluster)
        runs = [manifest, other, gang, trainjob, *names_and_backends_life(cluster)]
        for run in runs:
            cluster.delete_run(run)
            wait_for(lambda r=run: cluster.run(r) is None, timeout=TIMEOUT, what="the run deleted")
        used = permissions_used(cluster.emu)
        assert operator_secret_calls(cluster) == []
    granted = _rbac_rules("namespaced", "cluster", "allNamespaces")  # rbac.scope: cluster, every namespace
    assert not [r for section in _rules_file().values() for r in section if "secrets" in r["resources"]]
    assert used - granted == set(), "calls the chart's RBAC does not allow"
    assert not (granted - used), f"permissions the operator never uses: {sorted(granted - used)}"


def test_watching_one_namespace_leaves_the_others_alone(tmp_path):
    """`atlas operator -n team-a` (what the chart's namespaced RBAC runs): runs elsewhere are not touched."""
    with own_cluster(tmp_path, operator_args=("--namespace", NS), namespaces=(NS, "team-b")) as cluster:
        elsewhere = training("elsewhere-run")
        elsewhere["metadata"]["namespace"] = "team-b"
        cluster.custom.create_namespaced_custom_object(
            "atlas.arc.computer", "v1alpha1", "team-b", "atlastrainings", elsewhere
        )
        manifest = training("watched-run")
        cluster.apply(manifest)
        wait_children(cluster, "watched-run", teacher_run=False)
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")
        assert "status" not in cluster.emu.get("atlas.arc.computer/v1alpha1/atlastrainings", "team-b", "elsewhere-run")
        assert not cluster.emu.calls(lambda c: c.namespace == "team-b" and c.is_write and c.method != "POST")
        assert cluster.emu.get("v1/configmaps", "team-b", "elsewhere-run-config") is None
        used = permissions_used(cluster.emu)
    granted = _rbac_rules("namespaced", "cluster")  # rbac.scope: namespaced (or cluster with watchNamespaces)
    assert used - granted == set(), "calls the namespaced RBAC does not allow"
    # Named namespaces are served as named: kopf neither lists Namespaces (which no scope grants: its 403s held the
    # first run back ~55 s) nor follows CRDs.
    assert not {p for p in used if p[1] in ("namespaces", "customresourcedefinitions")}


def test_network_policies_go_when_the_setting_is_turned_off(tmp_path):
    """ATLAS_NETWORK_POLICY=false (chart: operator.networkPolicy): an operator restarted with it deletes the
    NetworkPolicies its runs had and drops them from status.children; the rest of the run stays."""
    with own_cluster(tmp_path) as cluster:
        manifest = training("netoff-run")
        cluster.apply(manifest)
        wait_children(cluster, "netoff-run", teacher_run=False)
        cluster.wait_status(manifest, lambda s: "networkPolicy" in (s.get("children") or {}), "policies in children")
        cluster.restart_operator(tmp_path / "operator-off.log", ATLAS_NETWORK_POLICY="false")
        status = cluster.wait_status(
            manifest, lambda s: "networkPolicy" not in (s.get("children") or {}), "policies dropped from children"
        )
        assert "trainerNetworkPolicy" not in status["children"] and status["children"]["pytorchJob"] == "netoff-run"
        for name in ("netoff-run-network", "netoff-run-network-trainer"):
            wait_for(lambda n=name: cluster.emu.get(NETWORK_POLICIES, NS, n) is None, timeout=TIMEOUT, what=name)
        assert cluster.emu.get(PYTORCHJOBS, NS, "netoff-run") is not None
        wait_for(
            lambda: any(e["reason"] == "NetworkPolicyOff" for e in cluster.events("netoff-run")),
            timeout=TIMEOUT,
            what="a NetworkPolicyOff Event",
        )


def test_a_pod_that_cannot_start_still_shows_after_the_operator_restarts(tmp_path):
    """The runs' pods are listed when the operator starts: a pod the kubelet could not start before keeps its run's
    PodsStarted=False, though the pod does not change again."""
    with own_cluster(tmp_path) as cluster:
        manifest = training("stuck-restart")
        cluster.apply(manifest)
        objects = wait_children(cluster, "stuck-restart", teacher_run=False)
        master_pull_backoff(cluster, manifest, objects)
        cluster.restart_operator(tmp_path / "operator-2.log")
        cluster.patch_spec(manifest, {"training": {"maxSteps": 20}})  # reconciled by the restarted operator
        cluster.wait_status(
            manifest,
            lambda s: (
                s.get("observedGeneration") == 2
                and cluster.condition(manifest, "PodsStarted").get("reason") == "ImagePullBackOff"
            ),
            "the stuck pod reported by the restarted operator",
        )


def test_run_phase_follows_its_job_without_waiting_for_the_timer(tmp_path):
    """The operator watches PyTorchJobs: a condition change shows on the run long before the next
    status refresh (set to 10 minutes here)."""
    with own_cluster(tmp_path, operator_env={"ATLAS_PROGRESS_INTERVAL": "600"}) as cluster:
        manifest = training("watch-run")
        cluster.apply(manifest)
        wait_children(cluster, "watch-run", teacher_run=False)
        cluster.wait_status(manifest, lambda s: s.get("phase") == "Pending", "Pending")
        for conditions, phase in (
            (("Created", "Running"), "Running"),
            (("Created", "Running", "Succeeded"), "Succeeded"),
        ):
            cluster.set_job_conditions("watch-run", *conditions)
            cluster.wait_status(manifest, lambda s, p=phase: s.get("phase") == p, phase, timeout=10)
        wait_for(lambda: {"Running", "Succeeded"} <= {e["reason"] for e in cluster.events("watch-run")}, timeout=10)


def test_a_child_the_api_server_rejects_is_reported_not_retried_in_a_loop(tmp_path):
    """The API server refuses a child as rendered (422): a ChildrenReady=False condition and a Warning Event
    name the child and the server's message, and the operator does not resend it in a hot loop; once the
    cause is gone, the next reconciliation creates it."""
    with own_cluster(tmp_path, operator_env={"ATLAS_PROGRESS_INTERVAL": "600"}) as cluster:
        refusal = 'Deployment.apps "rejected-run-rollout" is invalid: spec.template: Invalid value: admission policy'
        fault = cluster.emu.fail_next(
            "POST",
            "apps/v1/deployments",
            status=422,
            times=1000,
            namespace=NS,
            reason="Invalid",
            message=refusal,
        )
        manifest = training("rejected-run")
        cluster.apply(manifest)
        status = cluster.wait_status(
            manifest,
            lambda s: cluster.condition(manifest, "ChildrenReady").get("reason") == "ChildRejected",
            "ChildrenReady False",
        )
        message = cluster.condition(manifest, "ChildrenReady")["message"]
        assert "Deployment rejected-run-rollout: 422 Invalid" in message and "admission policy" in message
        assert status["phase"] == "Pending"
        wait_for(lambda: "ChildRejected" in {e["reason"] for e in cluster.events("rejected-run")}, timeout=TIMEOUT)
        # Another run reconciles meanwhile (seconds of operator time): the refused POST was not repeated.
        other = training("other-run", rollout={"replicas": 0})  # no Deployment: the fault is not its business
        cluster.apply(other)
        wait_for(lambda: cluster.status(other).get("children"), timeout=TIMEOUT, what="other-run reconciled")
        assert fault.hits == 1
        fault.times = fault.hits  # the cause is gone (say, the admission policy was fixed)
        cluster.patch_spec(manifest, {"training": {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 11}})
        wait_children(cluster, "rejected-run", teacher_run=False)
        cluster.wait_status(
            manifest, lambda s: cluster.condition(manifest, "ChildrenReady").get("status") == "True", "ChildrenReady"
        )


def test_an_invalid_edit_of_a_running_run_keeps_reporting_its_job(cluster):
    """An edit that makes a running run invalid changes nothing that runs: the job goes on, the phase follows
    it, Valid=False and SpecApplied=False name the problems."""
    manifest = training("edited-run")
    cluster.apply(manifest)
    objects = wait_children(cluster, "edited-run", teacher_run=False)
    cluster.set_job_conditions("edited-run", "Created", "Running")
    cluster.wait_status(manifest, lambda s: s.get("phase") == "Running", "Running")
    cluster.patch_spec(manifest, {"training": {"perDeviceTrainBatchSize": 4, "numGenerations": 5, "maxSteps": 10}})
    cluster.wait_status(
        manifest, lambda s: cluster.condition(manifest, "Valid").get("status") == "False", "Valid False"
    )
    status = cluster.status(manifest)
    assert status["phase"] == "Running" and status["children"]["pytorchJob"] == "edited-run"
    applied = cluster.condition(manifest, "SpecApplied")
    assert applied["status"] == "False" and "numGenerations: 5 does not divide" in applied["message"]
    assert cluster.condition(manifest, "Training")["status"] == "True"
    job = cluster.emu.get(PYTORCHJOBS, NS, "edited-run")
    assert job["metadata"]["uid"] == objects["job"]["metadata"]["uid"]  # not recreated, not deleted
