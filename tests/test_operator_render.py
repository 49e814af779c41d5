"""The operator's pure half: spec models → CRDs, validation, rendered children, status logic."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from atlas_operator.crd import custom_resource_definition
from atlas_operator.render import (
    Images,
    NetworkSettings,
    checkpoint_warning,
    child_names,
    has_student_server,
    render_children,
    run_config,
)
from atlas_operator.spec import TrainingSpec
from atlas_operator.status import Outcome, job_phase, merge_conditions, parse_progress, status_update
from atlas_operator.validation import parse_run

from atlas_contract.errors import InvalidFields
from atlas_contract.names import (
    JOBSET_REPLICATED_JOBS,
    OPERATOR_POD_LABELS,
    RENDEZVOUS_PORT,
    TRAINER_METRICS_PORT,
    VLLM_PORT,
    WEIGHT_SYNC_PORT,
    max_jobset_run_name,
)
from tests.support import label_selectors
from tests.support.env import PYTHON, REPO, python_env
from tests.support.kube_emulator import wait_for
from tests.support.operator_support import (
    KUBE_VERSION,
    PodAt,
    crd_jsonschema,
    ingress_allowed,
    jobset_openapi_schema,
    jobset_schema,
    jobset_webhook_problems,
    manifest_file,
    openapi_validate,
    pruned_fields,
    pytorchjob_schema,
    pytorchjob_webhook_problems,
    restricted_profile_problems,
    teacher,
    training,
    with_spec,
)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
POLICIES = ["NetworkPolicy", "NetworkPolicy"]  # <name>-network, <name>-network-trainer: applied first


def config_map_of(objects):
    return next(o for o in objects if o["kind"] == "ConfigMap")


def children(manifest):
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(parse_run(manifest), Images())}


def test_generated_files_are_current():
    """crds/, the chart's crds/ and accelerate/*.yaml come from the Python models: never stale."""
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_operator.generate", "--check"], capture_output=True, text=True, env=python_env(), cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
    for crd in (REPO / "crds").glob("*.yaml"):
        assert (REPO / "charts/atlas-operator/crds" / crd.name).read_text() == crd.read_text()


@pytest.mark.parametrize("kind", ["AtlasTraining", "AtlasTeacher"])
def test_crd_is_valid_and_complete(kind):
    crd = custom_resource_definition(kind)
    kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    if kind == "AtlasTeacher":  # what its teaching did: the evaluation after training
        assert list(columns) == ["Phase", "Step", "Reward", "KL", "Delta", "Age"]
        assert columns["Delta"] == {
            "name": "Delta",
            "type": "number",
            "jsonPath": ".status.result.evaluation.accuracyDelta",
        }
    else:
        assert list(columns) == ["Phase", "Step", "Reward", "KL", "Age"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["required"]) >= {"model", "dataset"}
    assert spec["properties"]["deepspeed"] == {
        **spec["properties"]["deepspeed"],
        "default": "zero3",
        "enum": ["zero1", "zero2", "zero3", "zero3-offload"],
    }
    assert spec["properties"]["resources"]["properties"]["nodes"]["minimum"] == 1
    if kind == "AtlasTeacher":
        assert "student" in spec["required"] and "teaching" in spec["properties"]
    else:
        assert spec["properties"]["algorithm"]["enum"] == ["grpo", "sft"]
    schema = crd_jsonschema(crd)
    openapi_validate(teacher() if kind == "AtlasTeacher" else training(), schema)
    with pytest.raises(jsonschema.ValidationError):
        bad = training()
        bad["spec"]["resources"]["nodes"] = 0
        openapi_validate(bad, schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_match_the_crd_and_render(path):
    for document in yaml.safe_load_all(path.read_text()):
        openapi_validate(document, crd_jsonschema(custom_resource_definition(document["kind"])))
        assert render_children(parse_run(document))


def _containers(value):
    """Every container of every pod template in rendered objects (Deployments, JobSets, PyTorchJobs)."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "containers" and isinstance(item, list):
                yield from item
            else:
                yield from _containers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _containers(item)


def _option(argv: list[str], name: str, default: int = 1) -> int:
    return int(argv[argv.index(name) + 1]) if name in argv else default


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("backend", ["PyTorchJob", "JobSet"])
def test_every_vllm_server_of_the_examples_uses_every_gpu_it_requests(path, backend):
    """GPUs requested = GPUs used: each vLLM server's nvidia.com/gpu is its --tensor-parallel-size x
    --data-parallel-size."""
    for document in yaml.safe_load_all(path.read_text()):
        document["spec"]["backend"] = backend
        servers = [c for c in _containers(render_children(parse_run(document))) if "vllm" in c.get("command", [])]
        for server in servers:
            argv = server["command"] + server.get("args", [])
            used = _option(argv, "--tensor-parallel-size") * _option(argv, "--data-parallel-size")
            assert server["resources"]["limits"]["nvidia.com/gpu"] == used, argv


def test_a_server_that_would_hold_idle_gpus_is_refused():
    """gpus > tensorParallelSize means data parallelism, which TRL's and vLLM's servers refuse for dense models:
    Invalid naming gpus, for the policy's server and the student's; unset gpus follows tensorParallelSize."""
    manifest = teacher(rollout={"replicas": 1, "gpus": 2, "tensorParallelSize": 1})
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"replicas": 1, "gpus": 4, "tensorParallelSize": 2}}
    with pytest.raises(InvalidFields) as caught:
        parse_run(manifest)
    assert [p.split(":")[0] for p in caught.value.problems] == ["spec.rollout.gpus", "spec.student.rollout.gpus"]
    assert "--data-parallel-size > 1 errors out for dense models" in caught.value.problems[0]
    manifest = teacher(rollout={"replicas": 1, "tensorParallelSize": 2})
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"replicas": 1, "tensorParallelSize": 4}}
    run = parse_run(manifest)
    assert (run.spec.rollout.gpus, run.spec.student.rollout.gpus) == (2, 4)


def test_every_training_field_is_a_trainer_field():
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    trainer_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name for f in dataclasses.fields(TrainingSpec)} - {"extra"}
    assert ours <= trainer_fields, ours - trainer_fields


@pytest.mark.parametrize(
    "manifest",
    [
        training(),
        teacher(),
        training(resources={"nodes": 1, "gpusPerNode": 0}, rollout={"replicas": 0}),
        teacher(
            checkpoint={"pvc": "ckpt"},
            imagePullSecrets=[{"name": "regcred"}],
            deepspeed="zero3-offload",
            resources={
                "nodes": 4,
                "gpusPerNode": 8,
                "cpu": "32",
                "memory": "500Gi",
                "nodeSelector": {"pool": "h100"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            },
            reward={"configMapRef": {"name": "judges"}},
        ),
    ],
    ids=["training", "teacher", "cpu-one-node", "teacher-4-nodes"],
)
def test_rendered_objects_are_valid(manifest):
    objects = render_children(parse_run(manifest))
    for obj in objects:
        if obj["kind"] == "PyTorchJob":
            assert pytorchjob_webhook_problems(obj) == []
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == manifest["metadata"]["name"]


@pytest.mark.parametrize(
    "manifest",
    [
        training(),
        teacher(resources={"nodes": 3, "gpusPerNode": 0}, rollout={"replicas": 0}, checkpoint={"pvc": "ckpt"}),
    ],
    ids=["training", "teacher-cpu"],
)
def test_rendered_pytorchjob_matches_the_kubeflow_crd(manifest):
    """Against the real Kubeflow Training Operator v1.9.0 CRD schema (third-party test data)."""
    (job,) = [o for o in render_children(parse_run(manifest)) if o["kind"] == "PyTorchJob"]
    openapi_validate(job, pytorchjob_schema())


def test_pytorchjob_shape():
    objs = children(teacher(checkpoint={"pvc": "ckpt", "path": "/ckpt"}))
    job = objs[("PyTorchJob", "teacher-run")]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 1
    pod = replicas["Master"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "pytorch"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"pytorchjob-port": 23456, "metrics": 9400}
    script = container["command"][-1]
    for flag in (
        '--num_machines "$PET_NNODES"',
        '--machine_rank "$PET_NODE_RANK"',
        '--main_process_ip "$MASTER_ADDR"',
        '--main_process_port "$MASTER_PORT"',
        "--config_file /etc/atlas/accelerate.yaml",
        "-m atlas_core.cli.train recipe=/etc/atlas/run.yaml",
    ):
        assert flag in script
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"config": "/etc/atlas", "dshm": "/dev/shm", "checkpoints": "/ckpt"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "ckpt"
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["ATLAS_RUN"]["value"] == "teacher-run" and env["ATLAS_KIND"]["value"] == "AtlasTeacher"
    assert "ATLAS_RUN_UID" not in env  # a manifest from a file has no uid
    with_uid = teacher()
    with_uid["metadata"]["uid"] = "0b7e-uid"
    job = children(with_uid)[("PyTorchJob", "teacher-run")]
    env = {
        e["name"]: e for e in job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["ATLAS_RUN_UID"]["value"] == "0b7e-uid"  # the cluster run's uid: checkpoints record it
    assert "NCCL_DEBUG" in env
    assert job["spec"]["nprocPerNode"] == "8"
    single = children(training(resources={"nodes": 1, "gpusPerNode": 4}))[("PyTorchJob", "grpo-run")]
    assert list(single["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_rollout_and_student_servers():
    objs = children(teacher())
    rollout = objs[("Deployment", "teacher-run-rollout")]["spec"]["template"]["spec"]["containers"][0]
    assert rollout["command"] == ["vllm", "serve"]  # what TRL runs (trl vllm-serve is deprecated)
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in rollout["env"]
    assert rollout["readinessProbe"]["httpGet"]["path"] == "/health"
    assert rollout["resources"]["limits"]["nvidia.com/gpu"] == 2
    service_ports = {p["name"]: p["port"] for p in objs[("Service", "teacher-run-rollout")]["spec"]["ports"]}
    assert service_ports == {"http": 8000, "weight-sync": 51216}
    student = objs[("Deployment", "teacher-run-student")]["spec"]["template"]["spec"]["containers"][0]
    assert student["command"] == ["vllm", "serve"] and student["args"][0] == "meta-llama/Llama-3.2-1B-Instruct"
    assert student["readinessProbe"]["httpGet"]["path"] == "/health"
    config = yaml.safe_load(objs[("ConfigMap", "teacher-run-config")]["data"]["run.yaml"])
    assert config["trainer"]["use_vllm"] is True and config["trainer"]["vllm_mode"] == "server"
    assert config["trainer"]["vllm_server_base_url"] == "http://teacher-run-rollout.team-a.svc:8000"
    assert config["student"] == "http://teacher-run-student.team-a.svc:8000/v1"
    metrics = objs[("Service", "teacher-run-metrics")]["spec"]
    assert metrics["ports"][0]["port"] == 9400 and metrics["selector"]["training.kubeflow.org/replica-type"] == "master"
    local = children(teacher(rollout={"replicas": 0}, student={"model": "m/s", "rollout": {"replicas": 0}}))
    assert not any(kind == "Deployment" for kind, _ in local)
    config = yaml.safe_load(local[("ConfigMap", "teacher-run-config")]["data"]["run.yaml"])
    assert "use_vllm" not in config["trainer"] and config["student"] == "m/s"


def test_suspend_renders_suspended_job_and_no_servers():
    objs = children(teacher(suspend=True))
    assert objs[("PyTorchJob", "teacher-run")]["spec"]["runPolicy"]["suspend"] is True
    assert objs[("Deployment", "teacher-run-rollout")]["spec"]["replicas"] == 0
    assert objs[("Deployment", "teacher-run-student")]["spec"]["replicas"] == 0


def test_queue_name_labels_the_job_and_servers_and_creates_the_job_suspended():
    """spec.queueName: Kueue admits the PyTorchJob (created suspended, label on the job) and each server pod."""
    objs = children(teacher(queueName="team-a-gpus"))
    job = objs[("PyTorchJob", "teacher-run")]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpus"
    assert job["spec"]["runPolicy"]["suspend"] is True
    openapi_validate(job, pytorchjob_schema())
    for component in ("rollout", "student"):
        deployment = objs[("Deployment", f"teacher-run-{component}")]
        assert deployment["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpus"
        assert "kueue.x-k8s.io/queue-name" not in deployment["metadata"]["labels"]
        assert "kueue.x-k8s.io/queue-name" not in deployment["spec"]["selector"]["matchLabels"]
        assert deployment["spec"]["replicas"] == 1
    plain = children(teacher())
    assert "kueue.x-k8s.io/queue-name" not in plain[("PyTorchJob", "teacher-run")]["metadata"]["labels"]
    assert plain[("PyTorchJob", "teacher-run")]["spec"]["runPolicy"]["suspend"] is False


def test_backend_queue_name_and_max_restarts_fields():
    run = parse_run(teacher(queueName="q"))
    assert run.spec.backend is None and run.spec.max_restarts == 3 and run.spec.queue_name == "q"
    assert parse_run(teacher(backend="PyTorchJob")).spec.backend == "PyTorchJob"
    on_jobset = parse_run(teacher(backend="JobSet"))  # rendered now: one JobSet instead of a PyTorchJob
    assert on_jobset.backend == "JobSet"
    assert [c["kind"] for c in render_children(on_jobset)] == [*POLICIES, "ConfigMap", "Service", "JobSet"]
    assert parse_run(teacher()).backend == "PyTorchJob"  # unset, and no operator default: PyTorchJob
    with pytest.raises(InvalidFields, match="spec.backend"):
        parse_run(teacher(backend="Deployment"))
    with pytest.raises(InvalidFields, match="spec.maxRestarts"):
        parse_run(teacher(maxRestarts=-1))
    for bad in ("-q", "a b", "x" * 64):
        with pytest.raises(InvalidFields, match="spec.queueName"):
            parse_run(teacher(queueName=bad))


def test_queue_name_is_what_kueues_webhook_accepts():
    """Kueue's job webhook takes the queue-name label as a DNS-1123 subdomain (ValidateLabelAsCRDName): a name it
    would reject makes the run Invalid, naming the field, rather than a job the API server refuses (ChildRejected);
    the CRD's pattern refuses it at kubectl apply."""
    crd = custom_resource_definition("AtlasTeacher")
    pattern = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["queueName"]
    for bad in ("Team_A.x", "team_a", "Team-A", "a..b", "team-a.", ".team"):
        with pytest.raises(InvalidFields, match=r"spec.queueName: expected a LocalQueue name as Kueue accepts it"):
            parse_run(teacher(queueName=bad))
        assert not re.search(pattern["pattern"], bad), bad
    for good in ("q", "team-a", "team-a.gpus", "0team", "a" * 63):
        assert parse_run(teacher(queueName=good)).spec.queue_name == good
        assert re.search(pattern["pattern"], good)


def test_queued_phase_until_kueue_unsuspends_the_job():
    suspended = {"spec": {"runPolicy": {"suspend": True}}, "status": {"conditions": []}}
    assert job_phase(suspended, False, queued=True) == "Queued"
    kubeflow_suspended = {
        "spec": {"runPolicy": {"suspend": True}},
        "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
    }
    assert job_phase(kubeflow_suspended, False, queued=True) == "Queued"
    assert job_phase(kubeflow_suspended, False) == "Suspended"
    running = {
        "spec": {"runPolicy": {"suspend": False}},
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }
    assert job_phase(running, False, queued=True) == "Running"
    assert job_phase(None, False, queued=True) == "Pending"
    done = {
        "spec": {"runPolicy": {"suspend": True}},
        "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
    }
    assert job_phase(done, False, queued=True) == "Succeeded"


def test_default_backend_setting():
    from atlas_operator.config import OperatorConfig

    assert OperatorConfig.from_env({}).default_backend == "PyTorchJob"
    assert OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "PyTorchJob"}).default_backend == "PyTorchJob"
    with pytest.raises(SystemExit, match="ATLAS_DEFAULT_BACKEND: expected one of PyTorchJob, JobSet"):
        OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "Pod"})
    assert OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "JobSet"}).default_backend == "JobSet"
    # The flag (atlas render/operator --default-backend) wins over the environment.
    assert OperatorConfig.from_env(
        {"ATLAS_DEFAULT_BACKEND": "JobSet"}, default_backend="PyTorchJob"
    ).default_backend == ("PyTorchJob")


# --------------------------------------------------------------------------- JobSet backend

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
    "training-3-nodes-pvc": training(
        backend="JobSet", resources={"nodes": 3, "gpusPerNode": 8}, checkpoint={"pvc": "ckpt", "path": "/ckpt"}
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
    assert rjobs["trainer"]["template"]["spec"]["podFailurePolicy"] == {
        "rules": [{"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]}}]
    }
    assert all("podFailurePolicy" not in r["template"]["spec"] for n, r in rjobs.items() if n != "trainer")
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


def test_rendered_run_config_is_accepted_by_the_trainer(tmp_path, tiny_model_dir):
    """The ConfigMap's run.yaml (a teacher's with its evaluation section), handed to the trainer's own loader and
    validator: no problem."""
    from atlas_core.training.run_config import load_run_config, validate_run_config

    for manifest in (
        training(model=str(tiny_model_dir), resources={"nodes": 1, "gpusPerNode": 0}, rollout={"replicas": 0}),
        teacher(
            model=str(tiny_model_dir),
            resources={"nodes": 1, "gpusPerNode": 0},
            rollout={"replicas": 0},
            reward={"config": "interpretation_offline"},
            student={"model": str(tiny_model_dir), "rollout": {"replicas": 0}},
            evaluation={"dataset": {"source": "builtin://arithmetic", "split": "test"}, "samples": 2, "limit": 3},
        ),
    ):
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(run_config(parse_run(manifest))))
        cfg = load_run_config([f"recipe={path}"])
        problems = [p for p in validate_run_config(cfg) if not p.startswith("reward.config")]
        assert problems == []
        assert cfg.trainer.metrics_port == 9400 and cfg.trainer.save_steps == 50


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"training": {"perDeviceTrainBatchSize": 3, "numGenerations": 5}},
            "spec.training.numGenerations: 5 does not divide",
        ),
        (
            {"rollout": {"replicas": 1, "gpus": 3, "tensorParallelSize": 2}},
            "spec.rollout.gpus: expected spec.rollout.tensorParallelSize",
        ),
        ({"rollout": {"replicas": 2}}, "spec.rollout.replicas: expected 0 or 1"),
        ({"deepspeed": "zero4"}, "spec.deepspeed: expected one of zero1, zero2, zero3, zero3-offload"),
        ({"resources": {"nodes": 0}}, "spec.resources.nodes: expected a number >= 1"),
        ({"resources": {"gpusPerNode": "eight"}}, "spec.resources.gpusPerNode: expected a whole number"),
        ({"trainingg": {}}, "spec.trainingg: unknown field"),
        ({"reward": {"config": "nope"}}, "spec.reward.config: expected one of interpretation"),
        ({"reward": {"funcs": ["made_up"]}}, "spec.reward.funcs: expected known reward functions"),
        (
            {"env": [{"name": "KEY", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "spec.env[0]: set value or valueFrom, not both",
        ),
        ({"algorithm": "sft", "rollout": {"replicas": 0}, "training": {"beta": 0.1}}, "spec.training.beta: a GRPO"),
    ],
)
def test_invalid_specs_name_the_field(change, expected):
    with pytest.raises(InvalidFields) as caught:
        parse_run(with_spec(training(), **change))
    assert any(expected in p for p in caught.value.problems), caught.value.problems


def problem_fields(manifest) -> list[str]:
    with pytest.raises(InvalidFields) as caught:
        parse_run(manifest)
    return sorted(p.split(":")[0] for p in caught.value.problems)


def test_every_problem_is_reported_at_once():
    manifest = teacher(
        training={"perDeviceTrainBatchSize": 3, "numGenerations": 5},
        rollout={"replicas": 1, "gpus": 3, "tensorParallelSize": 2},
        deepspeed="zero9",
    )
    del manifest["spec"]["student"]
    assert problem_fields(manifest) == [
        "spec.deepspeed",
        "spec.rollout.gpus",
        "spec.student",
        "spec.training.numGenerations",
    ]
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"gpus": 3, "tensorParallelSize": 2}}
    assert problem_fields(manifest) == [
        "spec.deepspeed",
        "spec.rollout.gpus",
        "spec.student.rollout.gpus",
        "spec.training.numGenerations",
    ]


def test_atlas_render_cli(tmp_path):
    good = manifest_file(tmp_path, teacher(checkpoint={"pvc": "atlas-ckpt"}))
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_cli.main", "render", str(good)], capture_output=True, text=True, env=python_env()
    )
    assert proc.returncode == 0, proc.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout)]
    assert kinds == [*POLICIES, "ConfigMap", "Service", "Service", "Service", "Deployment", "Deployment", "PyTorchJob"]
    assert "warning" not in proc.stderr  # checkpoints on a shared PVC
    unshared = manifest_file(tmp_path, teacher())
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_cli.main", "render", str(unshared)], capture_output=True, text=True, env=python_env()
    )
    # 2 nodes and no spec.checkpoint.pvc: the warning of the operator's CheckpointsShared condition.
    assert proc.returncode == 0 and proc.stderr.startswith("warning: teacher-run: spec.checkpoint.pvc: not set")
    assert "ReadWriteMany" in proc.stderr
    bad = manifest_file(
        tmp_path, teacher(training={"perDeviceTrainBatchSize": 3, "numGenerations": 5}, deepspeed="zero9")
    )
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_cli.main", "render", str(bad)], capture_output=True, text=True, env=python_env()
    )
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "error: spec.deepspeed: expected one of zero1, zero2, zero3, zero3-offload, got 'zero9'",
        "error: spec.training.numGenerations: 5 does not divide the generation batch of 48 completions "
        "(perDeviceTrainBatchSize 3 x 16 processes x gradientAccumulationSteps 1)",
    ]
    assert "Traceback" not in proc.stderr


def test_phase_follows_the_last_true_job_condition():
    def job(*types):
        return {
            "status": {
                "conditions": [
                    {"type": t, "status": "True" if i == len(types) - 1 else "False"} for i, t in enumerate(types)
                ]
            }
        }

    assert job_phase(None, False) == "Pending"
    assert job_phase(job("Created"), False) == "Pending"
    assert job_phase(job("Created", "Running"), False) == "Running"
    assert job_phase(job("Created", "Running", "Restarting"), False) == "Running"
    assert job_phase(job("Created", "Running", "Succeeded"), False) == "Succeeded"
    assert job_phase(job("Created", "Running", "Failed"), True) == "Failed"
    assert job_phase(job("Created", "Running"), True) == "Suspended"


def test_conditions_keep_their_transition_time_while_unchanged():
    first = merge_conditions(None, [{"type": "Training", "status": "False", "reason": "JobPending"}], "t1")
    same = merge_conditions(first, [{"type": "Training", "status": "False", "reason": "JobPending"}], "t2")
    moved = merge_conditions(same, [{"type": "Training", "status": "True", "reason": "Running"}], "t3")
    assert same == first and first[0]["lastTransitionTime"] == "t1" and moved[0]["lastTransitionTime"] == "t3"


def test_progress_from_real_trainer_metrics(fresh_trainer_metrics):
    """The trainer's own registry, rendered by prometheus_client: what the operator will parse."""
    from prometheus_client import generate_latest

    metrics = fresh_trainer_metrics

    labels = {"namespace": "team-a", "run": "render-progress-run", "kind": "AtlasTraining"}
    metrics.training_step.labels(**labels).set(120)
    metrics.training_reward.labels(**labels).set(0.61)
    metrics.training_reward_std.labels(**labels).set(0.2)
    text = generate_latest(metrics.TRAINER_REGISTRY).decode()
    assert parse_progress(text, "render-progress-run", "team-a") == {"step": 120, "reward": 0.61}  # no KL at beta 0
    metrics.training_step.labels(**labels).set(121)
    metrics.training_kl.labels(**labels).set(0.013)
    text = generate_latest(metrics.TRAINER_REGISTRY).decode()
    assert parse_progress(text, "render-progress-run", "team-a") == {"step": 121, "reward": 0.61, "kl": 0.013}
    assert parse_progress(text, "other-run", "team-a") == {}


def test_local_teacher_example_trains_here(tmp_path, tiny_model_dir):
    """`atlas train examples/local-teacher.yaml` on this CPU: the manifest's run, one process."""
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "atlas_cli.main",
            "train",
            str(REPO / "examples/local-teacher.yaml"),
            "trainer.metrics_port=0",
        ],
        capture_output=True,
        text=True,
        env=python_env(),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: generating inside the trainer" not in proc.stderr  # rollout.replicas is 0 already
    assert "note: one process (the cluster runs 2: 2 nodes x 1)" in proc.stderr
    out = tmp_path / "outputs/local-teacher"
    assert (out / "checkpoint-4" / "trainer_state.json").is_file() and (out / "metrics.jsonl").is_file()


@pytest.mark.parametrize(
    ("resources", "field"),
    [({"cpu": "lots"}, "cpu"), ({"memory": "2 GB"}, "memory"), ({"shmSize": "big"}, "shmSize")],
)
def test_quantities_are_checked_as_kubernetes_checks_them(resources, field):
    """A bad quantity is Invalid at once (and refused by the CRD's anchored pattern), never a child the API
    server rejects over and over."""
    import jsonschema

    with pytest.raises(InvalidFields) as caught:
        parse_run(with_spec(training(), resources=resources))
    assert caught.value.problems == [
        f"spec.resources.{field}: expected a Kubernetes quantity such as 32, 500m, 16Gi or 1.5e3, "
        f"got {resources[field]!r}"
    ]
    schema = custom_resource_definition("AtlasTraining")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    prop = schema["properties"]["spec"]["properties"]["resources"]["properties"][field]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(resources[field], {"type": "string", "pattern": prop["pattern"]})
    for good in ("32", "500m", "16Gi", "1.5e3"):
        jsonschema.validate(good, {"type": "string", "pattern": prop["pattern"]})
        parse_run(with_spec(training(), resources={field: good}))


def test_operator_settings_are_checked_at_start_up():
    """An interval of 0 would re-read every run in a hot loop: refused with one line naming the setting."""
    from atlas_operator.config import OperatorConfig

    with pytest.raises(SystemExit) as caught:
        OperatorConfig.from_env({"ATLAS_PROGRESS_INTERVAL": "0", "ATLAS_OPERATOR_METRICS_PORT": "70000"})
    assert str(caught.value).splitlines() == [
        "error: ATLAS_PROGRESS_INTERVAL: expected at least 1.0, got 0.0",
        "error: ATLAS_OPERATOR_METRICS_PORT: expected between 0 and 65535, got 70000",
    ]
    with pytest.raises(SystemExit, match="ATLAS_WORKERS: invalid literal"):
        OperatorConfig.from_env({"ATLAS_WORKERS": "many"})
    assert OperatorConfig.from_env({}, progress_interval=2.5).progress_interval == 2.5


def test_network_settings_of_the_operator():
    """ATLAS_NETWORK_POLICY (true/false; anything else refused naming it), ATLAS_MONITORING_NAMESPACE (empty: none),
    ATLAS_OPERATOR_NAMESPACE (the chart's downward API); flags win."""
    from atlas_operator.config import OperatorConfig

    default = OperatorConfig.from_env({}).network
    assert default == NetworkSettings(enabled=True, operator_namespace=None, monitoring_namespace="monitoring")
    chart = OperatorConfig.from_env(
        {"ATLAS_NETWORK_POLICY": "false", "ATLAS_MONITORING_NAMESPACE": "", "ATLAS_OPERATOR_NAMESPACE": "atlas-system"}
    ).network
    assert chart == NetworkSettings(enabled=False, operator_namespace="atlas-system", monitoring_namespace=None)
    with pytest.raises(SystemExit, match="ATLAS_NETWORK_POLICY: expected true or false, got 'maybe'"):
        OperatorConfig.from_env({"ATLAS_NETWORK_POLICY": "maybe"})
    flags = OperatorConfig.from_env({"ATLAS_NETWORK_POLICY": "true"}, network_policy=False, monitoring_namespace="prom")
    assert flags.network == NetworkSettings(enabled=False, monitoring_namespace="prom")


def test_status_absent_means_absent():
    """A server the spec no longer has leaves status.children, and a KL the trainer no longer exports
    (beta set to 0) leaves status.progress: the merge patch deletes them instead of keeping stale values."""
    old = {
        "phase": "Running",
        "children": {"pytorchJob": "r", "configMap": "r-config", "rollout": "r-rollout"},
        "progress": {"step": 7, "reward": 0.5, "kl": 0.01, "updatedAt": "2026-01-01T00:00:00Z"},
    }
    result = Outcome(
        "Running", [], children={"pytorchJob": "r", "configMap": "r-config"}, progress={"step": 8, "reward": 0.6}
    )
    patch, _ = status_update(old, 2, result, "2026-01-01T00:01:00Z")
    assert patch["children"] == {"pytorchJob": "r", "configMap": "r-config", "rollout": None}
    assert patch["progress"] == {"step": 8, "reward": 0.6, "kl": None, "updatedAt": "2026-01-01T00:01:00Z"}
    unchanged, _ = status_update({**old, "conditions": []}, 2, Outcome("Running", [], children=old["children"]), "t")
    assert "children" not in unchanged and "progress" not in unchanged  # nothing scraped: progress kept


def test_trainer_scrape_is_bounded_in_time_and_size():
    """fetch_text: a deadline for the whole request (a trickling endpoint is cut), and a size cap."""
    import http.server
    import threading
    import time

    from atlas_operator.reconcile import fetch_text

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            try:
                if self.path == "/slow":
                    for _ in range(300):  # 60 s of one line every 0.2 s, unless cut
                        self.wfile.write(b"# still here\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                elif self.path == "/big":
                    self.wfile.write(b"#" * (3 << 20))
                else:
                    self.wfile.write(b"atlas_training_step 42\n")
            except OSError:
                self.server.cut.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads, server.cut = True, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert fetch_text(base + "/ok", 5, 1 << 20) == "atlas_training_step 42\n"
        with pytest.raises(TimeoutError):
            fetch_text(base + "/slow", 0.5, 1 << 20)
        with pytest.raises(ValueError, match="larger than"):
            fetch_text(base + "/big", 5, 1 << 20)
        wait_for(lambda: "/slow" in server.cut, timeout=10, what="the slow answer cut by the client")
    finally:
        server.shutdown()
        server.server_close()


def _pod_templates(obj):
    """Every pod template of a rendered child: the PyTorchJob's Master and Worker, a Deployment's, each JobSet
    replicated job's."""
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in obj["spec"]["replicatedJobs"]]
    return []


BOTH_KINDS_AND_BACKENDS = {
    "training": training(),
    "training-jobset": training(backend="JobSet", checkpoint={"pvc": "ckpt"}),
    "teacher": teacher(checkpoint={"pvc": "ckpt"}, reward={"configMapRef": {"name": "judges"}}),
    "teacher-jobset": teacher(backend="JobSet", queueName="q", reward={"configMapRef": {"name": "judges"}}),
}


@pytest.mark.parametrize(
    "manifest",
    [*BOTH_KINDS_AND_BACKENDS.values(), *[yaml.safe_load(p.read_text()) for p in EXAMPLES]],
    ids=[*BOTH_KINDS_AND_BACKENDS, *[p.name for p in EXAMPLES]],
)
def test_every_pod_meets_the_restricted_pod_security_profile_and_holds_no_api_token(manifest):
    """Pod Security Standards, restricted profile (every control, restricted_profile_problems in
    tests/support/operator_support.py) on every pod template rendered: trainer (Master, Worker, the JobSet's trainer
    job), rollout and student servers (Deployments, the JobSet's server jobs); and no pod mounts a ServiceAccount
    token."""
    run = parse_run(manifest)
    templates = {
        (obj["kind"], obj["metadata"]["name"], i): t
        for obj in render_children(run)
        for i, t in enumerate(_pod_templates(obj))
    }
    components = {t["metadata"]["labels"]["app.kubernetes.io/component"] for t in templates.values()}
    servers = {"rollout": bool(run.spec.rollout.replicas), "student": has_student_server(run)}
    assert components == {"trainer", *[server for server, present in servers.items() if present]}
    for where, template in templates.items():
        assert restricted_profile_problems(template["spec"]) == [], where
        assert template["spec"]["automountServiceAccountToken"] is False, where


def test_the_restricted_profile_check_finds_each_violation():
    """The checker is not vacuous: each control, broken on its own in a rendered trainer pod, is reported."""
    (job,) = [o for o in render_children(parse_run(training())) if o["kind"] == "PyTorchJob"]
    good = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert restricted_profile_problems(good) == []

    def broken(change):
        pod = copy.deepcopy(good)
        change(pod, pod["containers"][0]["securityContext"])
        return restricted_profile_problems(pod)

    violations = {
        "hostNetwork": lambda pod, c: pod.update(hostNetwork=True),
        "hostPID": lambda pod, c: pod.update(hostPID=True),
        "hostIPC": lambda pod, c: pod.update(hostIPC=True),
        "hostPath": lambda pod, c: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "hostPort": lambda pod, c: pod["containers"][0]["ports"][0].update(hostPort=80),
        "privileged": lambda pod, c: c.update(privileged=True),
        "allowPrivilegeEscalation": lambda pod, c: c.update(allowPrivilegeEscalation=True),
        "runAsNonRoot": lambda pod, c: pod["securityContext"].pop("runAsNonRoot"),
        "runAsUser": lambda pod, c: c.update(runAsUser=0),
        "seccompProfile": lambda pod, c: pod["securityContext"].pop("seccompProfile"),
        "capabilities.drop": lambda pod, c: c.update(capabilities={"drop": ["NET_RAW"]}),
        "capabilities.add": lambda pod, c: c["capabilities"].update(add=["SYS_ADMIN"]),
        "volume type": lambda pod, c: pod["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}),
    }
    for control, change in violations.items():
        assert broken(change), control
    assert broken(lambda pod, c: c["capabilities"].update(add=["NET_BIND_SERVICE"])) == []  # the one allowed


def test_a_service_account_token_only_when_asked_for():
    """automountServiceAccountToken false on every pod unless the run names its ServiceAccount and asks for the
    token (spec.serviceAccountName, spec.automountServiceAccountToken)."""
    asked = with_spec(teacher(), serviceAccountName="api-caller", automountServiceAccountToken=True)
    for obj in render_children(parse_run(asked)):
        for template in _pod_templates(obj):
            assert template["spec"]["serviceAccountName"] == "api-caller"
            assert template["spec"]["automountServiceAccountToken"] is True
    named_only = with_spec(teacher(), serviceAccountName="api-caller")
    for obj in render_children(parse_run(named_only)):
        for template in _pod_templates(obj):
            assert template["spec"]["automountServiceAccountToken"] is False


# --------------------------------------------------------------------------- NetworkPolicies

NETWORK = NetworkSettings(operator_namespace="atlas-system", monitoring_namespace="monitoring")
# The operator pod as the chart labels it (tests/test_helm_chart.py checks the chart against OPERATOR_POD_LABELS).
OPERATOR_POD = PodAt("atlas-system", {**OPERATOR_POD_LABELS, "app.kubernetes.io/name": "atlas-operator"})
PROMETHEUS_POD = PodAt("monitoring", {"app.kubernetes.io/name": "prometheus"})
STRANGER_POD = PodAt("team-a", {"app": "notebook"})
NCCL_PORT = 40123  # NCCL's data and bootstrap sockets listen on ephemeral ports


def _controller_labels(obj: dict, component: str) -> dict[str, str]:
    """Labels the workload's controller adds to the pods it makes (none of our selectors rely on them)."""
    if obj["kind"] == "PyTorchJob":
        return {
            "training.kubeflow.org/job-name": obj["metadata"]["name"],
            "training.kubeflow.org/replica-type": "master",
        }
    if obj["kind"] == "JobSet":
        return {
            "jobset.sigs.k8s.io/jobset-name": obj["metadata"]["name"],
            "jobset.sigs.k8s.io/replicatedjob-name": component,
            "batch.kubernetes.io/job-completion-index": "0",
        }
    return {"pod-template-hash": "5d8f7c9b6"}


def run_pods_and_policies(manifest: dict, namespace: str | None = None) -> tuple[dict[str, PodAt], list[dict]]:
    """A run's pods as its controllers make them (component → pod: labels, named ports) and its NetworkPolicies."""
    manifest = copy.deepcopy(manifest)
    if namespace:
        manifest["metadata"]["namespace"] = namespace
    children = render_children(parse_run(manifest), Images(), network=NETWORK)
    pods = {}
    for obj in children:
        for template in _pod_templates(obj):
            component = template["metadata"]["labels"]["app.kubernetes.io/component"]
            labels = {**template["metadata"]["labels"], **_controller_labels(obj, component)}
            ports = {p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
            pods[component] = PodAt(manifest["metadata"]["namespace"], labels, ports)
    return pods, [c for c in children if c["kind"] == "NetworkPolicy"]


def _ports(component: str) -> list[int]:
    if component == "trainer":
        return [RENDEZVOUS_PORT, TRAINER_METRICS_PORT, NCCL_PORT]
    return [VLLM_PORT, NCCL_PORT] + ([WEIGHT_SYNC_PORT] if component == "rollout" else [])


@pytest.mark.parametrize("manifest", list(BOTH_KINDS_AND_BACKENDS.values()), ids=list(BOTH_KINDS_AND_BACKENDS))
def test_network_policies_let_only_the_runs_trainers_in(manifest):
    """Each rendered NetworkPolicy evaluated against the run's pods (ingress_allowed in
    tests/support/operator_support.py): its servers and trainers accept only its own trainers (rendezvous, collectives,
    HTTP, weight sync); its trainers also accept its rollout server (NCCL connects both ways) and, on the metrics port
    only, the operator and the monitoring namespace. Another run's pods, a pod of another namespace with the very same
    labels, and any other pod are refused."""
    pods, policies = run_pods_and_policies(manifest)
    other_run, other_policies = run_pods_and_policies(
        {**manifest, "metadata": {**manifest["metadata"], "name": "other-run"}}
    )
    twin, twin_policies = run_pods_and_policies(manifest, namespace="team-b")
    everywhere = policies + other_policies + twin_policies
    assert {p["metadata"]["name"] for p in policies} == {
        f"{manifest['metadata']['name']}-network",
        f"{manifest['metadata']['name']}-network-trainer",
    }
    sources = {f"run {c}": pod for c, pod in pods.items()}
    sources |= {f"other run {c}": pod for c, pod in other_run.items()}
    sources |= {f"team-b twin {c}": pod for c, pod in twin.items()}
    sources |= {"operator": OPERATOR_POD, "prometheus": PROMETHEUS_POD, "stranger": STRANGER_POD}
    assert {"trainer", "rollout"} <= set(pods)

    def expected(source: str, target: str, port: int) -> bool:
        if source == "run trainer":
            return True
        if target == "trainer" and source == "run rollout":
            return True
        return target == "trainer" and port == TRAINER_METRICS_PORT and source in ("operator", "prometheus")

    for target, target_pod in pods.items():
        for port in _ports(target):
            for source, source_pod in sources.items():
                allowed = ingress_allowed(everywhere, source_pod, target_pod, port)
                assert allowed is expected(source, target, port), f"{source} → run {target}:{port}"
    # The policies of the run select none of the other pods: those stay as their own policies say.
    for pod in [*other_run.values(), *twin.values(), OPERATOR_POD, PROMETHEUS_POD, STRANGER_POD]:
        assert ingress_allowed(policies, STRANGER_POD, pod, VLLM_PORT)


def test_the_network_policy_evaluator_follows_the_api_semantics():
    """The evaluator itself (kubernetes.io/docs/concepts/services-networking/network-policies): not isolated without
    a selecting Ingress policy; an empty ingress list admits nothing; namespaceSelector and podSelector in one peer
    AND, in two peers OR; podSelector alone means the policy's namespace; named ports and endPort; matchExpressions."""

    def policy(pod_selector, ingress, namespace="a", types=("Ingress",)):
        return {
            "metadata": {"namespace": namespace},
            "spec": {"podSelector": pod_selector, "policyTypes": list(types), "ingress": ingress},
        }

    target = PodAt("a", {"app": "db"}, {"sql": 5432})
    web_a, web_b, db_b = PodAt("a", {"app": "web"}), PodAt("b", {"app": "web"}), PodAt("b", {"app": "db"})
    assert ingress_allowed([], web_b, target, 5432)
    assert ingress_allowed([policy({}, [], namespace="b")], web_b, target, 5432)  # another namespace's policy
    assert ingress_allowed([policy({}, [], types=("Egress",))], web_b, target, 5432)
    assert not ingress_allowed([policy({}, [])], web_a, target, 5432)  # selected, nothing admitted
    assert ingress_allowed([policy({}, [{}])], web_b, target, 1)  # one empty rule: everyone, every port
    only_web = [policy({"matchLabels": {"app": "db"}}, [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}])]
    assert ingress_allowed(only_web, web_a, target, 5432) and not ingress_allowed(only_web, web_b, target, 5432)
    ns_b = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}
    web = {"podSelector": {"matchLabels": {"app": "web"}}}
    both = [policy({}, [{"from": [{**ns_b, **web}]}])]
    either = [policy({}, [{"from": [ns_b, web]}])]
    assert ingress_allowed(both, web_b, target, 1) and not ingress_allowed(both, db_b, target, 1)
    assert not ingress_allowed(both, web_a, target, 1)
    assert ingress_allowed(either, db_b, target, 1) and ingress_allowed(either, web_a, target, 1)
    ports = [policy({}, [{"ports": [{"port": "sql"}, {"protocol": "TCP", "port": 8000, "endPort": 8010}]}])]
    assert ingress_allowed(ports, web_b, target, 5432) and ingress_allowed(ports, web_b, target, 8005)
    assert not ingress_allowed(ports, web_b, target, 8011) and not ingress_allowed(ports, web_b, target, 5432, "UDP")
    expressions = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]}
    assert ingress_allowed([policy({}, [{"from": [{"podSelector": expressions}]}])], web_a, target, 1)
    assert not label_selectors.matches({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, {"app": "x"})
    assert label_selectors.matches({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}, {})


def test_network_policies_follow_the_operator_settings():
    """Off: no NetworkPolicy and none in status.children. No monitoring namespace: only the operator scrapes. Not in
    a cluster (no operator namespace): only the monitoring namespace does. Every policy is the run's child."""
    run = parse_run(teacher())
    off = render_children(run, network=NetworkSettings(enabled=False))
    assert not [c for c in off if c["kind"] == "NetworkPolicy"]
    assert "networkPolicy" not in child_names(run, network=False)
    pods, policies = run_pods_and_policies(teacher())
    no_monitoring = [
        c
        for c in render_children(
            run, network=NetworkSettings(operator_namespace="atlas-system", monitoring_namespace=None)
        )
        if c["kind"] == "NetworkPolicy"
    ]
    assert ingress_allowed(no_monitoring, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)
    assert not ingress_allowed(no_monitoring, PROMETHEUS_POD, pods["trainer"], TRAINER_METRICS_PORT)
    outside = [c for c in render_children(run) if c["kind"] == "NetworkPolicy"]  # NetworkSettings() defaults
    assert ingress_allowed(outside, PROMETHEUS_POD, pods["trainer"], TRAINER_METRICS_PORT)
    assert not ingress_allowed(outside, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)
    for policy in policies:
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        assert policy["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "atlas-operator"
        assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open: model hubs, judges, DNS


def test_a_run_without_servers_still_isolates_its_trainers():
    pods, policies = run_pods_and_policies(training(rollout={"replicas": 0}))
    assert set(pods) == {"trainer"}
    assert ingress_allowed(policies, pods["trainer"], pods["trainer"], RENDEZVOUS_PORT)
    assert not ingress_allowed(policies, STRANGER_POD, pods["trainer"], RENDEZVOUS_PORT)
    assert ingress_allowed(policies, OPERATOR_POD, pods["trainer"], TRAINER_METRICS_PORT)


# --------------------------------------------------------------------------- evaluation after training, result


def run_yaml(manifest) -> dict:
    (config_map,) = [c for c in render_children(parse_run(manifest)) if c["kind"] == "ConfigMap"]
    return yaml.safe_load(config_map["data"]["run.yaml"])


def test_evaluation_renders_into_run_yaml():
    """spec.evaluation → run.yaml's `evaluation` (the shape the trainer reads), defaults filled in; none without it."""
    assert run_yaml(teacher(evaluation={"samples": 2, "limit": 500}))["evaluation"] == {
        "dataset": {"source": "builtin://arithmetic", "split": "test"},
        "samples": 2,
        "limit": 500,
    }
    assert run_yaml(teacher(evaluation={}))["evaluation"] == {  # unset limit: every problem, no key
        "dataset": {"source": "builtin://arithmetic", "split": "test"},
        "samples": 4,
    }
    held_out = teacher(evaluation={"dataset": {"source": "hf://org/held-out", "split": "validation"}, "samples": 1})
    assert run_yaml(held_out)["evaluation"]["dataset"] == {"source": "hf://org/held-out", "split": "validation"}
    # Only a split: the run's own source, as the training dataset's source is written (a path on the volume too).
    on_volume = teacher(dataset={"source": "/checkpoints/data/problems.jsonl"}, evaluation={"dataset": {"split": "x"}})
    config = run_yaml(on_volume)
    assert config["evaluation"]["dataset"] == {"source": config["dataset"]["source"], "split": "x"}
    assert config["dataset"]["source"] == "/checkpoints/data/problems.jsonl"
    assert "evaluation" not in run_yaml(teacher()) and "evaluation" not in run_yaml(training())
    from atlas_contract.defaults import EVALUATION

    assert EVALUATION == {"split": "test", "samples": 4}


@pytest.mark.parametrize(
    ("evaluation", "expected"),
    [
        ({"samples": 0}, "spec.evaluation.samples: expected a number >= 1, got 0"),
        ({"samples": "four"}, "spec.evaluation.samples: expected a whole number, got 'four'"),
        ({"samples": 1.5}, "spec.evaluation.samples: expected a whole number, got 1.5"),
        ({"limit": 0}, "spec.evaluation.limit: expected a number >= 1, got 0"),
        ({"limit": -3}, "spec.evaluation.limit: expected a number >= 1, got -3"),
        ({"dataset": {"split": ""}}, "spec.evaluation.dataset.split: expected a split name such as test or validation"),
        ({"dataset": {"split": 3}}, "spec.evaluation.dataset.split: expected a string, got 3"),
        ({"dataset": {"source": ["a"]}}, "spec.evaluation.dataset.source: expected a string"),
        ({"dataset": "test"}, "spec.evaluation.dataset: expected an object"),
        ({"sample": 2}, "spec.evaluation.sample: unknown field (known: dataset, samples, limit)"),
        ("yes", "spec.evaluation: expected an object"),
    ],
)
def test_invalid_evaluation_names_the_field(evaluation, expected):
    with pytest.raises(InvalidFields) as caught:
        parse_run(teacher(evaluation=evaluation))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_evaluation_problems_come_with_every_other_problem_and_only_for_teachers():
    manifest = teacher(evaluation={"samples": 0, "limit": 0, "dataset": {"split": " "}}, training={"numGenerations": 5})
    assert problem_fields(manifest) == [
        "spec.evaluation.dataset.split",
        "spec.evaluation.limit",
        "spec.evaluation.samples",
        "spec.training.numGenerations",
    ]
    with pytest.raises(InvalidFields) as caught:  # AtlasTraining has no evaluation: the teacher is evaluated
        parse_run(training(evaluation={"samples": 2}))
    assert [p.split(" (known")[0] for p in caught.value.problems] == ["spec.evaluation: unknown field"]
    assert (
        "evaluation"
        not in crd_jsonschema(custom_resource_definition("AtlasTraining"))["properties"]["spec"]["properties"]
    )
    spec = crd_jsonschema(custom_resource_definition("AtlasTeacher"))["properties"]["spec"]
    evaluation = spec["properties"]["evaluation"]["properties"]
    assert evaluation["samples"]["minimum"] == 1 and evaluation["samples"]["default"] == 4
    assert evaluation["limit"]["minimum"] == 1 and "default" not in evaluation["limit"]
    assert evaluation["dataset"]["properties"]["split"]["default"] == "test"
    with pytest.raises(jsonschema.ValidationError):  # the API server refuses it too
        openapi_validate(teacher(evaluation={"samples": 0}), crd_jsonschema(custom_resource_definition("AtlasTeacher")))


@pytest.mark.parametrize("manifest", [training(), teacher(evaluation={"samples": 1})], ids=["training", "teacher"])
def test_trainer_container_reports_its_result_through_the_termination_message(manifest):
    """Every run (both kinds): the trainer container's terminationMessagePath is where ATLAS_RESULT_FILE points,
    with policy File (only the file counts, never a log tail)."""
    from atlas_contract import names

    (job,) = [o for o in render_children(parse_run(manifest)) if o["kind"] == "PyTorchJob"]
    for replica in job["spec"]["pytorchReplicaSpecs"].values():  # Master and Worker alike
        (container,) = replica["template"]["spec"]["containers"]
        assert container["terminationMessagePath"] == names.TERMINATION_MESSAGE_PATH == "/dev/termination-log"
        assert container["terminationMessagePolicy"] == "File"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[names.ENV_RESULT_FILE] == names.TERMINATION_MESSAGE_PATH
    openapi_validate(job, pytorchjob_schema())


def test_result_status_schema_is_the_contracts_summary():
    """.status.result in the CRD has exactly the keys atlas_contract.results writes, so nothing is pruned."""
    from atlas_contract import results

    for kind in ("AtlasTraining", "AtlasTeacher"):
        crd = custom_resource_definition(kind)
        status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        result = status["properties"]["result"]
        assert set(result["properties"]) == {"step", "reward", "evaluation", "evaluationError"}
        assert set(result["properties"]["evaluation"]["properties"]) == set(results.EVALUATION_SUMMARY.values())
        report = {field: 0.5 for field in results.EVALUATION_SUMMARY} | {"problems": 40}
        parsed = results.parse_result_message(results.result_message(12, 0.25, report, "evaluation: failed"))
        assert parsed["evaluationError"] == "evaluation: failed"
        assert (
            pruned_fields({"status": {"result": parsed}}, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []
        )
        openapi_validate(
            {"status": {"result": parsed}}, {"properties": {"status": crd_jsonschema(crd)["properties"]["status"]}}
        )


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


def test_a_run_name_must_start_with_a_letter():
    """Its Services (<name>-metrics, ...) and a JobSet's Jobs take DNS-1035 names, which begin with a letter."""
    for name in ("1run", "9-teacher"):
        assert problem_fields(training(name)) == ["metadata.name"]
    assert parse_run(training("r1")).name == "r1"


# --------------------------------------------------------------------------- rollouts as TRL runs them


def trl_rollout_command(model: str, **script_args) -> list[str]:
    """What the installed TRL's deprecated ``trl vllm-serve`` would exec, as ``vllm serve …`` — read from TRL's own
    ``build_command`` (trl/scripts/vllm_serve.py), for the vLLM version the trainer image pins."""
    from packaging.version import Version
    from trl.scripts import vllm_serve

    from atlas_contract.names import ROLLOUT_VLLM_VERSION

    pinned = Version(ROLLOUT_VLLM_VERSION)
    original = vllm_serve.is_vllm_available
    vllm_serve.is_vllm_available = lambda min_version=None: min_version is None or pinned >= Version(min_version)
    try:
        command = vllm_serve.build_command(vllm_serve.ScriptArguments(model=model, **script_args))
    finally:
        vllm_serve.is_vllm_available = original
    return ["vllm", *command[command.index("serve") :]]


@pytest.mark.parametrize(
    "rollout",
    [
        {"replicas": 1},
        {"replicas": 1, "tensorParallelSize": 2, "gpuMemoryUtilization": 0.8, "maxModelLen": 4096},
    ],
)
@pytest.mark.parametrize("backend", ["PyTorchJob", "JobSet"])
def test_the_rollout_server_runs_what_trl_runs(rollout, backend):
    """The server command and env are TRL 1.16's own vllm_serve equivalent (read from TRL, not copied here); the
    probes use vllm serve's /health; the weight-sync port contract stays (container port, the trainer's config)."""
    manifest = training(backend=backend, rollout=rollout)
    objects = render_children(parse_run(manifest), Images())
    if backend == "JobSet":
        (js,) = [o for o in objects if o["kind"] == "JobSet"]
        pod = next(r for r in js["spec"]["replicatedJobs"] if r["name"] == "rollout")["template"]["spec"]["template"]
    else:
        pod = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    expected = trl_rollout_command(
        manifest["spec"]["model"],
        port=8000,
        tensor_parallel_size=rollout.get("tensorParallelSize", 1),
        data_parallel_size=1,
        gpu_memory_utilization=rollout.get("gpuMemoryUtilization", 0.9),
        max_model_len=rollout.get("maxModelLen"),
    )
    assert container["command"] + container["args"] == expected
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]  # as TRL's main() sets it
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert {"name": "weight-sync", "containerPort": 51216, "protocol": "TCP"} in container["ports"]
    config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]
    assert config["vllm_mode"] == "server" and config["vllm_group_port"] == 51216


def test_remote_code_is_off_unless_the_run_asks():
    """trust_remote_code: false in run.yaml (models and tokenizers load without repository code) and no
    --trust-remote-code on the rollout server, unless spec.training.trustRemoteCode; the CRD says so, with default
    false; extra.trust_remote_code is refused (one place to set it)."""
    base = {"perDeviceTrainBatchSize": 4, "numGenerations": 4, "maxSteps": 10}
    for trusted in (False, True):
        manifest = training(training={**base, **({"trustRemoteCode": True} if trusted else {})})
        objects = render_children(parse_run(manifest), Images())
        assert yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]["trust_remote_code"] is trusted
        (container,) = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"]
        expected = trl_rollout_command(
            manifest["spec"]["model"],
            port=8000,
            tensor_parallel_size=2,
            data_parallel_size=1,
            gpu_memory_utilization=0.9,
            trust_remote_code=trusted,
        )
        assert container["command"] + container["args"] == expected
        assert ("--trust-remote-code" in expected) is trusted
    for kind in ("AtlasTraining", "AtlasTeacher"):
        field = custom_resource_definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "spec"
        ]["properties"]["training"]["properties"]["trustRemoteCode"]
        assert field["default"] is False and "false never runs such code" in field["description"]
    with pytest.raises(
        InvalidFields, match="spec.training.extra.trust_remote_code: set it as spec.training.trustRemoteCode"
    ):
        parse_run(training(training={**base, "extra": {"trust_remote_code": True}}))


def test_no_configuration_renders_the_deprecated_command():
    for example in sorted((REPO / "examples").glob("*.yaml")):
        for backend in ("PyTorchJob", "JobSet"):
            manifest = yaml.safe_load(example.read_text())
            rendered = yaml.safe_dump(render_children(parse_run(manifest, default_backend=backend), Images()))
            assert "vllm-serve" not in rendered, example.name


def test_the_image_pins_a_vllm_inside_trls_supported_range():
    """TRL declares the vLLM versions it supports (its `vllm` extra); the trainer image's pin, which the rollout
    command is rendered for, must be one of them."""
    import importlib.metadata

    from packaging.requirements import Requirement

    from atlas_contract.names import ROLLOUT_VLLM_VERSION

    (declared,) = [
        Requirement(r) for r in importlib.metadata.requires("trl") if Requirement(r).name == "vllm" and "extra" in r
    ]
    pins = [
        line.split("==", 1)[1].strip()
        for line in (REPO / "trainer_image/requirements.txt").read_text().splitlines()
        if line.startswith("vllm==")
    ]
    assert pins == [ROLLOUT_VLLM_VERSION]
    assert declared.specifier.contains(ROLLOUT_VLLM_VERSION), (str(declared.specifier), ROLLOUT_VLLM_VERSION)


def test_colocate_renders_vllm_inside_the_trainer_and_no_server():
    for backend in ("PyTorchJob", "JobSet"):
        manifest = teacher(
            backend=backend,
            rollout={"mode": "colocate", "tensorParallelSize": 2, "enableSleepMode": True, "maxModelLen": 2048},
            resources={"nodes": 2, "gpusPerNode": 8},
            checkpoint={"pvc": "ckpt"},
        )
        objects = render_children(parse_run(manifest), Images())
        assert not [o for o in objects if "rollout" in o["metadata"]["name"]]
        if backend == "JobSet":
            (js,) = [o for o in objects if o["kind"] == "JobSet"]
            assert "rollout" not in [r["name"] for r in js["spec"]["replicatedJobs"]]
            openapi_validate(js, jobset_schema())
            assert jobset_webhook_problems(js) == []
        else:
            openapi_validate(next(o for o in objects if o["kind"] == "PyTorchJob"), pytorchjob_schema())
        config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])["trainer"]
        assert {k: v for k, v in config.items() if k.startswith(("vllm", "use_vllm"))} == {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,  # TRL's colocate default: the trainer shares the GPU
            "vllm_tensor_parallel_size": 2,
            "vllm_enable_sleep_mode": True,
            "vllm_max_model_length": 2048,
        }


def test_the_trainer_config_takes_colocate_settings():
    """run.yaml's vLLM settings build TRL's real GRPOConfig (TRL checks them when the trainer starts)."""
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    manifest = training(rollout={"mode": "colocate", "gpuMemoryUtilization": 0.5}, resources={"gpusPerNode": 2})
    trainer = run_config(parse_run(manifest))["trainer"]
    vllm = {k: v for k, v in trainer.items() if "vllm" in k}
    args = GRPOConfig(output_dir="/tmp/colocate", report_to=[], per_device_train_batch_size=8, **vllm)
    assert (args.vllm_mode, args.vllm_gpu_memory_utilization, args.use_vllm) == ("colocate", 0.5, True)


@pytest.mark.parametrize(
    ("rollout", "resources", "algorithm", "field"),
    [
        ({"mode": "colocate"}, {"gpusPerNode": 0}, "grpo", "spec.rollout.mode"),  # no GPU to share
        ({"mode": "colocate", "replicas": 1}, {"gpusPerNode": 8}, "grpo", "spec.rollout.replicas"),
        ({"mode": "colocate", "gpus": 2}, {"gpusPerNode": 8}, "grpo", "spec.rollout.gpus"),
        ({"mode": "colocate", "image": "vllm:x"}, {"gpusPerNode": 8}, "grpo", "spec.rollout.image"),
        ({"mode": "colocate", "args": ["--x"]}, {"gpusPerNode": 8}, "grpo", "spec.rollout.args"),
        ({"mode": "colocate", "memory": "8Gi"}, {"gpusPerNode": 8}, "grpo", "spec.rollout.memory"),
        ({"mode": "colocate", "tensorParallelSize": 3}, {"gpusPerNode": 8}, "grpo", "spec.rollout.tensorParallelSize"),
        ({"mode": "colocate"}, {"gpusPerNode": 8}, "sft", "spec.rollout.mode"),
        ({"mode": "server", "replicas": 0}, {"gpusPerNode": 8}, "grpo", "spec.rollout.replicas"),
        ({"enableSleepMode": True}, {"gpusPerNode": 8}, "grpo", "spec.rollout.enableSleepMode"),
    ],
)
def test_rollout_mode_problems_name_the_field(rollout, resources, algorithm, field):
    manifest = training(rollout=rollout, resources=resources, algorithm=algorithm)
    if algorithm == "sft":
        manifest["spec"]["reward"] = {}
    assert field in problem_fields(manifest), problem_fields(manifest)


def test_rollout_defaults_by_mode():
    server = parse_run(training(rollout={})).spec.rollout
    assert (server.replicas, server.gpus, server.gpu_memory_utilization) == (1, 1, 0.9)
    colocated = parse_run(training(rollout={"mode": "colocate"}, resources={"gpusPerNode": 1})).spec.rollout
    assert (colocated.replicas, colocated.gpu_memory_utilization) == (0, 0.3)
    sft = training(algorithm="sft", reward={}, rollout={}, training={"maxSteps": 10})
    assert parse_run(sft).spec.rollout.replicas == 0


def test_status_constants_are_the_crds_own():
    """Condition types and status.children keys come from the classes that generate the CRD: one the CRD does not
    declare cannot be set (it would be refused, or pruned, by the API server)."""
    from atlas_operator.reconcile import condition
    from atlas_operator.spec import CHILD_KEYS, ConditionType

    crd = custom_resource_definition("AtlasTeacher")
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["items"]["properties"]["type"]["enum"] == [str(t) for t in ConditionType]
    assert set(status["children"]["properties"]) == CHILD_KEYS
    with pytest.raises(ValueError):
        condition("Healthy", True, "Fine", "an undeclared condition type")
    undeclared = Outcome("Pending", [], children={"pytorchJob": "x", "volcanoJob": "x"})
    with pytest.raises(ValueError, match="volcanoJob"):
        status_update({}, 1, undeclared, "2026-01-01T00:00:00Z")
    for run in (teacher(), teacher(backend="JobSet"), training(rollout={"replicas": 0})):
        assert set(child_names(parse_run(run))) <= CHILD_KEYS
