"""The real control plane's costs on this machine, measured in one run (python -m bench.control_plane):

- the build check with every binary cached (what `make test` pays each time),
- start → ready for etcd and kube-apiserver, the project's and the backends' CRDs applied and Established, then
  kube-controller-manager (the order of `atlas cluster up` and of tests/kube/'s session fixture),
- the chart installed with the real helm,
- the operator under the chart's ServiceAccount: process start → the first run's children (ConfigMap and job),
- `down`: every process gone.

Each phase is timed --rounds times (default 3) and printed as median and max. Needs the binaries
(`make kube`); the cold build is timed by `python -m atlas_cluster.build` itself when it runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from atlas_cluster.build import default_bin_dir, ensure_built, missing
from atlas_cluster.cluster import LocalCluster, backend_crd_files, kubectl

REPO = Path(__file__).resolve().parents[1]
RUN = {
    "apiVersion": "atlas.arc.computer/v1alpha1",
    "kind": "AtlasTeacher",
    "metadata": {"name": "bench-teacher", "namespace": "default"},
    "spec": {"model": "m", "dataset": {"source": "builtin://arithmetic"}, "student": {"model": "s"}},
}


def _timed(phases: dict[str, list[float]], name: str, started: float) -> float:
    now = time.monotonic()
    phases.setdefault(name, []).append(now - started)
    return now


def one_round(bin_dir: Path, phases: dict[str, list[float]]) -> None:
    with tempfile.TemporaryDirectory(prefix="atlas-bench-cp-") as tmp:
        cluster = LocalCluster(Path(tmp), bin_dir, log=lambda line: None)
        try:
            t = time.monotonic()
            cluster.control_plane.start(controller_manager=False)
            t = _timed(phases, "etcd + kube-apiserver start → ready", t)
            cluster.apply_files(sorted((REPO / "crds").glob("*.yaml")) + backend_crd_files(lambda line: None))
            t = _timed(phases, "CRDs applied and Established (ours + PyTorchJob, JobSet, Trainer)", t)
            cluster.control_plane.start_controller_manager()
            t = _timed(phases, "kube-controller-manager start → ready", t)
            for name, seconds in cluster.control_plane.ready_after.items():
                phases.setdefault(f"  of which {name} alone", []).append(seconds)
            cluster.install_chart({"watchNamespaces": ["default"]})
            t = _timed(phases, "helm upgrade --install of the chart", t)
            cluster.start_operator_process()
            kubectl(cluster.kubeconfig, "create", "-f", "-", input=json.dumps(RUN))
            while not kubectl(cluster.kubeconfig, "get", "pytorchjob", "bench-teacher", check=False).returncode == 0:
                if time.monotonic() - t > 120:
                    raise SystemExit("the operator made no PyTorchJob in 120 s: see " + str(cluster.logs))
                time.sleep(0.1)
            t = _timed(phases, "operator start + first run → its PyTorchJob", t)
        finally:
            t = time.monotonic()
            cluster.down()
            _timed(phases, "down (every process stopped)", t)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    bin_dir = default_bin_dir()
    if missing(bin_dir):
        print(f"no control plane in {bin_dir}: make kube first", file=sys.stderr)
        return 1
    t = time.monotonic()
    ensure_built(bin_dir)
    cached_check = time.monotonic() - t
    phases: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        one_round(bin_dir, phases)
    print(f"{'phase':<72} {'median':>8} {'max':>8}")
    print(f"{'build check, binaries cached':<72} {cached_check:>7.3f}s {cached_check:>7.3f}s")
    for name, values in phases.items():
        print(f"{name:<72} {statistics.median(values):>7.2f}s {max(values):>7.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
