"""The TrainJob backend (atlas_operator.backends.trainjob): the TrainJob and the chart's ClusterTrainingRuntime against
the Kubeflow Trainer v2.3.0 CRDs (schemas and CEL rules) and webhooks, and the JobSet the Trainer builds of them
(tests/support/trainer_jobset.py) against the JobSet v0.12.0 CRD and webhook, with a trainer pod like the
JobSet backend's."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from atlas_operator.backends.trainjob import training_runtime
from atlas_operator.manifests import render_children
from atlas_operator.render import Images
from atlas_operator.validation import parse_run

from atlas_contract.names import QUEUE_NAME_LABEL, STOP_EXIT_CODE, TRAINJOB_RUNTIME, WATCHDOG_EXIT_CODE
from harness.manifests import teacher, training
from tests.support.cel_admission import admission_refusals
from tests.support.k8s_schemas import (
    KUBE_VERSION,
    RUNTIME_CRD_NAME,
    TRAINJOB_CRD_NAME,
    crd_schemas,
    jobset_openapi_schema,
    jobset_schema,
    jobset_webhook_problems,
    openapi_validate,
    pruned_fields,
)
from tests.support.render import EXAMPLES, POLICIES
from tests.support.trainer_jobset import (
    build_jobset,
    runtime_webhook_problems,
    trainjob_webhook_problems,
)

RUNTIME = training_runtime(TRAINJOB_RUNTIME, Images().trainer, max_restarts=3)

TRAINJOB_RUNS = {
    "teacher": teacher(backend="TrainJob"),
    "teacher-queued-suspended-pvc": teacher(
        backend="TrainJob", queueName="team-a-gpus", suspend=True, checkpoint={"pvc": "ckpt"}
    ),
    "teacher-no-student-server": teacher(backend="TrainJob", student={"model": "m/s", "rollout": {"replicas": 0}}),
    "training-no-rollout-1-node": training(
        backend="TrainJob", rollout={"replicas": 0}, resources={"nodes": 1, "gpusPerNode": 8}
    ),
    "training-3-nodes-pvc-placed": training(
        backend="TrainJob",
        resources={
            "nodes": 3,
            "gpusPerNode": 8,
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        checkpoint={"pvc": "ckpt", "path": "/ckpt"},
        imagePullSecrets=[{"name": "regcred"}],
        serviceAccountName="trainer",
        env=[{"name": "API_KEY", "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}}}],
        terminationGracePeriodSeconds=45,
    ),
    "training-3-cpu-nodes-queued": training(
        backend="TrainJob", resources={"nodes": 3, "gpusPerNode": 0, "cpu": "4"}, rollout={"replicas": 0}, queueName="q"
    ),
}


def trainjob_of(manifest, default_backend=None):
    objects = render_children(parse_run(manifest, default_backend=default_backend), Images())
    (tj,) = [o for o in objects if o["kind"] == "TrainJob"]
    return objects, tj


def trainer_pod(js):
    (node,) = [r for r in js["spec"]["replicatedJobs"] if r["name"] == "node"]
    return node, node["template"]["spec"]["template"]


def test_the_runtime_matches_the_crd_and_the_webhook():
    schema, structural = crd_schemas(RUNTIME_CRD_NAME)
    openapi_validate(RUNTIME, schema)
    assert pruned_fields(RUNTIME, structural) == []
    assert [r.message for r in admission_refusals(RUNTIME, schema=structural)] == []
    assert runtime_webhook_problems(RUNTIME) == []
    template = RUNTIME["spec"]["template"]["spec"]
    # The JobSet webhook takes the runtime's template as a JobSet (once the Trainer sets the counts).
    assert jobset_webhook_problems({"metadata": {"name": "r"}, "spec": build_jobset(_bare("r"), RUNTIME)["spec"]}) == []
    assert template["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["node"]}
    assert template["failurePolicy"]["maxRestarts"] == 3


def _bare(name):
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name}, "spec": {}}


@pytest.mark.parametrize("manifest", list(TRAINJOB_RUNS.values()), ids=list(TRAINJOB_RUNS))
def test_rendered_trainjob_matches_the_crd_the_webhooks_and_builds_a_valid_jobset(manifest):
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    nodes = spec["resources"]["nodes"]
    objects, tj = trainjob_of(manifest)
    schema, structural = crd_schemas(TRAINJOB_CRD_NAME)
    openapi_validate(tj, schema)
    assert pruned_fields(tj, structural) == []
    assert [r.message for r in admission_refusals(tj, schema=structural)] == []
    assert trainjob_webhook_problems(tj, RUNTIME) == []
    # The servers beside it, as on PyTorchJob; the TrainJob last.
    kinds = [o["kind"] for o in objects]
    assert kinds[: len(POLICIES)] == POLICIES and kinds[-1] == "TrainJob"
    servers = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    expected = [f"{name}-rollout"] * bool(spec["rollout"]["replicas"])
    if manifest["kind"] == "AtlasTeacher" and spec["student"]["rollout"].get("replicas", 1):
        expected.append(f"{name}-student")
    assert servers == expected

    assert tj["spec"]["runtimeRef"] == {
        "name": TRAINJOB_RUNTIME,
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    queued = bool(spec.get("queueName"))
    assert tj["spec"]["suspend"] == (bool(spec.get("suspend")) or queued)
    assert tj["metadata"]["labels"].get(QUEUE_NAME_LABEL) == spec.get("queueName")

    # The JobSet the Trainer makes of it: valid, and a trainer pod as on the JobSet backend.
    js = build_jobset({**tj, "metadata": {**tj["metadata"], "uid": "u-1"}}, RUNTIME)
    openapi_validate(js, jobset_schema())
    assert pruned_fields(js, jobset_openapi_schema()) == []
    assert jobset_webhook_problems(js) == []
    assert js["metadata"]["labels"]["app.kubernetes.io/instance"] == name  # the operator's watch sees it
    node, pod = trainer_pod(js)
    job = node["template"]["spec"]
    kubernetes_validate.validate(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-node-0"}, "spec": job},
        KUBE_VERSION,
        strict=True,
    )
    assert job["parallelism"] == job["completions"] == nodes and job["completionMode"] == "Indexed"
    assert job["backoffLimit"] == 0 and pod["spec"]["restartPolicy"] == "Never"
    # The runtime's: the watchdog's exit fails the Job (first); a stop on SIGTERM (143) and a disrupted pod do not
    # count: the Job recreates the pod.
    assert job["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "node", "operator": "In", "values": [WATCHDOG_EXIT_CODE]},
        },
        {"action": "Ignore", "onExitCodes": {"containerName": "node", "operator": "In", "values": [STOP_EXIT_CODE]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]
    # The grace period through the runtime patch (a PodSpecPatch field), the run's own.
    assert pod["spec"]["terminationGracePeriodSeconds"] == spec.get("terminationGracePeriodSeconds", 600)
    assert pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PET_NNODES"]["value"] == str(nodes)
    assert env["PET_MASTER_ADDR"]["value"] == f"{name}-node-0-0.{name}"
    assert "$PET_MASTER_ADDR" in container["command"][-1] and "$PET_MASTER_PORT" in container["command"][-1]
    assert not any(e.startswith("MASTER_") for e in env)  # the Trainer's names, not ours

    # The same pod as the JobSet backend's trainer, but for what each controller names or injects.
    jobset_pod = _jobset_trainer_pod(manifest)
    for field in (
        "volumes",
        "securityContext",
        "nodeSelector",
        "tolerations",
        "imagePullSecrets",
        "terminationGracePeriodSeconds",
    ):
        assert pod["spec"].get(field) == jobset_pod["spec"].get(field), field
    if spec.get("serviceAccountName"):
        assert pod["spec"]["serviceAccountName"] == spec["serviceAccountName"]
    (jobset_container,) = jobset_pod["spec"]["containers"]
    for field in ("image", "volumeMounts", "securityContext", "resources", "terminationMessagePath"):
        assert container.get(field) == jobset_container.get(field), field
    ours = [e for e in jobset_container["env"] if not e["name"].startswith(("PET_", "MASTER_"))]
    assert [e for e in container["env"] if not e["name"].startswith("PET_")] == ours
    assert pod["metadata"]["labels"] == jobset_pod["metadata"]["labels"]
    # the config checksum (its value differs: the run.yaml of a TrainJob run reaches its servers by their Services)
    assert pod["metadata"]["annotations"].keys() == jobset_pod["metadata"]["annotations"].keys()


def _jobset_trainer_pod(manifest):
    on_jobset = copy.deepcopy(manifest)
    on_jobset["spec"]["backend"] = "JobSet"
    (js,) = [o for o in render_children(parse_run(on_jobset), Images()) if o["kind"] == "JobSet"]
    (trainer,) = [r for r in js["spec"]["replicatedJobs"] if r["name"] == "trainer"]
    return trainer["template"]["spec"]["template"]


def test_a_changed_run_is_a_new_trainjob_as_the_crd_forbids_changing_its_trainer():
    """runtimeRef, trainer and initializer are immutable (CEL self == oldSelf): the TrainJob of a changed run would be
    refused as an update, so a changed run recreates it (as the other backends' jobs)."""
    _, before = trainjob_of(training(backend="TrainJob", checkpoint={"pvc": "ckpt"}))
    _, after = trainjob_of(training(backend="TrainJob", checkpoint={"pvc": "ckpt"}, resources={"nodes": 4}))
    _, structural = crd_schemas(TRAINJOB_CRD_NAME)
    refused = [r.message for r in admission_refusals(after, old=before, schema=structural)]
    assert any("immutable" in m for m in refused), refused
    assert before["metadata"]["annotations"] != after["metadata"]["annotations"]  # the spec hash: recreate


@pytest.mark.parametrize("example", [e for e in EXAMPLES if "trainjob" in e.name], ids=lambda p: p.name)
def test_trainjob_examples_render_valid_trainjobs(example):
    manifest = yaml.safe_load(example.read_text())
    _, tj = trainjob_of(manifest)
    schema, structural = crd_schemas(TRAINJOB_CRD_NAME)
    openapi_validate(tj, schema)
    assert pruned_fields(tj, structural) == [] and trainjob_webhook_problems(tj, RUNTIME) == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_a_valid_trainjob_on_the_trainjob_default_backend(example):
    manifest = yaml.safe_load(example.read_text())
    if manifest["spec"].get("backend"):
        manifest["spec"].pop("backend")
    _, tj = trainjob_of(manifest, default_backend="TrainJob")
    schema, structural = crd_schemas(TRAINJOB_CRD_NAME)
    openapi_validate(tj, schema)
    assert pruned_fields(tj, structural) == [] and trainjob_webhook_problems(tj, RUNTIME) == []
    assert jobset_webhook_problems(build_jobset(tj, RUNTIME)) == []
