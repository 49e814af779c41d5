"""``make cluster-demo``: the product as users run it, on a real control plane, on one machine.

A local cluster with the training-operator (the default backend's controller) and two process nodes, then
``kubectl apply -f examples/local-teacher.yaml``, the run watched as ``kubectl get atlasteachers -w`` shows it until
it ends, then its ``.status.result``; the cluster goes down at the end unless ``--keep``.

python -m atlas_cluster.demo [--keep] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time

from atlas_cluster.build import BuildError, ensure_built, ensure_controllers
from atlas_cluster.cluster import REPO, STOP_ORDER, ClusterError, LocalCluster, kubectl
from atlas_cluster.controllers import ControllerError
from atlas_cluster.paths import cluster_dir
from atlas_cluster.processes import ProcessFailed, Supervisor

NAME = "demo"
EXAMPLE = REPO / "examples" / "local-teacher.yaml"
CONTROLLERS = ("training-operator",)  # PyTorchJob: the backend of a run that names none
TERMINAL = ("Succeeded", "Failed", "Invalid")


def _say(line: str) -> None:
    print(line, flush=True)


def watch(cluster: LocalCluster, kind: str, name: str, timeout: float) -> dict:
    """Print each new row of ``kubectl get <kind> <name>`` until the run's phase is terminal; its status."""
    deadline, last, header_printed = time.monotonic() + timeout, None, False
    while True:
        status = json.loads(kubectl(cluster.kubeconfig, "get", kind, name, "-o", "json").stdout).get("status") or {}
        table = kubectl(cluster.kubeconfig, "get", kind, name).stdout.splitlines()  # read after: never behind it
        if not header_printed:
            _say(table[0])
            header_printed = True
        row = " ".join(table[1].split()[:-1])  # without AGE, which changes every second
        if row != last:
            _say(table[1])
            last = row
        if status.get("phase") in TERMINAL:
            return status
        if time.monotonic() > deadline:
            raise ClusterError(f"{kind}/{name} still {status.get('phase')} after {timeout:.0f} s; logs: {cluster.logs}")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atlas_cluster.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster up (atlas cluster down --name demo)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the run to end (default 600)")
    args = parser.parse_args(argv)
    directory = cluster_dir(NAME)
    Supervisor(directory).stop_all(STOP_ORDER)  # a demo left running by an earlier --keep
    try:
        bin_dir = ensure_built(log=_say)
        binaries = ensure_controllers(CONTROLLERS, log=_say)
        cluster = LocalCluster(
            directory,
            bin_dir,
            log=_say,
            controllers=CONTROLLERS,
            controller_binaries=binaries,
            nodes=2,
            gpus_per_node=0,
        )
        cluster.up()
    except (BuildError, ClusterError, ControllerError, ProcessFailed, FileNotFoundError) as exc:
        _say(f"cluster-demo: {exc}")
        Supervisor(directory).stop_all(STOP_ORDER)
        return 1
    code = 1
    try:
        _say(f"$ kubectl apply -f {EXAMPLE.relative_to(REPO)}")
        _say(kubectl(cluster.kubeconfig, "apply", "-f", str(EXAMPLE)).stdout.strip())
        _say("$ kubectl get atlasteachers local-teacher -w")
        status = watch(cluster, "atlasteachers", "local-teacher", args.timeout)
        _say("$ kubectl get pytorchjobs,pods -l app.kubernetes.io/instance=local-teacher")
        _say(kubectl(cluster.kubeconfig, "get", "pytorchjobs,pods", "-l", "app.kubernetes.io/instance=local-teacher",
                     "-o", "wide").stdout.rstrip())  # fmt: skip  # a command line: each flag beside its value
        _say(f"result: {json.dumps(status.get('result'))}")
        code = 0 if status.get("phase") == "Succeeded" else 1
    except ClusterError as exc:
        _say(f"cluster-demo: {exc}")
    finally:
        if args.keep:
            _say(f"export KUBECONFIG={cluster.kubeconfig}   # atlas cluster down --name {NAME} when done")
        else:
            cluster.down()
            shutil.rmtree(directory, ignore_errors=True)  # as `atlas cluster down` leaves nothing
    return code


if __name__ == "__main__":
    sys.exit(main())
