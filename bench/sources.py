"""Models in from S3, fetched once per run; the trained teacher out (python -m bench.sources), measured in one run.

On a local cluster as ``atlas cluster up --s3 --controllers training-operator --nodes 2`` makes it (atlas_cluster:
the real control plane, the training-operator, two process nodes, versitygw with its access log on), one AtlasTeacher
per model and volume: the model is the teacher and the student (one ``s3://`` URI), the data a multistep file in the
bucket, 2 trainer nodes and a student server (the nodes' ``vllm`` is harness/vllm_standin.py: the server's
init container fetches and the server gets the local copy's path, but nothing is loaded), one training step, an
evaluation of two problems, the export to ``s3://atlas/exports/<run>``. For each model (``builtin://tiny-llama``;
``builtin://smollm2-135m-instruct``, skipped with a message without ``make real-model``) it runs once with a shared
checkpoint PVC (the trainer pods and the server fetch into the run's cache on it: once per run) and once without one
(each pod's own volume: once per pod). Per run:

- bytes read from the store: the S3 server's access log, every GetObject from a pod (the host's own reads left out)
  times its part (the fetcher reads PART_BYTES ranges; versitygw logs neither the Range nor the bytes sent), the
  model's objects against the model's size (the target: at most 1.05x with a shared volume), and the pods that
  read them;
- apply → sources ready (the last fetching pod's initializer says its sources are whole: the trainer pods' first
  step, the server's init container) and apply → training start (rank 0's Trainer shows its progress bar: the model
  loaded, step 1 begun), read from the pods' logs every POLL_S;
- the export: its time (rank 0's ``evaluation:`` line → its ``exported:`` line, within POLL_S) and size
  (``.status.output``).

Today, before this change, each rank and each server downloaded the model itself (``from_pretrained`` of a hub id
in every trainer process and ``vllm serve`` of it in every server): fetches per run = trainer pods + servers (3 here,
3.0x the model's bytes per run), whatever the volume. The "today" column is that figure for each run's model.

Needs root (the process nodes), the control plane and the training-operator (make kube, make kube-controllers) and
versitygw (make s3). About 4 minutes for the tiny model's two runs on 2 cores; SmolLM2's two add the model's
conversion (once per machine) and a step of a 135M model on 2 ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "default"  # where `atlas cluster up --s3` puts the Secret atlas-s3
BUCKET = "atlas"
DATA_KEY = "data/multistep.jsonl"
TRAINER_PODS, SERVERS = 2, 1
RUN_TIMEOUT_S = 1500.0
POLL_S = 0.1  # the logs and the run's status are read this often: the resolution of the times
#: The Trainer's progress bar (no label, unlike "Loading weights: …"): trainer.train() has begun its first step.
TRAINING_BAR = re.compile(r"(?:^|[\r\n])[ \t]*\d+%\|")


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


@dataclass
class Measured:
    model: str
    volume: str
    model_bytes: int
    read_model: int = 0
    read_data: int = 0
    readers: int = 0  # pods that read the model from the store
    gets: int = 0
    sources_ready_s: float | None = None
    training_start_s: float | None = None
    export_s: float | None = None
    export_bytes: int | None = None
    export_files: int | None = None
    total_s: float | None = None
    phase: str = ""
    fetch_lines: list[str] = field(default_factory=list)


def teacher(name: str, model_uri: str, pvc: str | None) -> dict:
    base = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    spec = base["spec"]
    data = f"s3://{BUCKET}/{DATA_KEY}"
    spec.update(
        model=model_uri,
        dataset={"source": data, "split": "train"},
        storage={"secretRef": {"name": "atlas-s3"}},
        output={"uri": f"s3://{BUCKET}/exports/{name}"},
        resources={"nodes": TRAINER_PODS, "gpusPerNode": 0, "cpu": "1", "memory": "2Gi"},
        checkpoint={"path": "/checkpoints", "saveSteps": 100, **({"pvc": pvc} if pvc else {})},
        student={"model": model_uri, "rollout": {"replicas": SERVERS, "memory": "2Gi"}},
        teaching={"maxProbeTokens": 4, "maxGuidanceTokens": 10, "studentSamples": 2, "studentMaxTokens": 4},
        evaluation={"samples": 1, "limit": 2, "dataset": {"source": data, "split": "test"}},
    )
    spec["training"].update(maxSteps=1, perDeviceTrainBatchSize=2, numGenerations=2, maxCompletionLength=12)
    base["metadata"] = {"name": name, "namespace": NAMESPACE}
    return base


class Bench:
    def __init__(self, cluster, server, part_bytes: int):
        from atlas_cluster.cluster import OPERATOR, kubectl

        self.cluster, self.server, self.part_bytes = cluster, server, part_bytes
        self._kubectl = kubectl
        self.operator = OPERATOR
        self.sizes: dict[str, int] = {}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True):
        return self._kubectl(self.cluster.kubeconfig, *args, input=input, check=check)

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.server.endpoint,
            aws_access_key_id=self.server.access_key,
            aws_secret_access_key=self.server.secret_key,
            region_name=self.server.region,
            config=Config(s3={"addressing_style": "path"}),
        )

    def upload_folder(self, folder: Path, prefix: str) -> int:
        client, total = self.client(), 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(folder).as_posix()}"
            client.upload_file(str(path), BUCKET, key)
            self.sizes[key] = path.stat().st_size
            total += path.stat().st_size
        return total

    def upload_data(self) -> None:
        from atlas_core.tasks.multistep import make_multistep_dataset

        rows = [dict(r, split="train") for r in make_multistep_dataset(8, "train")]
        rows += [dict(r, split="test") for r in make_multistep_dataset(4, "test")]
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        self.client().put_object(Bucket=BUCKET, Key=DATA_KEY, Body=body)
        self.sizes[DATA_KEY] = len(body)

    def status(self, name: str) -> dict:
        found = self.kubectl("get", "atlasteacher", name, "-n", NAMESPACE, "-o", "json", check=False)
        return (json.loads(found.stdout).get("status") or {}) if found.returncode == 0 else {}

    def logs(self, name: str) -> dict[str, str]:
        """``<pod folder>/<container>`` → its log (every run of it), for the run's pods."""
        found = {}
        for path in sorted((self.cluster.directory / "nodes" / "pods").glob(f"{NAMESPACE}_{name}-*/logs/*.log")):
            found[f"{path.parent.parent.name}/{path.stem}"] = path.read_text(errors="replace")
        return found

    def bytes_read(self, entries, prefix: str) -> tuple[int, int, set[str]]:
        """(bytes, GETs, clients) of the pods' GetObjects under ``prefix``: each GET one part of its object."""
        total, gets, clients = 0.0, 0, set()
        for a in entries:
            if a.bucket != BUCKET or a.operation != "s3_GetObject" or a.client == "127.0.0.1" or a.status >= 300:
                continue
            if not a.key.startswith(prefix) or a.key not in self.sizes:
                continue
            size = self.sizes[a.key]
            total += size / max(1, math.ceil(size / self.part_bytes))
            gets += 1
            clients.add(a.client)
        return round(total), gets, clients

    def run(self, label: str, model_prefix: str, model_bytes: int, pvc: bool) -> Measured:
        from harness.s3 import read_access_log

        name = f"{label}-{'pvc' if pvc else 'nopvc'}"
        claim = f"ckpt-{name}" if pvc else None
        measured = Measured(label, "shared PVC" if pvc else "none (emptyDir)", model_bytes)
        if claim:
            requests = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "8Gi"}}}
            pvc_object = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim}}
            pvc_object["spec"] = requests
            self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(pvc_object))
        seen_before = len(read_access_log(self.server.access_log))
        manifest = teacher(name, f"s3://{BUCKET}/{model_prefix}", claim)
        started = time.monotonic()
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        marks: dict[str, float] = {}
        deadline = started + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            now = time.monotonic() - started
            for where, text in self.logs(name).items():
                pod, container = where.rsplit("/", 1)
                trainer = "-master-" in pod or "-worker-" in pod
                if "sources: " in text and (trainer or container == "initializer"):
                    marks.setdefault(f"ready {where}", now)
                if "-master-" in pod:
                    if TRAINING_BAR.search(text):
                        marks.setdefault("start", now)
                    for key, line in (("evaluated", "evaluation: "), ("exported", "exported: ")):
                        if line in text:
                            marks.setdefault(key, now)
            self.cluster.supervisor.check(self.operator)  # a dead operator: its log's end, not a wait for nothing
            phase = self.status(name).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                measured.phase, measured.total_s = phase, now
                break
            time.sleep(POLL_S)
        else:
            measured.phase = f"timed out ({RUN_TIMEOUT_S:.0f} s)"
        ready = [t for key, t in marks.items() if key.startswith("ready ")]
        if len(ready) >= TRAINER_PODS + SERVERS:
            measured.sources_ready_s = max(ready)
        measured.training_start_s = marks.get("start")
        if "evaluated" in marks and "exported" in marks:
            measured.export_s = marks["exported"] - marks["evaluated"]
        status = self.status(name)
        output = status.get("output") or (status.get("result") or {}).get("output") or {}
        measured.export_bytes, measured.export_files = output.get("bytes"), output.get("files")
        entries = read_access_log(self.server.access_log)[seen_before:]
        measured.read_model, measured.gets, clients = self.bytes_read(entries, model_prefix + "/")
        measured.readers = len(clients)
        measured.read_data = self.bytes_read(entries, DATA_KEY)[0]
        for where, text in self.logs(name).items():
            measured.fetch_lines += [
                f"{where}: {line.strip()}" for line in text.splitlines() if "fetched s3://" in line
            ]
        if measured.phase != "Succeeded":
            for where, text in self.logs(name).items():
                print(f"--- {where}\n{text[-2000:]}", file=sys.stderr)
        self.kubectl("delete", "atlasteacher", name, "-n", NAMESPACE, "--wait=false", check=False)
        self._wait_pods_gone(name)
        if claim:
            self.kubectl("delete", "pvc", claim, "-n", NAMESPACE, "--wait=false", check=False)
        return measured

    def _wait_pods_gone(self, name: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.kubectl(
                "get", "pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={name}", "-o", "name", check=False
            ).stdout.strip()
            if not listed:
                return
            time.sleep(1)


def size(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return "-"


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[Measured]) -> None:
    header = ("model", "volume", "model size", "model bytes read", "x model", "today", "pods read it", "data read",
              "→ sources ready s", "→ training start s", "export s", "export size", "total s",
              "phase")  # fmt: skip  # a table's header: its columns in a few lines, not one a line
    lines = [header]
    for m in rows:
        ratio = m.read_model / m.model_bytes if m.model_bytes else float("nan")
        lines.append((
            m.model, m.volume, size(m.model_bytes), size(m.read_model), f"{ratio:.2f}x",
            f"{TRAINER_PODS + SERVERS:.1f}x", str(m.readers), size(m.read_data), seconds(m.sources_ready_s),
            seconds(m.training_start_s), seconds(m.export_s),
            f"{size(m.export_bytes)} ({m.export_files} files)" if m.export_bytes else "-", seconds(m.total_s), m.phase,
        ))  # fmt: skip  # a table's row: its cells in the header's order, in a few lines
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)))
        if n == 0:
            print("  ".join("-" * width for width in widths))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sources", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2", help="tiny, smollm2 or both (default: both)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster up (its folder is printed)")
    args = parser.parse_args(argv)

    from atlas_cluster.build import controller_binary, default_bin_dir, missing, s3_server_binary
    from atlas_cluster.cluster import LocalCluster
    from atlas_cluster.controlplane import free_port
    from atlas_core.sources.fetch import PART_BYTES
    from harness import vllm_standin

    if os.geteuid() != 0:
        print("bench.sources: the process nodes need root", file=sys.stderr)
        return 1
    bin_dir = default_bin_dir()
    needed = {"control plane (make kube)": not missing(bin_dir)}
    needed["training-operator (make kube-controllers)"] = os.access(controller_binary("training-operator"), os.X_OK)
    needed["versitygw (make s3)"] = os.access(s3_server_binary(), os.X_OK)
    absent = [what for what, there in needed.items() if not there]
    if absent:
        print(f"bench.sources: missing {', '.join(absent)}", file=sys.stderr)
        return 1
    wanted = [m.strip() for m in args.models.split(",") if m.strip()]
    models: list[tuple[str, str, Path]] = []
    if "tiny" in wanted:
        from atlas_core.models.tiny import build_tiny_model

        models.append(("tiny-llama", "models/tiny-llama", Path(build_tiny_model())))
    if "smollm2" in wanted:
        from atlas_core.models.smollm2 import RealModelMissing, build_smollm2

        try:
            models.append(("smollm2-135m", "models/smollm2-135m", Path(build_smollm2())))
        except RealModelMissing as exc:
            print(f"bench.sources: SmolLM2-135M skipped: {exc}")

    directory = Path(tempfile.mkdtemp(prefix="atlas-bench-sources-"))
    standin = vllm_standin.install(directory / "vllm-standin")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    class Cluster(LocalCluster):
        def node_environment(self) -> dict[str, str]:
            """The nodes' ``vllm`` is the stand-in, before the real CPU vLLM's launcher that ``atlas cluster up`` puts
            first when it is installed: what is measured is the fetch, not a server's load."""
            env = super().node_environment()
            env["PATH"] = os.pathsep.join((str(standin), env.get("PATH", "/usr/bin:/bin")))
            return env

    # The operator's metrics and health port: a free one (the chart's 8080 may be another local operator's).
    operator_env = {"ATLAS_OPERATOR_METRICS_PORT": str(free_port()), "ATLAS_PROGRESS_INTERVAL": "1"}
    cluster = Cluster(
        directory / "cluster",
        bin_dir,
        controllers=("training-operator",),
        nodes=TRAINER_PODS,
        gpus_per_node=2,
        operator_env=operator_env,
        log=lambda line: print(line, file=sys.stderr),
    )
    rows: list[Measured] = []
    try:
        t = time.monotonic()
        cluster.up()
        server = cluster.start_s3(s3_server_binary(), access_log=directory / "s3-access.log")
        print(f"bench.sources: cluster up with the S3 server in {time.monotonic() - t:.0f} s", file=sys.stderr)
        bench = Bench(cluster, server, PART_BYTES)
        bench.upload_data()
        for label, prefix, folder in models:
            model_bytes = bench.upload_folder(folder, prefix)
            for pvc in (True, False):
                print(f"bench.sources: {label}, {'a shared PVC' if pvc else 'no PVC'} …", file=sys.stderr)
                rows.append(bench.run(label, prefix, model_bytes, pvc))
    finally:
        if args.keep:
            print(f"bench.sources: cluster left up in {cluster.directory} (atlas cluster down --name …)")
        else:
            cluster.down()

    print(
        f"\nbench.sources at {commit()} on {os.cpu_count()} cores: {TRAINER_PODS} trainer pods and {SERVERS} "
        f"student server per run; ranged GETs of {PART_BYTES >> 20} MiB"
    )
    print_table(rows)
    print()
    for m in rows:
        ratio = m.read_model / m.model_bytes if m.model_bytes else float("nan")
        target = " (target ≤ 1.05x)" if m.volume == "shared PVC" else " (once per pod)"
        print(
            f"{m.model}, {m.volume}: {ratio:.2f}x the model's bytes read by {m.readers} pod(s){target}; "
            f"today {TRAINER_PODS + SERVERS}.00x (every rank and server downloads it)"
        )
    by_model: dict[str, dict[str, Measured]] = {}
    for m in rows:
        by_model.setdefault(m.model, {})[m.volume] = m
    for model, runs in by_model.items():
        shared, own = runs.get("shared PVC"), runs.get("none (emptyDir)")
        if shared and own and shared.read_model:
            print(f"{model}: without the shared volume {own.read_model / shared.read_model:.2f}x the bytes of with it")
    print("\nfetch lines (the fetcher's own account):")
    for m in rows:
        for line in m.fetch_lines:
            print(f"  {m.model} / {m.volume}: {line}")
    return 0 if rows and all(m.phase == "Succeeded" for m in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
