"""The PyTorchJob backend (atlas_operator.backends.pytorchjob): the Kubeflow CRD, the job's shape, suspend and Kueue's
queue name."""

from __future__ import annotations

import pytest
from atlas_operator.manifests import render_children
from atlas_operator.validation import parse_run

from harness.manifests import teacher, training
from tests.support.k8s_schemas import openapi_validate, pytorchjob_schema
from tests.support.render import children


@pytest.mark.parametrize(
    "manifest",
    [
        training(),
        teacher(resources={"nodes": 3, "gpusPerNode": 0}, rollout={"replicas": 0}, checkpoint={"pvc": "ckpt"}),
    ],
    ids=["training", "teacher-cpu"],
)
def test_rendered_pytorchjob_matches_the_kubeflow_crd(manifest):
    """Against the real Kubeflow Training Operator CRD schema (the one a local cluster installs)."""
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


@pytest.mark.parametrize("grace", [None, 1, 3600])
def test_the_grace_period_is_the_trainer_pods_and_their_launchers(grace):
    """spec.terminationGracePeriodSeconds (default 600): on Master and Worker pods, in
    ATLAS_TERMINATION_GRACE_SECONDS and in TORCH_ELASTIC_SHUTDOWN_TIMEOUT (torch elastic otherwise kills its workers
    30 s after SIGTERM); a stop restarts the container in place (OnFailure). The server Deployments keep Kubernetes'
    default."""
    extra = {} if grace is None else {"terminationGracePeriodSeconds": grace}
    objs = children(training(resources={"nodes": 3, "gpusPerNode": 8}, **extra))
    expected = 600 if grace is None else grace
    replicas = objs[("PyTorchJob", "grpo-run")]["spec"]["pytorchReplicaSpecs"]
    for role in ("Master", "Worker"):
        assert replicas[role]["restartPolicy"] == "OnFailure"
        pod = replicas[role]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == expected, role
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["ATLAS_TERMINATION_GRACE_SECONDS"] == env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == str(expected)
    rollout = objs[("Deployment", "grpo-run-rollout")]["spec"]["template"]["spec"]
    assert "terminationGracePeriodSeconds" not in rollout


def test_users_env_overrides_the_launchers_shutdown_timeout():
    """spec.env wins over ours, TORCH_ELASTIC_SHUTDOWN_TIMEOUT included (as for every variable the operator sets)."""
    objs = children(training(env=[{"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": "5"}]))
    pod = objs[("PyTorchJob", "grpo-run")]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    env = [e for e in pod["containers"][0]["env"] if e["name"] == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
    assert env == [{"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": "5"}]


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
