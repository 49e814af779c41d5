"""Every child a run renders (atlas_operator/manifests.py): valid Kubernetes objects, `atlas render`, the trainer
container's termination message, and the restricted Pod Security profile on every pod template."""

from __future__ import annotations

import copy
import subprocess

import kubernetes_validate
import pytest
import yaml
from atlas_operator.manifests import render_children
from atlas_operator.render import has_student_server
from atlas_operator.validation import parse_run

from harness.env import PYTHON, python_env
from harness.manifests import manifest_file, teacher, training, with_spec
from tests.support.k8s_schemas import KUBE_VERSION, openapi_validate, pytorchjob_schema, pytorchjob_webhook_problems
from tests.support.pod_policies import restricted_profile_problems
from tests.support.render import BOTH_KINDS_AND_BACKENDS, EXAMPLES, POLICIES, pod_templates


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


@pytest.mark.parametrize(
    "manifest",
    [*BOTH_KINDS_AND_BACKENDS.values(), *[yaml.safe_load(p.read_text()) for p in EXAMPLES]],
    ids=[*BOTH_KINDS_AND_BACKENDS, *[p.name for p in EXAMPLES]],
)
def test_every_pod_meets_the_restricted_pod_security_profile_and_holds_no_api_token(manifest):
    """Pod Security Standards, restricted profile (every control, restricted_profile_problems in
    tests/support/pod_policies.py) on every pod template rendered: trainer (Master, Worker, the JobSet's trainer
    job), rollout and student servers (Deployments, the JobSet's server jobs); and no pod mounts a ServiceAccount
    token."""
    run = parse_run(manifest)
    templates = {
        (obj["kind"], obj["metadata"]["name"], i): t
        for obj in render_children(run)
        for i, t in enumerate(pod_templates(obj))
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
        for template in pod_templates(obj):
            assert template["spec"]["serviceAccountName"] == "api-caller"
            assert template["spec"]["automountServiceAccountToken"] is True
    named_only = with_spec(teacher(), serviceAccountName="api-caller")
    for obj in render_children(parse_run(named_only)):
        for template in pod_templates(obj):
            assert template["spec"]["automountServiceAccountToken"] is False


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
