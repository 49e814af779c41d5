"""The real MLflow tracking server the tests and ``atlas cluster up --mlflow`` run (``mlflow server`` of the pinned
mlflow on SQLite, atlas_cluster/mlflow.py), driven with mlflow's own client: a run's param, metric history and
artifact round trip; an outage (the client fails fast when told not to retry, and the store is all there after the
restart); artifacts landing in the real S3 server's bucket; every address it is asked to listen on answering, its
host-header check accepting each and refusing others; and ``atlas cluster status`` printing its export."""

from __future__ import annotations

import json
import shlex
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from atlas_cluster import cli
from atlas_cluster.mlflow import PROCESS, MLflowServer, export_line
from atlas_cluster.paths import cluster_dir
from atlas_cluster.processes import Supervisor

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an http_proxy


def _log_a_run(client: MlflowClient, experiment: str, artifact: Path) -> str:
    """A run with a param, a metric at steps 0-2 and one artifact file; its id."""
    run = client.create_run(client.create_experiment(experiment))
    run_id = run.info.run_id
    client.log_param(run_id, "learning_rate", "0.003")
    for step, value in enumerate((1.5, 0.75, 0.25)):
        client.log_metric(run_id, "loss", value, step=step)
    client.log_artifact(run_id, str(artifact), artifact_path="notes")
    client.set_terminated(run_id)
    return run_id


def _assert_the_run_reads_back(client: MlflowClient, run_id: str, artifact: Path, into: Path) -> None:
    run = client.get_run(run_id)
    assert run.data.params == {"learning_rate": "0.003"}
    assert run.data.metrics == {"loss": 0.25}  # the latest step's
    history = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(0, 1.5), (1, 0.75), (2, 0.25)]
    assert [f.path for f in client.list_artifacts(run_id, "notes")] == [f"notes/{artifact.name}"]
    into.mkdir(parents=True, exist_ok=True)
    downloaded = Path(client.download_artifacts(run_id, f"notes/{artifact.name}", str(into)))
    assert downloaded.read_bytes() == artifact.read_bytes()


def _group_members(leader: int) -> list[int]:
    """The live processes of ``leader``'s process group (the server's: mlflow's CLI and its uvicorn worker)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == leader:
            found.append(int(stat.parent.name))
    return found


def test_a_runs_param_metric_history_and_artifact_round_trip(mlflow_server, tmp_path):
    artifact = tmp_path / "notes.txt"
    artifact.write_text("the teacher's notes\n")
    client = mlflow_server.client()
    run_id = _log_a_run(client, "round-trip", artifact)

    _assert_the_run_reads_back(client, run_id, artifact, tmp_path / "back")
    # Uploaded through the server (--serve-artifacts), into its own folder: the client wrote no file of its own.
    assert client.get_run(run_id).info.artifact_uri.startswith("mlflow-artifacts:/")
    stored = list((mlflow_server.server.directory / "artifacts").rglob(f"{run_id}/artifacts/notes/notes.txt"))
    assert [path.read_text() for path in stored] == ["the teacher's notes\n"]


def test_the_client_fails_fast_while_it_is_down_and_the_store_survives_a_restart(mlflow_server, tmp_path, monkeypatch):
    artifact = tmp_path / "before.txt"
    artifact.write_text("logged before the outage\n")
    client = mlflow_server.client()
    run_id = _log_a_run(client, "outage", artifact)
    uri = mlflow_server.uri
    leader = mlflow_server.server.supervisor.running()[PROCESS]
    assert len(_group_members(leader)) == 2  # `mlflow server` and its one uvicorn worker: no job runner

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    mlflow_server.stop()
    try:
        assert _group_members(leader) == []  # stopped whole: no uvicorn worker left behind
        started = time.monotonic()
        with pytest.raises(MlflowException, match="Connection refused|Max retries exceeded|ConnectionError"):
            client.get_run(run_id)
        assert time.monotonic() - started < 5
    finally:
        mlflow_server.start()

    assert mlflow_server.uri == uri  # the same port
    _assert_the_run_reads_back(mlflow_server.client(), run_id, artifact, tmp_path / "after")
    restarted = mlflow_server.server.supervisor.running()[PROCESS]
    mlflow_server.start()  # once more while it runs (a test's `finally`): the running server is kept, none orphaned
    assert mlflow_server.server.supervisor.running()[PROCESS] == restarted and len(_group_members(restarted)) == 2


def test_its_artifacts_land_in_the_s3_servers_bucket_through_it(s3_server, tmp_path, monkeypatch):
    bucket = s3_server.bucket("mlflow-artifacts")
    directory = tmp_path / "mlflow"
    # The S3 credentials are the server's alone (its environment): the client here has none.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    server = MLflowServer(
        directory, Supervisor(directory), artifacts=f"s3://{bucket}/mlflow", artifact_env=s3_server.env()
    ).start()
    try:
        assert s3_server.secret_key not in " ".join(server.argv())
        artifact = tmp_path / "notes.txt"
        artifact.write_text("kept in S3\n")
        client = MlflowClient(tracking_uri=server.endpoint)
        run_id = _log_a_run(client, "to-s3", artifact)

        s3 = s3_server.client()
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="mlflow/").get("Contents", [])]
        assert [key for key in keys if key.endswith(f"/{run_id}/artifacts/notes/notes.txt")] != [], keys
        key = next(key for key in keys if key.endswith("notes/notes.txt"))
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"kept in S3\n"
        assert not (directory / "artifacts").exists()
        _assert_the_run_reads_back(client, run_id, artifact, tmp_path / "back")
    finally:
        server.stop()


def test_it_answers_on_every_host_its_host_check_accepts_each_and_status_prints_its_export(
    tmp_path, monkeypatch, capsys
):
    # A cluster's folder holding only this server, as `atlas cluster status` reads it (127.0.0.2 stands for the pods'
    # gateway: another local address).
    monkeypatch.setenv("ATLAS_CACHE_DIR", str(tmp_path / "cache"))
    folder = cluster_dir("mlflow-test")
    server = MLflowServer(folder / PROCESS, Supervisor(folder), hosts=("127.0.0.1", "127.0.0.2")).start()
    try:
        for host in server.hosts:
            client = MlflowClient(tracking_uri=server.endpoint_for(host))
            experiment = client.create_experiment(f"from-{host}")  # a POST, through the host and CORS checks
            assert client.get_experiment(experiment).name == f"from-{host}"
            # A browser page served at that address may POST too (its Origin is one of the allowed).
            request = urllib.request.Request(
                server.endpoint_for(host) + "/api/2.0/mlflow/experiments/search",
                data=json.dumps({"max_results": 1}).encode(),
                headers={"Content-Type": "application/json", "Origin": server.endpoint_for(host)},
            )
            assert DIRECT.open(request, timeout=10).status == 200
        # A name it was not asked for (DNS rebinding's) is refused, at either address.
        for host in server.hosts:
            request = urllib.request.Request(
                server.endpoint_for(host) + "/api/2.0/mlflow/experiments/search?max_results=1",
                headers={"Host": f"rebound.example:{server.port}"},
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                DIRECT.open(request, timeout=10)
            assert refused.value.code == 403

        loaded = MLflowServer.load(folder / PROCESS, Supervisor(folder))
        assert (loaded.hosts, loaded.port, loaded.endpoint) == (server.hosts, server.port, server.endpoint)
        assert cli.main(["status", "--name", "mlflow-test"]) == 0
        printed = capsys.readouterr().out.splitlines()
        export = f"export MLFLOW_TRACKING_URI=http://127.0.0.1:{server.port}"
        assert export in printed and export == export_line(server.env()), printed
        assert dict(word.split("=", 1) for word in shlex.split(export)[1:]) == server.env()
    finally:
        server.stop()
    assert Supervisor(folder).running() == {}


def test_cluster_up_parses_mlflow():
    parser = cli.parser()
    assert parser.parse_args(["up", "--mlflow"]).mlflow is True
    assert parser.parse_args(["up", "--s3"]).mlflow is False
    up = parser._subparsers._group_actions[0].choices["up"]
    assert "MLFLOW_TRACKING_URI" in up.format_help()
