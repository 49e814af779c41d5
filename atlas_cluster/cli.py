"""``atlas cluster up`` / ``down`` / ``status``: a local Kubernetes without Docker, as kind's ``create cluster``.

atlas cluster up                  # build the control plane once (minutes), start it, install the CRDs, the chart
                                  # and the operator under the chart's ServiceAccount; prints export KUBECONFIG=…
atlas cluster up --bin-dir DIR    # binaries from DIR (setup-envtest's folder works; $ATLAS_KUBE_BIN too)
atlas cluster up --controllers jobset,kueue,trainer,training-operator
                                  # also the backends' real controllers, webhooks serving (built once, minutes)
atlas cluster up --nodes 2        # and two process nodes that run the pods (the real kube-scheduler; root)
atlas cluster up --s3             # and an S3-compatible server (versitygw, built once) with a bucket `atlas`, its
                                  # credentials in the Secret default/atlas-s3; also prints export AWS_ENDPOINT_URL=…
                                  # AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… ($ATLAS_S3_BIN: the binary to run)
atlas cluster up --mlflow         # and an MLflow tracking server (SQLite; artifacts beside it, or with --s3 in the
                                  # bucket `atlas` under mlflow/); also prints export MLFLOW_TRACKING_URI=…
atlas cluster status              # the running processes, and the exports
atlas cluster down                # stop every process it started and remove the cluster's folder
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import yaml

from atlas_cluster import versions
from atlas_cluster.build import BuildError, ensure_built, ensure_controllers, ensure_s3_server, parse_controllers
from atlas_cluster.cluster import (
    MLFLOW_ARTIFACTS,
    S3_SECRET,
    S3_SECRET_NAMESPACE,
    STOP_ORDER,
    ClusterError,
    LocalCluster,
)
from atlas_cluster.controllers import ControllerError
from atlas_cluster.mlflow import PROCESS as MLFLOW
from atlas_cluster.mlflow import MLflowServer
from atlas_cluster.paths import DEFAULT_CLUSTER, cluster_dir
from atlas_cluster.processes import ProcessFailed, Supervisor
from atlas_cluster.s3 import DEFAULT_BUCKET, S3Server, export_line
from atlas_cluster.s3 import PROCESS as S3

BIN_ENV = "ATLAS_KUBE_BIN"
S3_BIN_ENV = "ATLAS_S3_BIN"  # the versitygw binary to run (default: built from its Go module into the cache)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _set_value(values: dict, assignment: str) -> None:
    """``a.b=v`` (v parsed as YAML) into ``values``, as ``helm --set`` does for simple values."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise SystemExit(f"atlas cluster: --set expects KEY=VALUE, got {assignment!r}")
    *parents, leaf = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
    values[leaf] = yaml.safe_load(raw)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atlas cluster", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="action", required=True)
    up = commands.add_parser("up", help="start a local cluster with the CRDs, the chart and the operator")
    down = commands.add_parser("down", help="stop the local cluster and remove its folder")
    status = commands.add_parser("status", help="the cluster's processes, kubeconfig, S3 and MLflow exports")
    for command in (up, down, status):
        command.add_argument("--name", default=DEFAULT_CLUSTER, help=f"cluster name (default {DEFAULT_CLUSTER})")
    up.add_argument(
        "--bin-dir",
        type=Path,
        default=os.environ.get(BIN_ENV) or None,
        help=f"etcd, kube-apiserver (and kube-controller-manager) from this folder, e.g. setup-envtest's "
        f"(${BIN_ENV}; default: built from the Go modules into the cache)",
    )
    up.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a chart value (repeatable)")
    up.add_argument("--no-operator", action="store_true", help="install the chart but start no operator")
    up.add_argument(
        "--nodes",
        type=int,
        default=0,
        metavar="N",
        help="process nodes that run the pods (the real kube-scheduler binds them; needs root); default 0: "
        "pods stay Pending",
    )
    up.add_argument(
        "--gpus-per-node", type=int, default=8, metavar="G", help="fake nvidia.com/gpu per node (default 8)"
    )
    up.add_argument(
        "--controllers",
        default="",
        metavar="NAMES",
        help=f"also run these backends' upstream controllers, comma-separated ({','.join(versions.CONTROLLERS)}; "
        "default none); built from the Go modules into the cache the first time",
    )
    up.add_argument(
        "--s3",
        action="store_true",
        help=f"also run an S3-compatible server (versitygw {versions.VERSITYGW}, built from its Go module the first "
        f"time; ${S3_BIN_ENV}: a binary instead) with an empty bucket `{DEFAULT_BUCKET}`, its credentials and "
        f"the address pods reach in the Secret {S3_SECRET_NAMESPACE}/{S3_SECRET}; prints export AWS_ENDPOINT_URL=… "
        "AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… for the host",
    )
    up.add_argument(
        "--mlflow",
        action="store_true",
        help="also run an MLflow tracking server (the installed mlflow's `mlflow server`), its runs in a SQLite "
        "database in the cluster's folder (mlflow/mlflow.db) and its artifacts beside it, or with --s3 in the S3 "
        f"server's bucket ({MLFLOW_ARTIFACTS}), clients uploading them through it; on 127.0.0.1 and, with --nodes, "
        "the pods' gateway; prints export MLFLOW_TRACKING_URI=… for the host",
    )
    return parser


def up(args: argparse.Namespace) -> int:
    directory = cluster_dir(args.name)
    values: dict = {}
    for assignment in args.set:
        _set_value(values, assignment)
    try:
        controllers = parse_controllers(args.controllers)
    except ValueError as exc:
        _say(f"atlas cluster: --controllers: {exc}")
        return 2
    try:
        bin_dir = args.bin_dir or ensure_built(log=_say)
        binaries = ensure_controllers(controllers, log=_say)
        s3_binary = None
        if args.s3:
            s3_binary = Path(os.environ[S3_BIN_ENV]) if os.environ.get(S3_BIN_ENV) else ensure_s3_server(log=_say)
        cluster = LocalCluster(
            directory,
            Path(bin_dir),
            chart_values=values,
            start_operator=not args.no_operator,
            log=_say,
            controllers=controllers,
            controller_binaries=binaries,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            s3_binary=s3_binary,
            mlflow=args.mlflow,
        )
        cluster.up()
    except (BuildError, ClusterError, ControllerError, ProcessFailed, FileNotFoundError) as exc:
        _say(f"atlas cluster: {exc}")
        if "already running" not in str(exc):
            Supervisor(directory).stop_all()
        return 1
    _say(f"atlas cluster: logs in {cluster.logs}; stop it with: atlas cluster down --name {args.name}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    if cluster.s3 is not None:
        print(export_line(cluster.s3.env()))
    if cluster.mlflow_server is not None:
        print(export_line(cluster.mlflow_server.env("127.0.0.1")))
        _print_pod_address(cluster.mlflow_server)
    return 0


def down(args: argparse.Namespace) -> int:
    directory = cluster_dir(args.name)
    supervisor = Supervisor(directory)
    running = supervisor.running()
    supervisor.stop_all(STOP_ORDER)
    shutil.rmtree(directory, ignore_errors=True)
    _say(f"atlas cluster: stopped {', '.join(running) or 'nothing (not running)'}; removed {directory}")
    return 0


def status(args: argparse.Namespace) -> int:
    directory = cluster_dir(args.name)
    running = Supervisor(directory).running()
    if not running:
        print(f"cluster {args.name}: not running")
        return 1
    for name, pid in running.items():
        print(f"{name}: pid {pid}")
    print(f"export KUBECONFIG={directory / 'admin.kubeconfig'}")
    supervisor = Supervisor(directory)
    s3 = S3Server.load(directory / S3, Path(), supervisor) if S3 in running else None
    if s3 is not None:
        print(
            f"# S3 server on {', '.join(s3.hosts)} port {s3.port}: bucket {DEFAULT_BUCKET}, data in {s3.data}, "
            f"Secret {S3_SECRET_NAMESPACE}/{S3_SECRET} for the pods"
        )
        print(export_line(s3.env()))
    mlflow = MLflowServer.load(directory / MLFLOW, supervisor) if MLFLOW in running else None
    if mlflow is not None:
        print(
            f"# MLflow server on {', '.join(mlflow.hosts)} port {mlflow.port}: database {mlflow.database}, "
            f"artifacts {mlflow.artifacts_destination}"
        )
        print(export_line(mlflow.env("127.0.0.1")))
        _print_pod_address(mlflow)
    return 0


def _print_pod_address(server: MLflowServer) -> None:
    """The address the nodes' pods reach the MLflow server at: what a run's spec.tracking.mlflow.uri says."""
    for host in server.hosts[1:]:
        print(f"# the pods reach it at {server.endpoint_for(host)} (spec.tracking.mlflow.uri)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return {"up": up, "down": down, "status": status}[args.action](args)


if __name__ == "__main__":
    sys.exit(main())
