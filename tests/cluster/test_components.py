"""The control plane's components without starting them (atlas_cluster/component.py, controlplane.py): the flags
map and its overrides, rendered in a stable order."""

from __future__ import annotations

from pathlib import Path

from atlas_cluster.component import Component, render_flags
from atlas_cluster.controlplane import ControlPlane, Endpoints, Etcd
from atlas_cluster.processes import Supervisor


def test_flags_render_in_their_order_a_none_value_as_a_bare_flag():
    assert render_flags({"--b": "2", "--a": None, "--c": "x=y"}) == ["--b=2", "--a", "--c=x=y"]


class Echo(Component):
    name = "echo"

    def flags(self):
        return {"--one": "1", "--two": "2", "--flag": None}


def test_an_override_replaces_a_flag_in_place_a_new_one_comes_last_then_the_extra_args(tmp_path):
    echo = Echo(Supervisor(tmp_path), Path("/bin/echo"), {"--two": "22", "--three": "3"}, ["--two=last"])
    assert echo.argv() == ["/bin/echo", "--one=1", "--two=22", "--flag", "--three=3", "--two=last"]
    assert Echo(Supervisor(tmp_path), Path("/bin/echo")).argv() == ["/bin/echo", "--one=1", "--two=2", "--flag"]


def test_etcds_command_line(tmp_path):
    etcd = Etcd(
        Supervisor(tmp_path), Path("/k/etcd"), tmp_path / "etcd", Endpoints(6443, 2379, 2380), {"--log-level": "debug"}
    )
    assert etcd.argv() == [
        "/k/etcd",
        f"--data-dir={tmp_path / 'etcd'}",
        "--listen-client-urls=http://127.0.0.1:2379",
        "--advertise-client-urls=http://127.0.0.1:2379",
        "--listen-peer-urls=http://127.0.0.1:2380",
        "--initial-advertise-peer-urls=http://127.0.0.1:2380",
        "--initial-cluster=default=http://127.0.0.1:2380",
        "--unsafe-no-fsync",
        "--quota-backend-bytes=4294967296",
        "--log-level=debug",
    ]


def test_the_control_plane_hands_each_component_its_overrides_and_the_api_servers_extra_args(tmp_path):
    plane = ControlPlane(
        tmp_path, Path("/k"), apiserver_args=["--watch-cache=false"], flags={"kube-apiserver": {"--v": "4"}}
    )
    plane.endpoints = Endpoints(6443, 2379, 2380)
    argv = plane._apiserver().argv()
    assert argv[0] == "/k/kube-apiserver"
    assert "--v=4" in argv and "--v=1" not in argv
    assert argv[-1] == "--watch-cache=false"
    assert "--secure-port=6443" in argv and "--etcd-servers=http://127.0.0.1:2379" in argv
