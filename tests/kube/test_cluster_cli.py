"""``atlas cluster up`` as a user runs it: a cluster of its own (its own folder, ports and processes, beside the
session's), the example teacher applied with the printed KUBECONFIG shows its children and status in ``kubectl get``,
and ``atlas cluster down`` leaves no process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from atlas_cluster.tools import kubectl_binary
from tests.kube.conftest import BIN_DIR
from tests.support.env import REPO, python_env


def _atlas(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "atlas_cli.main", "cluster", *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def process_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cluster_up_runs_the_example_teacher_to_its_children_and_down_leaves_no_process(kube, tmp_path):
    env = python_env(ATLAS_CACHE_DIR=str(tmp_path / "cache"), ATLAS_KUBE_BIN=str(BIN_DIR))
    up = _atlas("up", "--name", "cli-test", env=env)
    pids_file = tmp_path / "cache/kube/clusters/cli-test/pids.json"
    recorded = json.loads(pids_file.read_text()) if pids_file.exists() else {}
    pids = {name: entry["pid"] for name, entry in recorded.items()}
    try:
        assert up.returncode == 0, up.stderr
        exports = [line for line in up.stdout.splitlines() if line.startswith("export KUBECONFIG=")]
        assert len(exports) == 1, up.stdout
        assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "operator"}
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
        table = kubectl("get", "atlasteachers,pytorchjobs,configmaps,services", "-l",
                        "app.kubernetes.io/instance=local-teacher")  # fmt: skip
        assert "pytorchjob.kubeflow.org/local-teacher" in table and "local-teacher-config" in table, table
        printed = kubectl("get", "atlasteacher", "local-teacher")
        assert run["status"]["phase"] in printed.splitlines()[1], printed
        # The operator is the chart's ServiceAccount, not the admin: its own kubeconfig carries a token.
        operator_config = Path(kubeconfig).with_name("operator.kubeconfig").read_text()
        assert "token:" in operator_config and "client-key" not in operator_config
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
