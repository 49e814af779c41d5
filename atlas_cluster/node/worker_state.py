"""What a pod's worker holds (``PodState``) and what it asks of the nodes that run it (``PodHost``): the shared
ground of the worker's parts — its environment (environment.py), volumes (volumes.py), containers
(runtime.py, container.py), probes (probes.py) and status (status.py) — which pod.py's ``PodWorker`` puts together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from atlas_cluster.node.container import Container
from atlas_cluster.node.lease import Node
from atlas_cluster.node.podnet import PodNetwork


class PodHost(Protocol):
    """The process nodes (nodes.py ``ProcessNodes``) as a pod's worker sees them."""

    workdir: Path
    network: PodNetwork
    cgroups: Path | None
    host_env: tuple[str, ...]
    extra_env: dict[str, str]
    python_bin: Path
    terminations: list[tuple[str, float, int]]
    wake: threading.Event
    log: Callable[[str], None]

    @property
    def shims(self) -> Path: ...

    def mount_point(self, target: str, directory: bool) -> None: ...

    def claim_dir(self, namespace: str, claim: str) -> Path: ...

    # ``worker``: the PodWorker (pod.py), which this module's PodState is the ground of
    def forget(self, worker: Any) -> None: ...

    def refresh_hosts(self, worker: Any) -> None: ...


class PodState:
    """The attributes of one pod's worker (set in ``PodWorker.__init__``)."""

    nodes: PodHost
    node: Node
    pod: dict
    namespace: str
    pod_name: str
    uid: str
    directory: Path
    gone: bool  # the object was deleted (force-deleted, or by us)
    halt: bool  # the node stops: kill, report nothing
    ip: str | None
    netns: bool
    host_network: bool
    hostname: str
    policy: str
    phase: str
    init_done: bool
    start_time: str
    tmpfs: list[Path]
    volumes: dict[str, Path]
    read_only_volumes: set[str]
    reported: dict | None
    transitions: dict[str, tuple[str, str]]
    init: list[Container]
    main: list[Container]
