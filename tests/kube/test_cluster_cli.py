"""``atlas cluster up`` as a user runs it: a cluster of its own (its own folder, ports and processes, beside the
session's), the example teacher applied with the printed KUBECONFIG shows its children and status in ``kubectl get``,
and ``atlas cluster down`` leaves no process. The same cluster runs ``--s3``: the S3 server's Secret, and its printed
exports reach it with boto3."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import boto3

from atlas_cluster.helm_kubectl import kubectl_binary
from harness.env import REPO, python_env
from harness.s3 import require_binary
from tests.kube.conftest import BIN_DIR


def _atlas(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atlas_cli.main", "cluster", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cluster_up_runs_the_example_teacher_to_its_children_and_down_leaves_no_process(kube, tmp_path):
    env = python_env(
        ATLAS_CACHE_DIR=str(tmp_path / "cache"), ATLAS_KUBE_BIN=str(BIN_DIR), ATLAS_S3_BIN=str(require_binary())
    )
    up = _atlas("up", "--name", "cli-test", "--s3", env=env)
    pids_file = tmp_path / "cache/kube/clusters/cli-test/pids.json"
    recorded = json.loads(pids_file.read_text()) if pids_file.exists() else {}
    pids = {name: entry["pid"] for name, entry in recorded.items()}
    try:
        assert up.returncode == 0, up.stderr
        exports = [line for line in up.stdout.splitlines() if line.startswith("export KUBECONFIG=")]
        assert len(exports) == 1, up.stdout
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "s3", "operator"}
        kubeconfig = exports[0].split("=", 1)[1]

        def kubectl(*args: str) -> str:
            argv = [str(kubectl_binary()), f"--kubeconfig={kubeconfig}", *args]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            assert done.returncode == 0, done.stderr
            return done.stdout

        kubectl("apply", "-f", str(REPO / "examples/local-teacher.yaml"))
        deadline = time.monotonic() + 60
        while True:
            run = json.loads(kubectl("get", "atlasteacher", "local-teacher", "-o", "json"))
            children = run.get("status", {}).get("children") or {}
            if run.get("status", {}).get("phase") and children.get("pytorchJob"):
                break
            assert time.monotonic() < deadline, f"no children and phase in 60 s: {run.get('status')}"
            time.sleep(0.3)
        table = kubectl(
            "get", "atlasteachers,pytorchjobs,configmaps,services", "-l", "app.kubernetes.io/instance=local-teacher"
        )
        assert "pytorchjob.kubeflow.org/local-teacher" in table and "local-teacher-config" in table, table
        printed = kubectl("get", "atlasteacher", "local-teacher")
        assert run["status"]["phase"] in printed.splitlines()[1], printed
        # The operator is the chart's ServiceAccount, not the admin: its own kubeconfig carries a token.
        operator_config = Path(kubeconfig).with_name("operator.kubeconfig").read_text()
        assert "token:" in operator_config and "client-key" not in operator_config

        # --s3: what `eval "$(atlas cluster up --s3)"` sets reaches the server, and its bucket `atlas` is there.
        aws = [line for line in up.stdout.splitlines() if line.startswith("export AWS_")]
        assert len(aws) == 1, up.stdout
        printed = dict(word.split("=", 1) for word in shlex.split(aws[0])[1:])
        assert set(printed) == {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        s3 = boto3.client(
            "s3",
            endpoint_url=printed["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id=printed["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=printed["AWS_SECRET_ACCESS_KEY"],
        )
        s3.put_object(Bucket="atlas", Key="runs/local-teacher/hello.txt", Body=b"from the host")
        assert s3.get_object(Bucket="atlas", Key="runs/local-teacher/hello.txt")["Body"].read() == b"from the host"
        # The Secret the pods read: the same credentials, the address they reach (127.0.0.1: no process nodes).
        secret = json.loads(kubectl("get", "secret", "atlas-s3", "-n", "default", "-o", "json"))
        stored = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        assert stored == printed
        status = _atlas("status", "--name", "cli-test", env=env)
        assert aws[0] in status.stdout.splitlines() and f"s3: pid {pids['s3']}" in status.stdout, status.stdout
    finally:
        down = _atlas("down", "--name", "cli-test", env=env)
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if process_alive(pid)] == []
    assert not pids_file.parent.exists()


def test_cluster_up_without_binaries_or_go_says_what_to_install(tmp_path):
    env = python_env(ATLAS_CACHE_DIR=str(tmp_path), PATH=os.path.dirname(sys.executable))
    env.pop("ATLAS_KUBE_BIN", None)
    up = _atlas("up", "--name", "no-go", env=env)
    assert up.returncode == 1
    assert "no `go` on PATH: install Go 1.26" in up.stderr, up.stderr
    assert not (tmp_path / "kube/clusters/no-go/pids.json").exists()
