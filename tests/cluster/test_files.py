"""The local cluster's files: the pid file that lets ``atlas cluster down`` (another process) stop exactly what
``up`` started, kubeconfigs, where helm and kubectl are cached, and the mounts a node leaves alone."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import yaml

from atlas_cluster.helm_kubectl import tools_dir
from atlas_cluster.kubeconfig import kubeconfig, server_of, write_kubeconfig
from atlas_cluster.node.volumes import mounted_anywhere
from atlas_cluster.processes import Supervisor


def test_the_pid_file_records_a_process_with_its_start_time(tmp_path):
    supervisor = Supervisor(tmp_path)
    supervisor._record("me", os.getpid())  # this test's own process: alive, never stopped here
    entry = supervisor.recorded()["me"]
    assert entry["pid"] == os.getpid() and entry["started"] > 0
    assert supervisor.running() == {"me": os.getpid()}
    assert Supervisor(tmp_path).running() == {"me": os.getpid()}  # another process reads the same file


def test_a_recorded_pid_that_is_now_another_process_is_not_running_and_is_not_signalled(tmp_path):
    supervisor = Supervisor(tmp_path)
    supervisor._record("old", os.getpid())
    entries = supervisor.recorded()
    entries["old"]["started"] -= 1  # as after a reboot: the pid is reused by some other process
    supervisor.pid_file.write_text(json.dumps(entries))
    assert supervisor.running() == {}
    supervisor.stop("old")  # signals nothing (we are alive to see it) and forgets it
    assert not supervisor.pid_file.exists()


def test_an_unreadable_pid_file_records_nothing(tmp_path):
    supervisor = Supervisor(tmp_path)
    supervisor.pid_file.write_text("{not json")
    assert supervisor.recorded() == {} and supervisor.running() == {}


def test_a_kubeconfig_has_one_cluster_user_and_context_and_only_its_owner_reads_it(tmp_path):
    config = kubeconfig("https://127.0.0.1:6443", tmp_path / "ca.crt", {"token": "t"})
    path = write_kubeconfig(tmp_path / "sub" / "x.kubeconfig", config)
    assert yaml.safe_load(path.read_text()) == config
    assert config["contexts"][0]["context"] == {"cluster": "atlas", "user": "atlas"}
    assert config["current-context"] == "atlas"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert server_of(path) == "https://127.0.0.1:6443"


def test_helm_and_kubectl_are_cached_under_the_one_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    assert tools_dir() == tmp_path / "cache" / "k8s-tools"
    monkeypatch.delenv("ATLAS_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tools_dir() == tmp_path / "home" / ".cache" / "atlas-tools"  # beside ~/.cache/atlas, as machines have it


def test_a_mount_at_or_under_a_path_in_any_process_is_found(tmp_path):
    proc = tmp_path / "proc"
    line = "36 35 98:0 / {} rw,noatime master:1 - ext3 /dev/root rw"
    (proc / "100").mkdir(parents=True)
    (proc / "100" / "mountinfo").write_text(line.format("/data/runs/ckpt") + "\n")
    (proc / "self").mkdir()  # not a pid: not read
    assert not mounted_anywhere(tmp_path, proc)
    assert mounted_anywhere(Path("/data/runs"), proc)
    assert mounted_anywhere(Path("/data/runs/ckpt"), proc)
    assert not mounted_anywhere(Path("/data/run"), proc)  # a prefix of a name is not a parent
