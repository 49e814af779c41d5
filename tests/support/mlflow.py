"""A real MLflow tracking server for the tests: ``mlflow server`` of the pinned mlflow (atlas_cluster/mlflow.py), one
per test session (per pytest-xdist worker), on 127.0.0.1 at a free port, its SQLite database and artifacts in a
temporary folder. No root, no Go: mlflow is a Python package of the dev extra.

tests/conftest.py makes ``mlflow_server`` of :func:`mlflow_server` (session scope). What a test gets
(:class:`MLflow`): ``uri`` (the tracking URI), ``client()`` (an ``mlflow.MlflowClient`` of it), ``stop()`` and
``start()`` (an outage: the same port, the same database and artifacts after it), ``server`` (the MLflowServer).
A test that stops it starts it again before it ends (in a ``finally``), as the next test expects it up.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from atlas_cluster.mlflow import MLflowServer
from atlas_cluster.processes import Supervisor


@dataclass
class MLflow:
    """The session's server, as a test uses it."""

    server: MLflowServer

    @property
    def uri(self) -> str:
        return self.server.endpoint

    def client(self):
        """An ``mlflow.MlflowClient`` of this server (its tracking URI given, never the process-wide one)."""
        import mlflow

        return mlflow.MlflowClient(tracking_uri=self.uri)

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> MLflow:
        self.server.start()
        return self


def mlflow_server(tmp_path_factory) -> Iterator[MLflow]:
    """The fixture's body (tests/conftest.py: ``mlflow_server``, session scope): starts the server, stops it after."""
    directory = tmp_path_factory.mktemp("mlflow")
    server = MLflowServer(directory, Supervisor(directory)).start()
    try:
        yield MLflow(server)
    finally:
        server.stop()
