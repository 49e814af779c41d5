"""The JobSet backend (atlas_operator.backends.jobset): the JobSet v0.12.0 CRD and webhook, pods like the PyTorchJob
backend's, name limits, restarts, the default backend and the JobSet example."""

from __future__ import annotations

import copy
import subprocess

import kubernetes_validate
import pytest
import yaml
from atlas_operator.backends import checkpoint_warning
from atlas_operator.manifests import render_children
from atlas_operator.render import Images
from atlas_operator.validation import parse_run

from atlas_contract.errors import InvalidFields
from atlas_contract.names import JOBSET_REPLICATED_JOBS, max_jobset_run_name
from harness import label_selectors
from harness.env import PYTHON, REPO, python_env
from harness.manifests import manifest_file, teacher, training, with_spec
from tests.support.k8s_schemas import (
    KUBE_VERSION,
    jobset_openapi_schema,
    jobset_schema,
    jobset_webhook_problems,
    openapi_validate,
    pruned_fields,
    pytorchjob_schema,
)
from tests.support.render import EXAMPLES, POLICIES, children, config_map_of, problem_fields

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def jobset_of(manifest, default_backend=None):
    """The rendered children of ``manifest`` (kinds in apply order) and its JobSet."""
    objects = render_children(parse_run(manifest, default_backend=default_backend), Images())
    (js,) = [o for o in objects if o["kind"] == "JobSet"]
    return objects, js


def rjobs_of(js):
    return {rjob["name"]: rjob for rjob in js["spec"]["replicatedJobs"]}


def pod_of(rjob):
    return rjob["template"]["spec"]["template"]


JOBSET_RUNS = {
    "teacher": teacher(backend="JobSet"),
    "teacher-queued-suspended-pvc": teacher(
        backend="JobSet", queueName="team-a-gpus", suspend=True, checkpoint={"pvc": "ckpt"}, maxRestarts=5
    ),
    "teacher-queued-no-student-server": teacher(
        backend="JobSet", queueName="q", student={"model": "m/s", "rollout": {"replicas": 0}}
    ),
    "teacher-tensor-parallel-student-server": teacher(
        backend="JobSet", student={"model": "m/s", "rollout": {"replicas": 1, "gpus": 2, "tensorParallelSize": 2}}
    ),
    "training-no-rollout-1-node": training(
        backend="JobSet", rollout={"replicas": 0}, resources={"nodes": 1, "gpusPerNode": 8}, maxRestarts=0
    ),
    "training-1-node": training(backend="JobSet", resources={"nodes": 1, "gpusPerNode": 8}, suspend=True),
    "training-3-nodes-pvc-grace": training(
        backend="JobSet",
        resources={"nodes": 3, "gpusPerNode": 8},
        checkpoint={"pvc": "ckpt", "path": "/ckpt"},
        terminationGracePeriodSeconds=1800,
    ),
    "training-3-cpu-nodes-queued": training(
        backend="JobSet", resources={"nodes": 3, "gpusPerNode": 0}, rollout={"replicas": 0}, queueName="q"
    ),
}


@pytest.mark.parametrize("manifest", list(JOBSET_RUNS.values()), ids=list(JOBSET_RUNS))
def test_rendered_jobset_matches_the_crd_and_the_webhook(manifest):
    """Against the real JobSet v0.12.0 CRD schema (third-party test data: nothing pruned) and its admission webhook;
    the shape docs/architecture.md gives: servers first, the Indexed trainer once they are Ready, success on the
    trainer, whole-gang restarts up to spec.maxRestarts, pods reaching each other by JobSet hostnames."""
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    nodes = spec["resources"]["nodes"]
    objects, js = jobset_of(manifest)
    openapi_validate(js, jobset_schema())
    assert pruned_fields(js, jobset_openapi_schema()) == []
    assert jobset_webhook_problems(js) == []
    assert js["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and js["metadata"]["name"] == name

    # Only the NetworkPolicies, the ConfigMap and the metrics Service beside it: no Deployments, no server Services.
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("NetworkPolicy", f"{name}-network"),
        ("NetworkPolicy", f"{name}-network-trainer"),
        ("ConfigMap", f"{name}-config"),
        ("Service", f"{name}-metrics"),
        ("JobSet", name),
    ]

    servers = []
    if spec["rollout"]["replicas"]:
        servers.append("rollout")
    if manifest["kind"] == "AtlasTeacher" and spec["student"]["rollout"].get("replicas", 1):
        servers.append("student")
    rjobs = rjobs_of(js)
    assert list(rjobs) == [*servers, "trainer"]
    assert [n for n in JOBSET_REPLICATED_JOBS if n in rjobs] == list(rjobs)  # the contract's order

    for rjob_name, rjob in rjobs.items():
        job = rjob["template"]["spec"]
        # The Job controller retries nothing: a failed pod fails its Job, and the JobSet restarts the gang.
        assert job["template"]["spec"]["restartPolicy"] == "Never", rjob_name
        assert job["backoffLimit"] == 0, rjob_name
        # Each Job, as the API server would take it (batch/v1, strict: no unknown field).
        kubernetes_validate.validate(
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"{name}-{rjob_name}-0"}, "spec": job},
            KUBE_VERSION,
            strict=True,
        )
    trainer = rjobs["trainer"]
    job = trainer["template"]["spec"]
    assert trainer["replicas"] == 1 and job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == nodes
    if servers:
        assert trainer["dependsOn"] == [{"name": server, "status": "Ready"} for server in servers]
    else:
        assert "dependsOn" not in trainer
    for server in servers:
        server_spec = spec["rollout"] if server == "rollout" else spec["student"]["rollout"]
        assert rjobs[server]["replicas"] == server_spec.get("replicas", 1)
        assert rjobs[server]["template"]["spec"]["completions"] == 1
        assert "dependsOn" not in rjobs[server]
        (container,) = pod_of(rjobs[server])["spec"]["containers"]
        assert container["readinessProbe"]["httpGet"]["port"] == "http"  # what "Ready" waits for

    assert js["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["trainer"]}
    failure = js["spec"]["failurePolicy"]
    assert failure["maxRestarts"] == spec.get("maxRestarts", 3)  # the CRD default (spec.maxRestarts)
    assert failure.get("restartStrategy", "Recreate") == "Recreate"
    # One rule: a trainer the step watchdog ended (exit code 75 → its Job's podFailurePolicy FailJob → reason
    # PodFailurePolicy) restarts the gang under a reason the operator recognises; anything else, the default action.
    (rule,) = failure["rules"]
    assert rule == {
        "name": "WatchdogExit",
        "action": "RestartJobSet",
        "onJobFailureReasons": ["PodFailurePolicy"],
        "targetReplicatedJobs": ["trainer"],
    }
    # The watchdog's exit fails the trainer's Job (first: the first matching rule decides); a stop on SIGTERM (exit
    # code 143, a checkpoint saved) and a pod Kubernetes disrupted (drain, preemption) are not counted: the Job
    # recreates the pod, with no gang restart.
    assert rjobs["trainer"]["template"]["spec"]["podFailurePolicy"] == {
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]}},
            {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [143]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    # The servers have none: a replaced server would hold the base model's weights and no weight-sync group with the
    # running trainer, so a server's disruption restarts the gang (counted).
    assert all("podFailurePolicy" not in r["template"]["spec"] for n, r in rjobs.items() if n != "trainer")
    grace = spec.get("terminationGracePeriodSeconds", 600)  # the CRD default
    assert pod_of(trainer)["spec"]["terminationGracePeriodSeconds"] == grace
    for server in servers:  # Kubernetes' default
        assert "terminationGracePeriodSeconds" not in pod_of(rjobs[server])["spec"]
    network = js["spec"]["network"]
    assert network["enableDNSHostnames"] is True
    assert "subdomain" not in network  # the hostnames below assume the JobSet's own name

    (container,) = pod_of(trainer)["spec"]["containers"]
    assert container["name"] == "trainer"
    env = {e["name"]: e for e in container["env"]}
    assert env["PET_NODE_RANK"]["valueFrom"] == {
        "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}
    }
    assert env["MASTER_ADDR"]["value"] == f"{name}-trainer-0-0.{name}"
    assert env["PET_NNODES"]["value"] == str(nodes)
    assert env["PET_NPROC_PER_NODE"]["value"] == str(max(spec["resources"]["gpusPerNode"], 1))
    assert int(env["MASTER_PORT"]["value"]) in [p["containerPort"] for p in container["ports"]]
    assert env["ATLAS_TERMINATION_GRACE_SECONDS"]["value"] == str(grace)
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]["value"] == str(grace)  # not torch's 30 s: the save is not cut short

    config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])
    if "rollout" in servers:
        assert config["trainer"]["vllm_server_base_url"] == f"http://{name}-rollout-0-0.{name}:8000"
    else:
        assert "vllm_server_base_url" not in config["trainer"]
    if "student" in servers:  # the first student server, however many replicas (the others get no traffic)
        assert config["student"] == f"http://{name}-student-0-0.{name}:8000/v1"
    elif manifest["kind"] == "AtlasTeacher":
        assert config["student"] == spec["student"]["model"]

    # Kueue: one workload for the whole set, so the queue label is on the JobSet only; created suspended.
    queue = spec.get("queueName")
    assert js["metadata"]["labels"].get(QUEUE_LABEL) == queue
    for rjob in rjobs.values():
        assert QUEUE_LABEL not in (rjob["template"].get("metadata") or {}).get("labels", {})
        assert QUEUE_LABEL not in pod_of(rjob)["metadata"]["labels"]
    assert js["spec"]["suspend"] is bool(queue or spec.get("suspend"))

    # Metrics from rank 0 only: the trainer pod of completion index 0 (the Job controller labels it so).
    metrics = next(o for o in objects if o["kind"] == "Service")
    selector = metrics["spec"]["selector"]
    trainer_pod = {**pod_of(trainer)["metadata"]["labels"], COMPLETION_INDEX: "0"}
    assert label_selectors.matches({"matchLabels": selector}, trainer_pod)
    assert not label_selectors.matches({"matchLabels": selector}, {**trainer_pod, COMPLETION_INDEX: "1"})
    for server in servers:
        assert not label_selectors.matches(
            {"matchLabels": selector}, {**pod_of(rjobs[server])["metadata"]["labels"], COMPLETION_INDEX: "0"}
        )
    assert metrics["spec"]["ports"][0]["targetPort"] in [p["name"] for p in container["ports"]]


def test_jobset_pods_are_the_pytorchjob_backends_pods():
    """Same labels, security context, placement and volumes as the PyTorchJob's Master and the server Deployments:
    only the workload around them differs (and the queue label, on the JobSet instead of each server pod)."""
    manifest = teacher(
        queueName="q",
        checkpoint={"pvc": "ckpt"},
        imagePullSecrets=[{"name": "regcred"}],
        serviceAccountName="trainer",
        resources={
            "nodes": 2,
            "gpusPerNode": 8,
            "cpu": "32",
            "memory": "500Gi",
            "nodeSelector": {"pool": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        env=[{"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {"name": "rim", "key": "k"}}}],
    )
    on_pytorchjob = children(manifest)
    _, js = jobset_of(with_spec(manifest, backend="JobSet"))
    rjobs = rjobs_of(js)
    pairs = [
        (
            pod_of(rjobs["trainer"]),
            on_pytorchjob[("PyTorchJob", "teacher-run")]["spec"]["pytorchReplicaSpecs"]["Master"],
        ),
        (pod_of(rjobs["rollout"]), on_pytorchjob[("Deployment", "teacher-run-rollout")]["spec"]),
        (pod_of(rjobs["student"]), on_pytorchjob[("Deployment", "teacher-run-student")]["spec"]),
    ]
    for jobset_pod, other in pairs:
        other_pod = other["template"]
        other_labels = {k: v for k, v in other_pod["metadata"]["labels"].items() if k != QUEUE_LABEL}
        assert jobset_pod["metadata"]["labels"] == other_labels
        assert jobset_pod["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
        ours, theirs = jobset_pod["spec"], other_pod["spec"]
        assert ours.pop("restartPolicy") == "Never"
        assert ours["securityContext"]["runAsNonRoot"] is True
        assert ours["automountServiceAccountToken"] is False
        for key in set(theirs) | set(ours):
            if key != "containers":
                assert ours.get(key) == theirs.get(key), key
        (mine,), (kubeflows,) = ours["containers"], theirs["containers"]
        for key in ("image", "securityContext", "resources", "volumeMounts", "command"):
            assert mine.get(key) == kubeflows.get(key), key
        kubeflow_env = {e["name"]: e for e in kubeflows["env"]}
        assert {e["name"]: e for e in mine["env"] if e["name"] in kubeflow_env} == kubeflow_env
    trainer_env = {e["name"] for e in pod_of(rjobs["trainer"])["spec"]["containers"][0]["env"]}
    # What Kubeflow injects into PyTorchJob pods, the JobSet trainer is given by the operator.
    assert {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "MASTER_ADDR", "MASTER_PORT"} <= trainer_env


def test_atlas_render_default_backend(tmp_path):
    """`atlas render --default-backend JobSet` and ATLAS_DEFAULT_BACKEND=JobSet render a run without spec.backend
    as a JobSet; a run's spec.backend PyTorchJob wins; the flag wins over the environment."""
    path = manifest_file(tmp_path, teacher(checkpoint={"pvc": "ckpt"}), teacher("pinned-run", backend="PyTorchJob"))

    def render(*args, **env):
        proc = subprocess.run(
            [PYTHON, "-m", "atlas_cli.main", "render", *args, str(path)],
            capture_output=True,
            text=True,
            env=python_env(**env),
        )
        assert proc.returncode == 0, proc.stderr
        return [
            (d["kind"], d["metadata"]["name"])
            for d in yaml.safe_load_all(proc.stdout)
            if d["kind"] not in ("ConfigMap", "NetworkPolicy")
        ]

    pinned = [
        ("Service", "pinned-run-rollout"),
        ("Service", "pinned-run-student"),
        ("Service", "pinned-run-metrics"),
        ("Deployment", "pinned-run-rollout"),
        ("Deployment", "pinned-run-student"),
        ("PyTorchJob", "pinned-run"),
    ]
    on_jobset = [("Service", "teacher-run-metrics"), ("JobSet", "teacher-run"), *pinned]
    assert render("--default-backend", "JobSet") == on_jobset
    assert render(ATLAS_DEFAULT_BACKEND="JobSet") == on_jobset
    on_pytorchjob = render("--default-backend", "PyTorchJob", ATLAS_DEFAULT_BACKEND="JobSet")
    assert ("PyTorchJob", "teacher-run") in on_pytorchjob and not any(k == "JobSet" for k, _ in on_pytorchjob)


@pytest.mark.parametrize("nodes", [1, 3, 11])
def test_run_name_too_long_for_jobset_is_invalid(nodes):
    """The longest name JobSet takes: its webhook refuses a set whose pod names (<name>-trainer-0-<node>-<5
    random>) pass 63 characters. One more character: Invalid, naming metadata.name (and fine on PyTorchJob)."""
    resources = {"nodes": nodes, "gpusPerNode": 8}
    longest = max_jobset_run_name(nodes)
    ok = training("r" * longest, backend="JobSet", resources=resources)
    _, js = jobset_of(ok)
    assert jobset_webhook_problems(js) == []
    too_long = training("r" * (longest + 1), backend="JobSet", resources=resources)
    assert problem_fields(too_long) == ["metadata.name"]
    with pytest.raises(InvalidFields, match="JobSet backend"):
        parse_run(too_long)
    assert parse_run(with_spec(too_long, backend="PyTorchJob")).backend == "PyTorchJob"
    # The limit is not stricter than JobSet's: rendered anyway, the webhook would refuse that name.
    forced = parse_run(with_spec(too_long, backend="PyTorchJob"))
    forced.backend = "JobSet"
    (js,) = [o for o in render_children(forced) if o["kind"] == "JobSet"]
    assert any("longest pod name" in p for p in jobset_webhook_problems(js))


def test_max_restarts_sets_both_backends_retries():
    """spec.maxRestarts: the JobSet's failurePolicy.maxRestarts, the PyTorchJob's runPolicy.backoffLimit."""
    for max_restarts in (0, 7):
        manifest = teacher(maxRestarts=max_restarts)
        job = children(manifest)[("PyTorchJob", "teacher-run")]
        assert job["spec"]["runPolicy"]["backoffLimit"] == max_restarts
        openapi_validate(job, pytorchjob_schema())
        _, js = jobset_of(with_spec(manifest, backend="JobSet"))
        assert js["spec"]["failurePolicy"]["maxRestarts"] == max_restarts
    default = children(teacher())[("PyTorchJob", "teacher-run")]
    assert default["spec"]["runPolicy"]["backoffLimit"] == 3  # the CRD default (spec.maxRestarts)


def test_jobset_without_a_pvc_warns_that_a_restart_starts_over(tmp_path):
    """A JobSet restart replaces every pod: without spec.checkpoint.pvc even a 1-node run loses its checkpoints
    (on PyTorchJob one node restarts in place and keeps them)."""
    one_node = training(resources={"nodes": 1, "gpusPerNode": 8})
    assert checkpoint_warning(parse_run(one_node)) is None
    warning = checkpoint_warning(parse_run(with_spec(one_node, backend="JobSet")))
    assert warning and warning.startswith("spec.checkpoint.pvc: not set") and "JobSet restart" in warning
    assert checkpoint_warning(parse_run(with_spec(one_node, backend="JobSet", checkpoint={"pvc": "ckpt"}))) is None
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "atlas_cli.main",
            "render",
            "--default-backend",
            "JobSet",
            str(manifest_file(tmp_path, one_node)),
        ],
        capture_output=True,
        text=True,
        env=python_env(),
    )
    assert proc.returncode == 0 and proc.stderr == f"warning: grpo-run: {warning}\n"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_render_a_valid_jobset(path):
    """Every example, on the JobSet backend (its own spec.backend, else the operator's default JobSet): a JobSet
    the CRD and the webhook take."""
    for document in yaml.safe_load_all(path.read_text()):
        run = parse_run(document, default_backend="JobSet")
        if document["spec"].get("backend", "JobSet") != "JobSet":
            continue
        (js,) = [o for o in render_children(run) if o["kind"] == "JobSet"]
        openapi_validate(js, jobset_schema())
        assert pruned_fields(js, jobset_openapi_schema()) == []
        assert jobset_webhook_problems(js) == []


def test_jobset_example():
    """examples/teacher-jobset.yaml: on the JobSet backend whatever the operator's default, restarts resuming from
    its PVC, no queue unless one is uncommented."""
    (document,) = yaml.safe_load_all((REPO / "examples/teacher-jobset.yaml").read_text())
    run = parse_run(document, default_backend="PyTorchJob")
    assert run.backend == "JobSet" and checkpoint_warning(run) is None
    objects = render_children(run)
    assert [o["kind"] for o in objects] == [*POLICIES, "ConfigMap", "Service", "JobSet"]
    js = objects[-1]
    assert js["spec"]["failurePolicy"]["maxRestarts"] == 3 and js["spec"]["suspend"] is False
    assert QUEUE_LABEL not in js["metadata"]["labels"]
    assert list(rjobs_of(js)) == ["rollout", "student", "trainer"]
    text = (REPO / "examples/teacher-jobset.yaml").read_text()
    assert "# queueName:" in text  # the commented-out queue, explained
    queued = with_spec(document, queueName="team-a")
    _, js = jobset_of(queued)
    assert js["metadata"]["labels"][QUEUE_LABEL] == "team-a" and js["spec"]["suspend"] is True
    assert jobset_webhook_problems(js) == []
    # The webhook stand-in is no rubber stamp: it refuses what JobSet v0.12.0 refuses.
    broken = copy.deepcopy(js)
    broken["spec"]["replicatedJobs"].reverse()  # the trainer first, depending on jobs after it
    broken["spec"]["successPolicy"]["targetReplicatedJobs"] = ["trainers"]
    broken["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"].pop("restartPolicy")
    problems = jobset_webhook_problems(broken)
    assert "DependsOn can't be set for the first ReplicatedJob" in problems
    assert "replicatedJob: trainer cannot depend on replicatedJob: rollout" in problems
    assert "invalid replicatedJob name 'trainers' does not appear in .spec.ReplicatedJobs" in problems
    assert any("restartPolicy: None" in p for p in problems)


def test_jobset_takes_one_replica_per_server():
    """On JobSet the trainer reaches the student server by its pod's hostname (no Service in front): a second
    replica would hold GPUs and serve nothing, so more than one is Invalid, naming the field (PyTorchJob's Service
    spreads them; the rollout server is one on either backend)."""
    manifest = teacher(backend="JobSet", student={"model": "m/s", "rollout": {"replicas": 3}})
    with pytest.raises(InvalidFields) as invalid:
        parse_run(manifest)
    (problem,) = invalid.value.problems
    assert problem.startswith("spec.student.rollout.replicas: expected 0 or 1 with the JobSet backend"), problem
    assert parse_run(with_spec(manifest, backend="PyTorchJob")).backend == "PyTorchJob"
