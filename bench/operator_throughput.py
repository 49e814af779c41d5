"""Operator throughput: N runs created against the Kubernetes API emulator (kmock), one `atlas operator`.

For each run: seconds from its create to all its children present, and the API writes the operator
made for it once settled (children, status, finalizer, events). Also the operator's peak RSS.
Targets: p95 < 2 s, writes <= children + 3 per run, RSS < 150 MB.

    .venv/bin/python bench/operator_throughput.py [--runs 100] [--settle 6]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import kubernetes  # noqa: E402
from conftest import free_port, python_env  # noqa: E402
from kube_emulator import PYTORCHJOBS, EmulatorThread, write_kubeconfig  # noqa: E402
from operator_support import training  # noqa: E402

from atlas_contract.names import ChildNames  # noqa: E402

NS = "team-a"
CHILDREN = (  # (resource, atlas_contract.names.ChildNames attribute)
    ("v1/configmaps", "config_map"),
    ("v1/services", "rollout"),
    ("v1/services", "metrics"),
    ("apps/v1/deployments", "rollout"),
    (PYTORCHJOBS, "job"),
)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--settle", type=float, default=6.0, help="quiet seconds (3 status refreshes) = settled")
    args = parser.parse_args()

    with EmulatorThread() as server:
        workdir = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", server.url)
        env = python_env(
            KUBECONFIG=str(kubeconfig),
            ATLAS_OPERATOR_METRICS_PORT=str(free_port()),
            ATLAS_OPERATOR_METRICS_HOST="127.0.0.1",
            ATLAS_PROGRESS_INTERVAL="2",  # settling spans several status refreshes
        )
        log = open(workdir / "operator.log", "wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "atlas_core.cli.main", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        emu = server.emulator
        try:
            api = kubernetes.client.CustomObjectsApi(kubernetes.config.new_client_from_config(str(kubeconfig)))
            # The operator's start-up (imports, login) is not what is measured: start once it watches runs.
            deadline = time.monotonic() + 120
            while {c.resource for c in emu.calls(lambda c: c.query.get("watch") == "true")} < {
                "atlastrainings",
                "atlasteachers",
            }:
                if time.monotonic() > deadline or operator.poll() is not None:
                    raise SystemExit("the operator never watched the runs: see operator.log")
                time.sleep(0.1)
            names = [f"run-{i:03d}" for i in range(args.runs)]
            created_at: dict[str, float] = {}
            ready_at: dict[str, float] = {}
            stop = threading.Event()

            import kmock

            keys = {
                name: [(kmock.resource(r), NS, getattr(ChildNames(name), a)) for r, a in CHILDREN] for name in names
            }

            def present(key) -> bool:  # a key lookup: no deep copy, so the watcher stays off the CPU
                return key in emu.objects and not emu.objects[key].deleted

            def watch_children() -> None:
                while not stop.is_set():
                    for name in list(created_at):
                        if name not in ready_at and all(present(k) for k in keys[name]):
                            ready_at[name] = time.monotonic()
                    time.sleep(0.02)

            # Multi-node runs keep checkpoints on a shared claim, as the operator asks them to (without one a run
            # also gets a CheckpointsNotShared Warning Event: one more write).
            kubernetes.client.CoreV1Api(api.api_client).create_namespaced_persistent_volume_claim(
                NS,
                {
                    "metadata": {"name": "ckpt"},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}},
                },
            )
            watcher = threading.Thread(target=watch_children, daemon=True)
            watcher.start()
            started = time.monotonic()
            for name in names:
                created_at[name] = time.monotonic()
                api.create_namespaced_custom_object(
                    "atlas.arc.computer", "v1alpha1", NS, "atlastrainings", training(name, checkpoint={"pvc": "ckpt"})
                )
            deadline = time.monotonic() + 120
            while len(ready_at) < len(names) and time.monotonic() < deadline:
                time.sleep(0.05)
            all_ready = time.monotonic() - started
            # Settled: no operator write for --settle seconds.
            last = len(emu.calls(lambda c: c.is_write))
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < args.settle:
                time.sleep(0.25)
                now = len(emu.calls(lambda c: c.is_write))
                if now != last:
                    last, quiet_since = now, time.monotonic()
            stop.set()

            latencies = [ready_at[n] - created_at[n] for n in names if n in ready_at]
            writes = []
            for name in names:
                run_writes = [
                    c
                    for c in emu.calls(lambda c: c.is_write)
                    if c.status
                    and c.status < 400
                    and (
                        c.name in (name, *(getattr(ChildNames(name), a) for _, a in CHILDREN))
                        or (
                            isinstance(c.body, dict)
                            and (
                                c.body.get("metadata", {}).get("name")
                                in {getattr(ChildNames(name), a) for _, a in CHILDREN}
                            )
                            or (isinstance(c.body, dict) and c.body.get("involvedObject", {}).get("name") == name)
                        )
                    )
                ]
                ours = [c for c in run_writes if not (c.method == "POST" and c.resource == "atlastrainings")]
                writes.append(len(ours))
            kinds = {}
            sample = names[0]
            for c in emu.calls(lambda c: c.is_write and c.status and c.status < 400):
                if c.method == "POST" and c.resource == "atlastrainings":
                    continue  # the benchmark's own create
                if c.name == sample or (
                    isinstance(c.body, dict)
                    and (
                        c.body.get("metadata", {}).get("name", "").startswith(sample)
                        or c.body.get("involvedObject", {}).get("name") == sample
                    )
                ):
                    key = f"{c.method} {c.resource}{'/' + c.subresource if c.subresource else ''}"
                    kinds[key] = kinds.get(key, 0) + 1
            rss = peak_rss_mb(operator.pid)
        finally:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()

    children = len(CHILDREN)
    print(
        f"runs: {args.runs} AtlasTraining (children each: {children}); all children present for "
        f"{len(latencies)}/{args.runs} after {all_ready:.1f} s"
    )
    print(
        f"create -> all children present: p50 {statistics.median(latencies):.2f} s, "
        f"p95 {percentile(latencies, 0.95):.2f} s, max {max(latencies):.2f} s   (target p95 < 2 s)"
    )
    print(
        f"API writes per run once settled: median {statistics.median(writes):.0f}, max {max(writes)} "
        f"(target <= children + 3 = {children + 3}); {sample}: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
    )
    print(f"operator peak RSS: {rss:.0f} MB   (target < 150 MB)")
    ok = percentile(latencies, 0.95) < 2 and max(writes) <= children + 3 and rss < 150
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if len(latencies) == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
