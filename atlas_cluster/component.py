"""One component of the local cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, each backend's
controller) as a supervised process: its binary and flags, started under the cluster's Supervisor (its log in
``logs/<name>.log``, its pid in the pid file), ready when its own check says so, stopped or killed by name.

Flags are a map (``{"--v": "1", "--unsafe-no-fsync": None}``) rendered in its order as ``--name=value`` (``--name``
for None): a caller overrides one by name (``flags={"--v": "4"}``) without repeating the rest, and the command line
is the component's own otherwise.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from atlas_cluster.processes import ProcessFailed, Supervisor, log_tail

Flags = Mapping[str, str | None]
READY_TIMEOUT = 60.0
# The Go runtime's collector at a quarter of its default pace for the local cluster's Go processes (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, the backends' controllers):
# on 2 cores shared with the operator and the trainers, a burst of runs spent half the API server's CPU in the Go
# runtime, allocating and collecting (bench/operator_throughput.py --api real: the API server's CPU for 100 runs,
# 10.3-11.1 s at the default 100, 7.5-7.6 s at 400), for more heap between collections.
GO_GC_PERCENT = "400"


def go_env() -> dict[str, str]:
    """Our environment for a control-plane process, with GO_GC_PERCENT (a GOGC already set is kept)."""
    return {"GOGC": GO_GC_PERCENT, **os.environ}


def render_flags(flags: Flags) -> list[str]:
    """``--name=value`` for each flag in the map's order, ``--name`` alone for a flag whose value is None."""
    return [name if value is None else f"{name}={value}" for name, value in flags.items()]


class Component:
    """One supervised process: ``flags()`` are its own, ``overrides`` replace (or add, at the end) flags by name,
    ``extra_args`` come last as given; ``ready()`` is polled every ``poll_s`` until ``ready_timeout``."""

    name: str
    ready_timeout = READY_TIMEOUT
    poll_s = 0.1

    def __init__(
        self, supervisor: Supervisor, binary: Path, overrides: Flags | None = None, extra_args: Sequence[str] = ()
    ):
        self.supervisor = supervisor
        self.binary = binary
        self.overrides = dict(overrides or {})
        self.extra_args = tuple(extra_args)

    def flags(self) -> dict[str, str | None]:
        return {}

    def argv(self) -> list[str]:
        return [str(self.binary), *render_flags({**self.flags(), **self.overrides}), *self.extra_args]

    def env(self) -> dict[str, str]:
        return go_env()

    def cwd(self) -> Path | None:
        return None

    def prepare(self) -> None:
        """What must exist before the process starts (config files, certificates)."""

    def ready(self) -> bool:
        return True

    @property
    def what(self) -> str:
        """How a readiness failure names it."""
        return self.name

    @property
    def log(self) -> Path:
        return self.supervisor.log(self.name)

    def start(self) -> Component:
        """Prepare, start the process and return once it is ready (ProcessFailed with its log's tail if it exits
        or is not ready in time)."""
        self.prepare()
        self.supervisor.start(self.name, self.argv(), env=self.env(), cwd=self.cwd())
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            self.supervisor.check(self.name)
            with contextlib.suppress(Exception):
                if self.ready():
                    return
            if time.monotonic() > deadline:
                raise self.not_ready()
            time.sleep(self.poll_s)

    def not_ready(self) -> Exception:
        return ProcessFailed(f"{self.what} not ready in {self.ready_timeout:.0f} s; {self.log}:\n{log_tail(self.log)}")

    def stop(self) -> None:
        self.supervisor.stop(self.name)

    def kill(self) -> None:
        """SIGKILL, as a crash: no graceful shutdown, every client's connection reset."""
        self.supervisor.kill(self.name)
