"""An MLflow tracking server on this machine: the ``mlflow server`` of the pinned mlflow (pyproject.toml's dev
extra), run by this Python, for ``atlas cluster up --mlflow`` and the tests.

- Storage: runs, params and metrics in the SQLite database ``<folder>/mlflow.db`` (tables made by mlflow itself on
  its first start); artifacts in ``<folder>/artifacts``, or wherever ``artifacts`` names (``s3://atlas/mlflow`` in a
  cluster with ``--s3``: the S3 server's credentials are handed to the process in its environment, never on its
  command line). ``--serve-artifacts``: clients upload and download artifacts through the server, so they need no
  storage credentials of their own.
- Listens at one port on each of ``hosts``: 127.0.0.1, and on a cluster with process nodes the pod network's gateway too
  (atlas_cluster/node/podnet.py), where pods reach it. ``mlflow server`` binds one address (uvicorn's ``--host``), so
  with more than one host it binds 0.0.0.0 — every interface of this machine, not only those asked. Its host-header
  check (``--allowed-hosts``) accepts exactly ``<host>:<port>`` of each of ``hosts`` (and ``localhost:<port>`` beside
  127.0.0.1), so a browser page on another name is refused (DNS rebinding); it authenticates no one, as the S3 server
  with its keys does, so a cluster with process nodes is for a machine whose network you trust.
- Started under the cluster's Supervisor as ``mlflow`` (``mlflow server`` and its one uvicorn worker in one process
  group, stopped whole: ``atlas cluster down`` stops them with the rest); ``start`` returns once every address
  answers ``/health`` (a bounded wait, ``READY_TIMEOUT``). Its port, picked once, and hosts are kept in
  ``<folder>/server.json``: a ``stop`` then ``start`` serves the same database at the same address, and
  ``atlas cluster status`` rebuilds it with ``MLflowServer.load``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from atlas_cluster.ports import free_port
from atlas_cluster.processes import Supervisor
from atlas_cluster.s3 import _answers
from atlas_cluster.s3 import export_line as export_line  # the one copy (atlas_cluster/s3.py), re-exported here

PROCESS = "mlflow"  # its name in the Supervisor: logs/mlflow.log, pids.json
# Two Pythons import mlflow one after the other (its CLI, then uvicorn's worker): 5-7 s on two cores; a first start
# adds mlflow's migrations of the new database, 1 s on tmpfs, 4-7 s on a disk (a sync per migration).
READY_TIMEOUT = 60.0
HEALTH_PATH = "/health"  # mlflow's own, exempt from its host-header check
DATABASE = "mlflow.db"
STATE_FILE = "server.json"
ANY_ADDRESS = "0.0.0.0"
# The environment the server keeps from ours: nothing else, so an MLFLOW_* or AWS_* variable of the user's (an
# MLFLOW_TRACKING_URI, a profile's credentials) changes none of its settings.
HOST_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "PYTHONPATH")
SERVER_ENV = {
    # No job runner (its huey consumers: eight more processes and 3 s more to start, for LLM judges we do not run).
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PYTHONUNBUFFERED": "1",  # its log as it happens
    "PYTHONSAFEPATH": "1",  # `-m mlflow` and `-m uvicorn` never import from the folder they run in
}


@dataclass
class MLflowServer:
    """One ``mlflow server`` process serving ``directory``'s database. ``start()``, ``stop()``; ``endpoint`` is the
    first address's URL, ``endpoint_for(host)`` any other's, ``env(host)`` the MLFLOW_TRACKING_URI of either."""

    directory: Path
    supervisor: Supervisor
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int | None = None  # None: a free port, chosen at the first start and kept
    artifacts: str | None = None  # the artifacts' destination URI; None: <directory>/artifacts
    artifact_env: dict[str, str] = field(default_factory=dict)  # e.g. AWS_* for an s3:// destination

    @property
    def database(self) -> Path:
        return self.directory / DATABASE

    @property
    def backend_store_uri(self) -> str:
        return f"sqlite:///{self.database.resolve()}"

    @property
    def artifacts_destination(self) -> str:
        return self.artifacts or (self.directory / "artifacts").resolve().as_uri()

    @property
    def endpoint(self) -> str:
        return self.endpoint_for(self.hosts[0])

    def endpoint_for(self, host: str) -> str:
        if host not in self.hosts:
            raise ValueError(f"the MLflow server does not listen on {host} (only {', '.join(self.hosts)})")
        if self.port is None:
            raise ValueError("the MLflow server has no port yet (start it)")
        return f"http://{host}:{self.port}"

    def env(self, host: str | None = None) -> dict[str, str]:
        """``MLFLOW_TRACKING_URI``, the address of ``host`` (default the first): what points mlflow's client here."""
        return {"MLFLOW_TRACKING_URI": self.endpoint_for(host or self.hosts[0])}

    @property
    def bind_address(self) -> str:
        """The one address ``mlflow server --host`` binds: the host itself when one is asked, else every interface."""
        return self.hosts[0] if len(set(self.hosts)) == 1 else ANY_ADDRESS

    def allowed_hosts(self) -> list[str]:
        """The Host headers its middleware accepts: each address as a client names it (``host:port``)."""
        names = [*self.hosts, *(["localhost"] if "127.0.0.1" in self.hosts else [])]
        return [f"{name}:{self.port}" for name in names]

    def argv(self) -> list[str]:
        origins = [self.endpoint_for(host) for host in self.hosts]  # the UI opened at any of them may POST
        return [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", self.backend_store_uri,
            "--serve-artifacts", "--artifacts-destination", self.artifacts_destination,
            "--host", self.bind_address, "--port", str(self.port), "--workers", "1",
            "--allowed-hosts", ",".join(self.allowed_hosts()), "--cors-allowed-origins", ",".join(origins),
        ]  # fmt: skip  # a command line: each flag beside its value

    def start(self, timeout: float = READY_TIMEOUT) -> MLflowServer:
        """Start the server and wait until it answers on every host (one its supervisor started that runs is kept)."""
        if importlib.util.find_spec("mlflow") is None:  # finds it without importing it (2 s)
            raise FileNotFoundError(f"no mlflow in {sys.executable}'s environment (pip install -e '.[dev]')")
        self.port = self.port or free_port()
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {name: os.environ[name] for name in HOST_ENV if name in os.environ}
        env.update(SERVER_ENV)
        env.update(self.artifact_env)
        started = self.supervisor.children.get(PROCESS)
        if started is None or started.poll() is not None:  # not up: a second `mlflow server` would orphan the first
            self.supervisor.start(PROCESS, self.argv(), env=env, cwd=self.directory)
        self.save()
        urls = [self.endpoint_for(host) + HEALTH_PATH for host in self.hosts]
        self.supervisor.wait_until(
            PROCESS, lambda: all(_answers(url) for url in urls), timeout, f"the MLflow server on {urls}"
        )
        return self

    def stop(self) -> None:
        self.supervisor.stop(PROCESS)

    # ------------------------------------------------------------------ for `atlas cluster status`

    def save(self) -> None:
        state = {"hosts": list(self.hosts), "port": self.port, "artifacts": self.artifacts}
        path = self.directory / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path, supervisor: Supervisor) -> MLflowServer | None:
        """The server ``start`` recorded in ``directory`` (None if none was); without ``artifact_env``, which is
        the S3 server's to keep (atlas_cluster/s3.py's ``server.json``)."""
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return cls(directory, supervisor, tuple(state["hosts"]), state["port"], state.get("artifacts"))
