"""The operator's pure half: spec models → CRDs, validation, rendered children, status logic."""

from __future__ import annotations

import copy
import dataclasses
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml
from atlas_operator.crd import custom_resource_definition
from atlas_operator.render import Images, render_children, run_config
from atlas_operator.spec import InvalidRun, TrainingSpec, parse_run
from atlas_operator.status import Result, job_phase, merge_conditions, parse_progress, status_update
from conftest import PYTHON, REPO, python_env
from kube_emulator import wait_for
from operator_support import (
    KUBE_VERSION,
    crd_jsonschema,
    manifest_file,
    openapi_validate,
    pruned_fields,
    pytorchjob_schema,
    pytorchjob_webhook_problems,
    teacher,
    training,
    with_spec,
)

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


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
    assert rollout["command"] == ["trl", "vllm-serve"]
    assert rollout["readinessProbe"]["httpGet"]["path"] == "/health/"
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
    with pytest.raises(InvalidRun, match="spec.backend: JobSet is not rendered"):
        parse_run(teacher(backend="JobSet"))
    with pytest.raises(InvalidRun, match="spec.backend"):
        parse_run(teacher(backend="Deployment"))
    with pytest.raises(InvalidRun, match="spec.maxRestarts"):
        parse_run(teacher(maxRestarts=-1))
    for bad in ("-q", "a b", "x" * 64):
        with pytest.raises(InvalidRun, match="spec.queueName"):
            parse_run(teacher(queueName=bad))


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
    with pytest.raises(SystemExit, match="ATLAS_DEFAULT_BACKEND: JobSet is not rendered"):
        OperatorConfig.from_env({"ATLAS_DEFAULT_BACKEND": "JobSet"})


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
            "spec.rollout.tensorParallelSize: 2 does not divide",
        ),
        ({"rollout": {"replicas": 2}}, "spec.rollout.replicas: expected 0 or 1"),
        ({"deepspeed": "zero4"}, "spec.deepspeed: expected one of zero1, zero2, zero3, zero3-offload"),
        ({"resources": {"nodes": 0}}, "spec.resources.nodes: expected a number >= 1"),
        ({"resources": {"gpusPerNode": "eight"}}, "spec.resources.gpusPerNode: expected a whole number"),
        ({"trainingg": {}}, "spec.trainingg: unknown field"),
        ({"reward": {"config": "nope"}}, "spec.reward.config: expected one of interpretation"),
        ({"reward": {"funcs": ["made_up"]}}, "spec.reward.funcs: unknown reward 'made_up'"),
        (
            {"env": [{"name": "KEY", "value": "v", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
            "spec.env[0]: KEY sets both value and valueFrom; set one",
        ),
        ({"algorithm": "sft", "rollout": {"replicas": 0}, "training": {"beta": 0.1}}, "spec.training.beta: a GRPO"),
    ],
)
def test_invalid_specs_name_the_field(change, expected):
    with pytest.raises(InvalidRun) as caught:
        parse_run(with_spec(training(), **change))
    assert any(expected in p for p in caught.value.problems), caught.value.problems


def problem_fields(manifest) -> list[str]:
    with pytest.raises(InvalidRun) as caught:
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
        "spec.rollout.tensorParallelSize",
        "spec.student",
        "spec.training.numGenerations",
    ]
    manifest["spec"]["student"] = {"model": "m/s", "rollout": {"gpus": 3, "tensorParallelSize": 2}}
    assert problem_fields(manifest) == [
        "spec.deepspeed",
        "spec.rollout.tensorParallelSize",
        "spec.student.rollout.tensorParallelSize",
        "spec.training.numGenerations",
    ]


def test_atlas_render_cli(tmp_path):
    good = manifest_file(tmp_path, teacher(checkpoint={"pvc": "atlas-ckpt"}))
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.cli.main", "render", str(good)], capture_output=True, text=True, env=python_env()
    )
    assert proc.returncode == 0, proc.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(proc.stdout)]
    assert kinds == ["ConfigMap", "Service", "Service", "Service", "Deployment", "Deployment", "PyTorchJob"]
    assert "warning" not in proc.stderr  # checkpoints on a shared PVC
    unshared = manifest_file(tmp_path, teacher())
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.cli.main", "render", str(unshared)], capture_output=True, text=True, env=python_env()
    )
    # 2 nodes and no spec.checkpoint.pvc: the warning of the operator's CheckpointsShared condition.
    assert proc.returncode == 0 and proc.stderr.startswith("warning: teacher-run: spec.checkpoint.pvc: not set")
    assert "ReadWriteMany" in proc.stderr
    bad = manifest_file(
        tmp_path, teacher(training={"perDeviceTrainBatchSize": 3, "numGenerations": 5}, deepspeed="zero9")
    )
    proc = subprocess.run(
        [PYTHON, "-m", "atlas_core.cli.main", "render", str(bad)], capture_output=True, text=True, env=python_env()
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
            "atlas_core.cli.main",
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

    with pytest.raises(InvalidRun) as caught:
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


def test_status_absent_means_absent():
    """A server the spec no longer has leaves status.children, and a KL the trainer no longer exports
    (beta set to 0) leaves status.progress: the merge patch deletes them instead of keeping stale values."""
    old = {
        "phase": "Running",
        "children": {"pytorchJob": "r", "configMap": "r-config", "rollout": "r-rollout"},
        "progress": {"step": 7, "reward": 0.5, "kl": 0.01, "updatedAt": "2026-01-01T00:00:00Z"},
    }
    result = Result(
        "Running", [], children={"pytorchJob": "r", "configMap": "r-config"}, progress={"step": 8, "reward": 0.6}
    )
    patch, _ = status_update(old, 2, result, "2026-01-01T00:01:00Z")
    assert patch["children"] == {"pytorchJob": "r", "configMap": "r-config", "rollout": None}
    assert patch["progress"] == {"step": 8, "reward": 0.6, "kl": None, "updatedAt": "2026-01-01T00:01:00Z"}
    unchanged, _ = status_update({**old, "conditions": []}, 2, Result("Running", [], children=old["children"]), "t")
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


RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _pod_templates(obj):
    if obj["kind"] == "PyTorchJob":
        return [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    return []


@pytest.mark.parametrize(
    "manifest",
    [
        training(),
        teacher(checkpoint={"pvc": "ckpt"}, reward={"configMapRef": {"name": "judges"}}),
        *[yaml.safe_load(p.read_text()) for p in EXAMPLES],
    ],
    ids=["training", "teacher", *[p.name for p in EXAMPLES]],
)
def test_every_pod_meets_the_restricted_pod_security_profile_and_holds_no_api_token(manifest):
    """Pod Security Standards, restricted profile (kubernetes.io/docs/concepts/security/pod-security-standards),
    checked rule by rule on every pod template rendered; and no pod mounts a ServiceAccount token."""
    templates = [t for obj in render_children(parse_run(manifest)) for t in _pod_templates(obj)]
    assert templates
    for template in templates:
        pod = template["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "hostUsers"))
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"].get("runAsUser", 1) != 0
        assert pod["securityContext"]["seccompProfile"]["type"] in ("RuntimeDefault", "Localhost")
        for volume in pod["volumes"]:
            assert set(volume) - {"name"} <= RESTRICTED_VOLUMES, volume
        for container in pod["containers"] + pod.get("initContainers", []):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and not context.get("privileged")
            assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add")
            assert not any(p.get("hostPort") for p in container.get("ports", []))
    assert parse_run(with_spec(training(), automountServiceAccountToken=True)).spec.automount_service_account_token


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
    with pytest.raises(InvalidRun) as caught:
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
    with pytest.raises(InvalidRun) as caught:  # AtlasTraining has no evaluation: the teacher is evaluated
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
        assert set(result["properties"]) == {"step", "reward", "evaluation"}
        assert set(result["properties"]["evaluation"]["properties"]) == set(results.EVALUATION_SUMMARY.values())
        report = {field: 0.5 for field in results.EVALUATION_SUMMARY} | {"problems": 40}
        parsed = results.parse_result_message(results.result_message(12, 0.25, report))
        assert (
            pruned_fields({"status": {"result": parsed}}, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []
        )
        openapi_validate(
            {"status": {"result": parsed}}, {"properties": {"status": crd_jsonschema(crd)["properties"]["status"]}}
        )


class FakeKube:
    """The operator's Kube interface on a dict: objects by (plural, namespace, name); every call recorded."""

    def __init__(self):
        self.objects: dict[tuple, dict] = {}
        self.calls: list[tuple[str, str, str]] = []
        self.errors: dict[tuple, Exception] = {}
        self._uids = iter(range(1, 10**6))

    def serves(self, resource):
        return True

    def get(self, resource, namespace, name):
        self.calls.append(("get", resource.plural, name))
        if (resource.plural, namespace, name) in self.errors:
            raise self.errors[(resource.plural, namespace, name)]
        found = self.objects.get((resource.plural, namespace, name))
        return copy.deepcopy(found)

    def exists(self, resource, namespace, name):
        return self.get(resource, namespace, name) is not None

    def secret_exists(self, namespace, name):
        return True

    def create(self, obj):
        from atlas_operator import kube

        self.calls.append(("create", kube.resource_of(obj).plural, obj["metadata"]["name"]))
        stored = copy.deepcopy(obj)
        stored["metadata"]["uid"] = f"uid-{next(self._uids)}"
        meta = obj["metadata"]
        self.objects[(kube.resource_of(obj).plural, meta["namespace"], meta["name"])] = stored
        return copy.deepcopy(stored)

    def patch(self, resource, namespace, name, patch, subresource=None):
        self.calls.append(("patch", resource.plural, name))
        key = (resource.plural, namespace, name)
        self.objects[key] = _merged(self.objects[key], patch)
        return copy.deepcopy(self.objects[key])

    def delete(self, resource, namespace, name):
        self.calls.append(("delete", resource.plural, name))
        return self.objects.pop((resource.plural, namespace, name), None) is not None


def _merged(target, patch):
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy(patch)
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(target.get(key), value)
    return out


def master_pod(name: str, job_uid: str, message: str | None, exit_code: int = 0) -> dict:
    """A finished Master pod as the Kubeflow controller names it and the kubelet reports it."""
    terminated = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error"}
    if message is not None:
        terminated["message"] = message
    return {
        "metadata": {
            "name": f"{name}-master-0",
            "namespace": "team-a",
            "ownerReferences": [{"kind": "PyTorchJob", "name": name, "uid": job_uid, "controller": True}],
        },
        "status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": "pytorch", "state": {"terminated": terminated}}],
        },
    }


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


class ResultCluster:
    """A Reconciler on a FakeKube with one run whose job has been created: drive the job, read what is written."""

    def __init__(self, name: str):
        from atlas_operator.reconcile import Reconciler

        self.kube = FakeKube()
        self.reconciler = Reconciler(self.kube)
        self.name = name
        self.body = teacher(name, evaluation={"samples": 1, "limit": 4})
        self.body["metadata"]["uid"] = f"{name}-uid"
        self.status: dict = {}
        self.reconcile()

    @property
    def job(self) -> dict:
        return self.kube.objects[("pytorchjobs", "team-a", self.name)]

    def succeed_job(self) -> None:
        self.job["status"] = {"conditions": [{"type": "Succeeded", "status": "True", "message": "done"}]}

    def reconcile(self) -> dict:
        """One pass; returns the status patch and applies it (as kopf would)."""
        result = self.reconciler.reconcile({**copy.deepcopy(self.body), "status": self.status}, lambda c, o: None)
        patch, _ = status_update(self.status, None, result, "2026-01-01T00:00:00Z")
        self.status = _merged(self.status, patch)
        return patch

    def pod_reads(self) -> int:
        return self.kube.calls.count(("get", "pods", f"{self.name}-master-0"))


def test_result_is_read_once_from_the_succeeded_masters_termination_message():
    from atlas_contract import results

    cluster = ResultCluster("result-run")
    assert cluster.pod_reads() == 0 and "result" not in cluster.status  # not finished: no pod read
    message = results.result_message(4, 0.625, EVAL_REPORT)
    cluster.kube.objects[("pods", "team-a", "result-run-master-0")] = master_pod(
        "result-run", cluster.job["metadata"]["uid"], message
    )
    cluster.succeed_job()
    patch = cluster.reconcile()
    assert cluster.status["phase"] == "Succeeded"
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
    assert cluster.pod_reads() == 1
    for _ in range(5):  # shown: never read again, nothing more to write
        assert cluster.reconcile() == {}
    assert cluster.pod_reads() == 1


@pytest.mark.parametrize(
    "case", ["garbage", "log-tail", "empty", "missing-pod", "earlier-job", "forbidden", "running-container"]
)
def test_no_result_without_a_readable_message_and_no_loop(case):
    """A missing pod, a pod of an earlier job of the same name, no message, one that is not ours, or an API error:
    no result, no exception, nothing written, and the pod read at most MAX_RESULT_READS times for the job."""
    from atlas_operator.kube import ApiError
    from atlas_operator.reconcile import MAX_RESULT_READS

    cluster = ResultCluster(f"{case}-run")
    key = ("pods", "team-a", f"{case}-run-master-0")
    uid = cluster.job["metadata"]["uid"]
    pods = {
        "garbage": master_pod(cluster.name, uid, '{"step": "many"} not json'),
        "log-tail": master_pod(cluster.name, uid, "Traceback (most recent call last):\n  ...\nValueError: x", 1),
        "empty": master_pod(cluster.name, uid, None),
        "earlier-job": master_pod(cluster.name, "uid-of-an-earlier-job", '{"step":3}'),
        "running-container": {"status": {"containerStatuses": [{"name": "pytorch", "state": {"running": {}}}]}},
    }
    if case in pods:
        cluster.kube.objects[key] = pods[case]
    if case == "forbidden":
        cluster.kube.errors[key] = ApiError(403, "Forbidden", "pods is forbidden", "GET", "/api/v1/…")
    cluster.succeed_job()
    first = cluster.reconcile()
    assert cluster.status["phase"] == "Succeeded" and "result" not in first
    for _ in range(2 * MAX_RESULT_READS):
        assert cluster.reconcile() == {}
    assert "result" not in cluster.status
    assert cluster.pod_reads() == MAX_RESULT_READS
    cluster.reconciler.forget(cluster.body)  # the run deleted: nothing kept for it
    assert not cluster.reconciler._result_reads


def test_a_recreated_job_drops_the_result_of_the_one_before():
    """A spec change after success recreates the job: the old result is removed until the new job reports."""
    from atlas_contract import results

    cluster = ResultCluster("again-run")
    cluster.kube.objects[("pods", "team-a", "again-run-master-0")] = master_pod(
        "again-run", cluster.job["metadata"]["uid"], results.result_message(4, 0.5)
    )
    cluster.succeed_job()
    cluster.reconcile()
    assert cluster.status["result"] == {"step": 4, "reward": 0.5}
    cluster.body["spec"]["training"]["maxSteps"] = 11  # the job is finished: recreated at once
    patch = cluster.reconcile()
    assert ("delete", "pytorchjobs", "again-run") in cluster.kube.calls
    assert patch["result"] is None and "result" not in cluster.status and cluster.status["phase"] == "Pending"
    # The new job succeeds; the old pod (of the deleted job) is not taken for the new job's.
    cluster.succeed_job()
    reads = cluster.pod_reads()
    assert "result" not in cluster.reconcile() and cluster.pod_reads() == reads + 1
    cluster.kube.objects[("pods", "team-a", "again-run-master-0")] = master_pod(
        "again-run", cluster.job["metadata"]["uid"], results.result_message(11, 0.75)
    )
    assert cluster.reconcile()["result"] == {"step": 11, "reward": 0.75}
