"""free_port never hands out a port twice in one process (a controller whose metrics and
health ports came out equal exited at start in CI: the kernel reuses a just-released port)."""

from __future__ import annotations

import socket

from atlas_cluster.controlplane import free_port


def test_free_port_gives_distinct_bindable_ports() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:  # the last one is really free
        s.bind(("127.0.0.1", ports[-1]))
