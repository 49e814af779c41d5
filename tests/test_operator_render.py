"""The operator's pure half: spec models → CRDs, validation, rendered children, status logic."""

from __future__ import annotations

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
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Step", "Reward", "KL", "Age"]
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


def test_rendered_run_config_is_accepted_by_the_trainer(tmp_path, tiny_model_dir):
    """The ConfigMap's run.yaml, handed to the trainer's own loader and validator: no problem."""
    from atlas_core.training.run_config import load_run_config, validate_run_config

    for manifest in (
        training(model=str(tiny_model_dir), resources={"nodes": 1, "gpusPerNode": 0}, rollout={"replicas": 0}),
        teacher(
            model=str(tiny_model_dir),
            resources={"nodes": 1, "gpusPerNode": 0},
            rollout={"replicas": 0},
            reward={"config": "interpretation_offline"},
            student={"model": str(tiny_model_dir), "rollout": {"replicas": 0}},
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
