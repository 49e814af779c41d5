"""Free TCP ports on 127.0.0.1 for the local cluster's processes (the API server, etcd, each controller's
metrics, health and webhook servers…), never one handed out twice by this process."""

from __future__ import annotations

import socket

# Ports this process has handed out: the kernel may give a just-released port again, and a
# controller whose metrics and health ports came out equal exits at start (seen in CI).
_ISSUED_PORTS: set[int] = set()


def free_port() -> int:
    """A free port on 127.0.0.1 that this process has not handed out before."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ISSUED_PORTS:
            _ISSUED_PORTS.add(port)
            return port
