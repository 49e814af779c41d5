"""Operator throughput and idle cost: N runs against a Kubernetes API, one `atlas operator`, on two APIs side by side:

* ``real``: the real control plane (etcd, kube-apiserver, kube-controller-manager v1.36.3 built from the upstream
  modules: atlas_cluster/), the CRDs and the chart installed, the operator cluster-wide under the chart's
  ServiceAccount token, as on a cluster; what it did is read from the API server's audit log (every request of a
  ServiceAccount, atlas_cluster/controlplane.py), its CPU and the API server's and etcd's from /proc;
* ``emulator``: the Kubernetes API emulator of the tests (kmock, harness/kube_emulator.py) in this process;
* ``floor`` (not in the default): the real control plane with bench/ideal_operator.py in the operator's place, under
  the same token: each new run's children rendered and created, nothing else (no read, finalizer, status or Event).
  Its create -> children is what the control plane alone takes for the children's writes on this machine: the
  floor under the operator's figure. Busy burst only (it writes no status, so no run is ever Running).

For each size (``--runs 100,1000``: each with a fresh API and operator) the bench measures

* busy: N AtlasTrainings created at once; per run, seconds from its create to all its children present (p50/p95),
  then, once no write has come for ``--settle`` seconds, the API writes the operator made for it (children, status,
  finalizer, Events);
* idle: every run's PyTorchJob is marked Running (its status conditions, as Kubeflow writes them) and every trainer's
  /metrics is served by one fake endpoint that counts scrapes (ATLAS_METRICS_URL_TEMPLATE points there). Once each
  run is Running and has been scraped, nothing changes for ``--window`` seconds (default two progress intervals):
  the operator's API requests per second beyond its open watches, scrapes per second, its CPU (cores) and peak RSS.

The operator runs in its own process; the emulator and the fake trainers run in this one, each on its own thread,
and their CPU is measured per thread (and this whole process's: the emulator, the client creating the runs, the
watcher timing them), so the table shows what the operator costs apart from what the emulator does. On a small
machine they share the cores: a busy emulator delays the watch events the operator waits for.

Where the time went (issue #18), profiled with py-spy (--gil): from b34ee9b to 685cb42 create -> children p95
doubled at 100 runs. The bench had moved from ATLAS_PROGRESS_INTERVAL=15 to 2, so every run's timer ran a full
reconciliation (every child read again) during the creation burst, a third of the operator's CPU there; and
parse_run resolved its dataclasses' type hints on every call (13 %; the spec had grown), now cached. At 1,000 runs
the operator then fell behind the runs' creation (p95 13-18 s): kopf's per-object processing of each watch event
(a worker, a handler state, a patch, each index and event handler invoked) was about 1 ms of CPU per event, and a
run brings seven child events when it is created (kopf's worker 56 % of the operator's samples, index_resource 13 %,
the child event handler 8 %). Children and pods are now followed by atlas_operator.informer on kopf's watch-stream
without that processing: 23-25 -> 16 CPU-ms per run.

Issue #33 (the CRD's CEL rules, also evaluated by the operator) took 100 runs' p95 from 0.5-0.9 s to 1.5-2.7 s with
the same API calls per run (counted) and about the same CPU. The rules were compiled lazily by the first call of
each handler thread (functools.cache does not lock): the 16 workers that took the first runs of the burst each
compiled them (25 ms with the CEL runtime's imports), so the operator started the burst behind and never caught up
(median by tenth 0.77 / 1.52 / 2.15 s). They are now compiled once, at start-up, under a lock. The emulator also
stopped formatting a traceback into every 404 it answers (a new run's children are each looked up before they are
made; a real API server sends no traceback): its busy CPU 2.3-2.7 -> 1.4-1.8 s. p95 after both: 0.83 / 0.83 / 1.31 s
(fdd36eb, before #33, in the same sitting: 0.54 / 0.76 s). Still open at 1,000 runs: the operator spends about
19 CPU-ms per run (fdd36eb: 16; parsing with the rules evaluated is +0.5 ms of it), and with the faster emulator the
bench's client now creates 1,000 runs in 15.5 s instead of 23 s, faster than the operator's pace on 2 shared cores:
p95 8.3 s (fdd36eb 2.5 s).

"runs created in" is how long the bench's client took to create them one after another: the pace the operator has
to keep; the median latency by tenth of the creation order shows whether it does (flat) or falls behind (growing).

* ``jobset`` (issue #59): the peer. The real JobSet controller on a cluster of its own, N suspended JobSets (two
  Jobs and a headless Service each) created at ``--peer-pace`` per second by one client; then the operator on the
  same kind of cluster (the JobSet controller beside it), N runs at the same pace, the busy burst only. Compared
  on create -> first child (how soon a controller answers a new object, whatever its number of children) and
  controller CPU per object. The floor is run at that pace too, on the same kind of cluster: whether the control
  plane alone keeps up with these runs' creates there. On 2 cores, 1,000 runs at 20/s are at the edge: the floor's
  first child p95 was 0.15 s in one sitting (0ae85d0, the operator's 7.2 s) and 10.1 s in another an hour before it
  (b268e29, without the JobSet controller; the operator's 5.8 s): bench/results/.

Targets (PASS/FAIL), ratios measured in one sitting (the absolute ones of the scale issue, < 1 s / < 3 s, are out of
reach on 2 cores for any operator, the floor included): create -> children p95 <= 1.25x the floor's at each size;
<= 8 requests per new run (7 creates and 1 status write) and no read; operator CPU <= 15 ms per run; at the peer's
pace, first child p95 <= 2x the JobSet controller's and CPU per object <= 1.5x; idle at the largest size: < 5 API
requests/s beyond open watches, scrapes/s <= runs / interval, operator CPU < 0.3 core, RSS < 250 MB.

    .venv/bin/python -m bench.operator_throughput [--api real,floor,jobset,emulator] [--runs 100,1000]
        [--interval 15] [--settle 3] [--window 30] [--pace RUNS_PER_S] [--peer-pace 20] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import aiohttp.web
import kmock
import kubernetes
from prometheus_client.parser import text_string_to_metric_families

from atlas_cluster.build import default_bin_dir, ensure_built, ensure_controllers
from atlas_cluster.cluster import RELEASE_NAMESPACE, LocalCluster
from atlas_cluster.versions import CONTROLLERS as CONTROLLER_VERSIONS
from atlas_contract.names import ChildNames
from harness.env import REPO, free_port, python_env
from harness.kube_emulator import NETWORK_POLICIES, PYTORCHJOBS, EmulatorThread, write_kubeconfig
from harness.manifests import training

NS = "team-a"
RUNS = "atlas.arc.computer/v1alpha1/atlastrainings"
CHILDREN = (  # (resource, atlas_contract.names.ChildNames attribute)
    ("v1/configmaps", "config_map"),
    ("v1/services", "rollout"),
    ("v1/services", "metrics"),
    ("apps/v1/deployments", "rollout"),
    (PYTORCHJOBS, "job"),
    (NETWORK_POLICIES, "network_policy"),  # on by default (operator.networkPolicy)
    (NETWORK_POLICIES, "trainer_network_policy"),
)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(stat: str) -> float:
    """utime + stime of a /proc/.../stat file, in seconds."""
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class FakeTrainers:
    """Every run's trainer /metrics at http://127.0.0.1:<port>/<namespace>/<run>/metrics, on its own thread: fixed
    numbers (nothing changes), each scrape counted."""

    def __init__(self) -> None:
        self.port = free_port()
        self.scrapes = 0
        self.scraped: set[str] = set()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), name="fake-trainers", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    @property
    def tid(self) -> int:
        tid = self._thread.native_id
        assert tid is not None  # the thread started in __init__
        return tid

    async def _metrics(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace, run = request.match_info["namespace"], request.match_info["run"]
        self.scrapes += 1
        self.scraped.add(run)
        labels = f'namespace="{namespace}",run="{run}",kind="AtlasTraining"'
        text = (
            f"# TYPE atlas_training_step gauge\natlas_training_step{{{labels}}} 5\n"
            f"# TYPE atlas_training_reward gauge\natlas_training_reward{{{labels}}} 0.5\n"
        )
        return aiohttp.web.Response(text=text, content_type="text/plain")

    async def _serve(self) -> None:
        app = aiohttp.web.Application()
        app.router.add_get("/{namespace}/{run}/metrics", self._metrics)
        runner = aiohttp.web.AppRunner(app, access_log=None)
        await runner.setup()
        await aiohttp.web.TCPSite(runner, "127.0.0.1", self.port).start()
        self._ready.set()
        await asyncio.Event().wait()


def mark_jobs_running(api, names: list[str]) -> None:
    """Every run's PyTorchJob Running: its status conditions, as Kubeflow's training-operator writes them."""
    conditions = [
        {"type": "Created", "status": "False", "reason": "PyTorchJobCreated", "message": "created"},
        {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"},
    ]
    for name in names:
        api.patch_namespaced_custom_object_status(
            "kubeflow.org", "v1", NS, "pytorchjobs", name, {"status": {"conditions": conditions}}
        )


def create_checkpoint_claim(core: kubernetes.client.CoreV1Api) -> None:
    """The shared claim multi-node runs keep checkpoints on. The client sends a dict body as it is; its stubs name only
    the model classes, hence the ignore (and create_namespace's)."""
    core.create_namespaced_persistent_volume_claim(
        NS,
        {  # type: ignore[arg-type]
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}},
        },
    )


def every_run_ready(follow: Callable[[], None], ready_at: dict[str, float], names: list[str]) -> bool:
    """Whether every run is ready, once the audit log has been followed to its end."""
    follow()
    return len(ready_at) == len(names)


def wait(condition, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


# A new run's way to its children, from the audit log (its first request of each kind): kopf's finalizer patch, the
# name checks of its children (gets), their creates.
STEPS = {("patch", True): "finalizer", ("get", False): "name checks", ("create", False): "creates"}


def step_figures(names: list[str], created_at: dict, steps: dict[str, dict[str, float]], ready_at: dict) -> dict:
    """The median seconds of each step of a new run's way to its children: from its create to kopf's finalizer, to
    the first name check, to the first create, to the last child made (a step the operator skips is left out)."""
    order = [("created", created_at), *((step, None) for step in STEPS.values()), ("children", ready_at)]
    spans: dict[str, list[float]] = {}
    for name in names:
        times = []
        for step, source in order:
            at = source.get(name) if source is not None else steps[name].get(step)
            if at is not None:
                times.append((step, at))
        for (_, start), (step, end) in zip(times, times[1:], strict=False):
            spans.setdefault(step, []).append(end - start)
    return {step: statistics.median(values) for step, values in spans.items()}


def latency_figures(names: list[str], created_at: dict[str, float], ready_at: dict[str, float]) -> dict:
    """create -> children: how many, p50, p95, max, and the median by tenth of the creation order (does the
    operator keep up: flat, or fall behind: growing)."""
    latencies = [ready_at[n] - created_at[n] for n in names if n in ready_at]
    tenth = max(1, len(names) // 10)
    return {
        "present": len(latencies),
        "p50": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies),
        "deciles": [
            statistics.median([ready_at[n] - created_at[n] for n in names[i : i + tenth] if n in ready_at] or [0.0])
            for i in range(0, len(names), tenth)
        ],
    }


def bench_emulator(runs: int, interval: float, settle: float, window: float) -> dict:
    trainers = FakeTrainers()
    with EmulatorThread() as server:
        emu = server.emulator
        assert emu is not None  # EmulatorThread.__enter__ returns once the emulator serves
        emulator_stat = f"/proc/self/task/{server._thread.native_id}/stat"
        trainers_stat = f"/proc/self/task/{trainers.tid}/stat"
        workdir = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", server.url)
        env = python_env(
            KUBECONFIG=str(kubeconfig),
            ATLAS_OPERATOR_METRICS_PORT=str(free_port()),
            ATLAS_OPERATOR_METRICS_HOST="127.0.0.1",
            ATLAS_PROGRESS_INTERVAL=str(interval),
            ATLAS_METRICS_URL_TEMPLATE=f"http://127.0.0.1:{trainers.port}/{{namespace}}/{{name}}/metrics",
        )
        log = open(workdir / "operator.log", "wb")
        operator = subprocess.Popen(
            [sys.executable, "-m", "atlas_cli.main", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        operator_stat = f"/proc/{operator.pid}/stat"
        figures: dict = {"runs": runs, "api": "emulator"}
        try:
            api_client = kubernetes.config.new_client_from_config(str(kubeconfig))
            api = kubernetes.client.CustomObjectsApi(api_client)
            # The operator's start-up (imports, login) is not what is measured: start once it watches runs.
            if (
                not wait(
                    lambda: (
                        {c.resource for c in emu.calls(lambda c: c.query.get("watch") == "true")}
                        >= {"atlastrainings", "atlasteachers"}
                        or operator.poll() is not None
                    ),
                    120,
                    0.1,
                )
                or operator.poll() is not None
            ):
                raise SystemExit(f"the operator never watched the runs: see {workdir}/operator.log")
            names = [f"run-{i:04d}" for i in range(runs)]
            created_at: dict[str, float] = {}
            ready_at: dict[str, float] = {}
            stop = threading.Event()
            keys = {
                name: [(kmock.resource(r), NS, getattr(ChildNames(name), a)) for r, a in CHILDREN] for name in names
            }

            def present(key) -> bool:  # a key lookup: no deep copy, so this thread stays off the CPU
                return key in emu.objects and not emu.objects[key].deleted

            def watch_children() -> None:
                while not stop.is_set():
                    for name in list(created_at):
                        if name not in ready_at and all(present(k) for k in keys[name]):
                            ready_at[name] = time.monotonic()
                    time.sleep(0.02)

            # Multi-node runs keep checkpoints on a shared claim, as the operator asks them to (without one a run
            # also gets a CheckpointsNotShared Warning Event: one more write).
            create_checkpoint_claim(kubernetes.client.CoreV1Api(api_client))
            watcher = threading.Thread(target=watch_children, daemon=True)
            watcher.start()
            cpu0 = {
                "operator": cpu_seconds(operator_stat),
                "emulator": cpu_seconds(emulator_stat),
                "bench": cpu_seconds("/proc/self/stat"),
            }
            started = time.monotonic()
            for name in names:
                created_at[name] = time.monotonic()
                api.create_namespaced_custom_object(
                    "atlas.arc.computer", "v1alpha1", NS, "atlastrainings", training(name, checkpoint={"pvc": "ckpt"})
                )
            figures["created_s"] = time.monotonic() - started
            wait(lambda: len(ready_at) == len(names), 300)
            stop.set()
            figures["all_ready_s"] = time.monotonic() - started
            figures.update(latency_figures(names, created_at, ready_at))
            # Settled: no write for `settle` seconds.
            mark, last = 0, time.monotonic()
            while time.monotonic() - last < settle:
                time.sleep(0.25)
                now = emu.request_count()
                if emu.calls(lambda c: c.is_write, start=mark):
                    last = time.monotonic()
                mark = now
            busy_s = time.monotonic() - started
            figures["busy_cpu"] = {
                "operator": cpu_seconds(operator_stat) - cpu0["operator"],
                "api": cpu_seconds(emulator_stat) - cpu0["emulator"],
                "bench": cpu_seconds("/proc/self/stat") - cpu0["bench"],
                "seconds": busy_s,
            }
            figures["writes"], figures["sample"] = writes_per_run(emu, names)

            # Idle: every job Running, every trainer answering, nothing changing.
            mark_jobs_running(api, names)

            def phase(name: str) -> str | None:
                obj = emu.objects[(kmock.resource(RUNS), NS, name)]
                return (obj.raw.get("status") or {}).get("phase")

            running = wait(lambda: all(phase(n) == "Running" for n in names), 120, 0.25)
            scraped = wait(lambda: len(trainers.scraped) >= runs, 3 * interval + 30, 0.25)
            wait(lambda: False, min(3.0, interval))  # the first scrapes' progress writes land
            figures["idle_ready"] = running and scraped
            mark = emu.request_count()
            cpu0 = {
                "operator": cpu_seconds(operator_stat),
                "emulator": cpu_seconds(emulator_stat),
                "trainers": cpu_seconds(trainers_stat),
            }
            scrapes0, t0 = trainers.scrapes, time.monotonic()
            time.sleep(window)
            elapsed = time.monotonic() - t0
            figures["idle_cpu"] = {
                "operator": (cpu_seconds(operator_stat) - cpu0["operator"]) / elapsed,
                "api": (cpu_seconds(emulator_stat) - cpu0["emulator"]) / elapsed,
                "trainers": (cpu_seconds(trainers_stat) - cpu0["trainers"]) / elapsed,
            }
            figures["scrapes_per_s"] = (trainers.scrapes - scrapes0) / elapsed
            calls = emu.calls(start=mark)
            figures["requests_per_s"] = len([c for c in calls if c.query.get("watch") != "true"]) / elapsed
            figures["watches_opened"] = len([c for c in calls if c.query.get("watch") == "true"])
            figures["idle_writes"] = len([c for c in calls if c.is_write])
            figures["idle_window_s"] = elapsed
            figures["rss"] = peak_rss_mb(operator.pid)
        finally:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
    return figures


# ---------------------------------------------------------------------------------------------- the real API

CHILD_KEYS = tuple((resource.rsplit("/", 1)[-1], attribute) for resource, attribute in CHILDREN)  # (plural, attr)
WRITES = {"create", "update", "patch", "delete"}


def audit_time(event: dict) -> float:
    """An audit event's stageTimestamp (the response's), in seconds since the epoch."""
    return datetime.datetime.fromisoformat(event["stageTimestamp"]).timestamp()


class Audit:
    """The API server's audit log (atlas_cluster/controlplane.py: every request of a ServiceAccount), read as it
    grows: the requests of one user, in order."""

    def __init__(self, path: Path, user: str):
        self.path, self.user = path, user
        self.offset = path.stat().st_size if path.exists() else 0
        self.events: list[dict] = []

    def _of_user(self, username: str | None) -> bool:
        """The user's (``user`` ending in ``:``: any ServiceAccount of that namespace)."""
        if not username:
            return False
        return username.startswith(self.user) if self.user.endswith(":") else username == self.user

    def poll(self) -> list[dict]:
        """The user's requests logged since the last poll (also appended to ``events``)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        new = [e for e in map(json.loads, complete.splitlines()) if self._of_user(e.get("user", {}).get("username"))]
        self.events += new
        return new


def process_cpu(*pids: int) -> float:
    return sum(cpu_seconds(f"/proc/{pid}/stat") for pid in pids)


def profiler(pid: int, folder: Path | None, name: str) -> subprocess.Popen | None:
    """py-spy recording ``pid``'s stacks (collapsed: one line per stack and its count) into ``folder/name``, until
    interrupted; None without ``--profile``."""
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    command = ["py-spy", "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--gil"]
    return subprocess.Popen([*command, "-o", str(folder / name)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def stop_profiler(recording: subprocess.Popen | None) -> None:
    if recording is not None:
        recording.send_signal(signal.SIGINT)
        recording.wait(60)


def bench_floor(runs: int, interval: float, settle: float, window: float, **options) -> dict:
    """The burst on the real control plane with bench/ideal_operator.py in the operator's place: the floor."""
    return bench_real(runs, interval, settle, window, ideal=True, **options)


def bench_real(
    runs: int,
    interval: float,
    settle: float,
    window: float,
    profile: Path | None = None,
    ideal: bool = False,
    pace: float = 0.0,
    controllers: tuple[str, ...] = (),
    busy_only: bool = False,
) -> dict:
    """The same burst and idle window on the real control plane (module docstring); ``ideal``: the burst only, with
    bench/ideal_operator.py (nothing but the children's creates) in the operator's place; ``pace``: runs created
    per second (0: as fast as the client goes); ``controllers``: upstream controllers running beside it (the same
    cluster as the JobSet bench's); ``busy_only``: no idle window."""
    bin_dir = default_bin_dir()
    ensure_built(bin_dir)  # cached after the first time (make kube)
    trainers = FakeTrainers()
    workdir = Path(tempfile.mkdtemp(prefix="atlas-bench-"))
    metrics_port = free_port()
    cluster = LocalCluster(
        workdir,
        bin_dir,
        start_operator=False,
        log=lambda line: None,
        controllers=controllers,
        controller_binaries=ensure_controllers(controllers) if controllers else {},
        operator_env={
            "ATLAS_OPERATOR_METRICS_PORT": str(metrics_port),
            "ATLAS_PROGRESS_INTERVAL": str(interval),
            "ATLAS_METRICS_URL_TEMPLATE": f"http://127.0.0.1:{trainers.port}/{{namespace}}/{{name}}/metrics",
        },
    )
    figures: dict = {"runs": runs, "api": "floor" if ideal else "real", "pace": pace}
    try:
        cluster.up()
        api_client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig))
        api = kubernetes.client.CustomObjectsApi(api_client)
        core = kubernetes.client.CoreV1Api(api_client)
        core.create_namespace({"metadata": {"name": NS}})  # type: ignore[arg-type]  # see create_checkpoint_claim
        create_checkpoint_claim(core)
        account = cluster.operator_deployment()["spec"]["template"]["spec"]["serviceAccountName"]
        audit = Audit(cluster.control_plane.audit_log, f"system:serviceaccount:{RELEASE_NAMESPACE}:{account}")
        if ideal:
            cluster.service_account_kubeconfig(cluster.operator_kubeconfig, RELEASE_NAMESPACE, account)
            ideal_env = {**python_env(), "KUBECONFIG": str(cluster.operator_kubeconfig)}
            argv = [sys.executable, "-m", "bench.ideal_operator"]
            operator = cluster.supervisor.start("ideal-operator", argv, env=ideal_env, cwd=REPO)
        else:
            operator = cluster.start_operator_process()
        parts = {n: cluster.supervisor.children[n].pid for n in ("kube-apiserver", "etcd", "kube-controller-manager")}
        control_plane = [parts["kube-apiserver"], parts["etcd"]]  # "API" in the table

        def listed() -> set[str]:
            audit.poll()
            return {e["objectRef"]["resource"] for e in audit.events if e["verb"] == "list" and "objectRef" in e}

        # The operator's start-up (imports, leader election, login) is not what is measured: start once it has
        # listed the runs and their children (its watches follow each list at once).
        log = "ideal-operator.log" if ideal else "operator.log"
        started_on = {"atlastrainings"} if ideal else {"atlastrainings", "atlasteachers", "pytorchjobs"}
        if not wait(lambda: listed() >= started_on or operator.poll(), 120):
            raise SystemExit(f"the operator never listed the runs: {log_tail(cluster.logs / log)}")
        if operator.poll() is not None:
            raise SystemExit(f"the operator exited: {log_tail(cluster.logs / log)}")
        names = [f"run-{i:04d}" for i in range(runs)]
        owner = {getattr(ChildNames(n), a): n for n in names for _, a in CHILDREN} | {n: n for n in names}
        wanted = {n: {(plural, getattr(ChildNames(n), a)) for plural, a in CHILD_KEYS} for n in names}
        created_at: dict[str, float] = {}
        ready_at: dict[str, float] = {}
        seen: dict[str, dict[tuple[str, str], float]] = {n: {} for n in names}
        steps: dict[str, dict[str, float]] = {n: {} for n in names}  # the first request of each step, per run
        last_write = [time.time()]

        def follow() -> None:
            """Each child's first successful write by the operator, from the audit log; a run is ready when all
            its children are."""
            for e in audit.poll():
                ref = e.get("objectRef", {})
                run = owner.get(ref.get("name", ""))
                if run is not None and ref.get("namespace") == NS and not ref.get("subresource"):
                    step = STEPS.get((e["verb"], ref.get("resource") == "atlastrainings"))
                    if step:
                        steps[run].setdefault(step, audit_time(e))
                if e["verb"] not in WRITES or e.get("responseStatus", {}).get("code", 500) >= 400:
                    continue
                if ref.get("namespace") != NS:
                    continue  # the Lease the operator renews every 2 s (leader election) is not a run's write
                last_write[0] = max(last_write[0], audit_time(e))
                key = (ref.get("resource"), ref.get("name"))
                if run is None or ref.get("subresource") or key not in wanted[run] or key in seen[run]:
                    continue
                seen[run][key] = audit_time(e)
                if len(seen[run]) == len(wanted[run]):
                    ready_at[run] = max(seen[run].values())

        audit.events.clear()
        recording = profiler(operator.pid, profile, f"operator-real-{runs}.txt")
        cpu0 = {
            "operator": process_cpu(operator.pid),
            "api": process_cpu(*control_plane),
            "bench": cpu_seconds("/proc/self/stat"),
        }
        parts0 = {n: process_cpu(pid) for n, pid in parts.items()}
        started = time.time()
        for index, name in enumerate(names):
            if pace:  # the next run's turn: index / pace seconds after the first
                time.sleep(max(0.0, started + index / pace - time.time()))
            created_at[name] = time.time()
            api.create_namespaced_custom_object(
                "atlas.arc.computer", "v1alpha1", NS, "atlastrainings", training(name, checkpoint={"pvc": "ckpt"})
            )
            if len(created_at) % 50 == 0:
                follow()  # keeps each poll small
        figures["created_s"] = time.time() - started
        wait(lambda: every_run_ready(follow, ready_at, names), 300, 0.1)
        figures["all_ready_s"] = time.time() - started
        figures.update(latency_figures(names, created_at, ready_at))
        figures["first"] = first_child_figures(names, created_at, seen)
        figures["steps"] = step_figures(names, created_at, steps, ready_at)
        while time.time() - last_write[0] < settle:  # settled: no write of the operator's for `settle` seconds
            time.sleep(0.25)
            follow()
        stop_profiler(recording)
        figures["busy_cpu"] = {
            "operator": process_cpu(operator.pid) - cpu0["operator"],
            "api": process_cpu(*control_plane) - cpu0["api"],
            "bench": cpu_seconds("/proc/self/stat") - cpu0["bench"],
            "seconds": time.time() - started,
        }
        figures["busy_parts"] = {n: process_cpu(pid) - parts0[n] for n, pid in parts.items()}
        requests = audit_requests_per_run(audit.events, core, names, owner)
        figures["writes"], figures["reads"], figures["sample"], figures["other_reads"] = requests
        if not ideal:
            figures["passes"] = operator_passes(metrics_port) / runs
        if ideal or busy_only:
            return figures  # the floor writes no status: no run is ever Running, and nothing is scraped

        # Idle: every job Running, every trainer answering, nothing changing.
        mark_jobs_running(api, names)

        def all_running() -> bool:
            listed = api.list_namespaced_custom_object("atlas.arc.computer", "v1alpha1", NS, "atlastrainings")
            items = cast(dict[str, Any], listed)["items"]  # the API server's JSON list (typed as any object)
            return sum((i.get("status") or {}).get("phase") == "Running" for i in items) == runs

        running = wait(all_running, 120, 1.0)
        scraped = wait(lambda: len(trainers.scraped) >= runs, 3 * interval + 30, 0.25)
        time.sleep(min(3.0, interval))  # the first scrapes' progress writes land
        figures["idle_ready"] = running and scraped
        audit.poll()
        audit.events.clear()
        cpu0 = {
            "operator": process_cpu(operator.pid),
            "api": process_cpu(*control_plane),
            "trainers": cpu_seconds(f"/proc/self/task/{trainers.tid}/stat"),
        }
        scrapes0, t0 = trainers.scrapes, time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        figures["idle_cpu"] = {
            "operator": (process_cpu(operator.pid) - cpu0["operator"]) / elapsed,
            "api": (process_cpu(*control_plane) - cpu0["api"]) / elapsed,
            "trainers": (cpu_seconds(f"/proc/self/task/{trainers.tid}/stat") - cpu0["trainers"]) / elapsed,
        }
        figures["scrapes_per_s"] = (trainers.scrapes - scrapes0) / elapsed
        calls = audit.poll()
        figures["requests_per_s"] = len([e for e in calls if e["verb"] != "watch"]) / elapsed
        figures["watches_opened"] = len([e for e in calls if e["verb"] == "watch"])  # logged when they end
        figures["idle_writes"] = len([e for e in calls if e["verb"] in WRITES])
        figures["idle_window_s"] = elapsed
        figures["rss"] = peak_rss_mb(operator.pid)
    finally:
        cluster.down()
        shutil.rmtree(workdir, ignore_errors=True)
    return figures


def operator_passes(port: int) -> float:
    """The operator's reconciliations so far (its atlas_operator_reconcile_total, every kind and result): a new run
    costs one, and one more for each change of its children that its status reads or tick that retried it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
        counted = (s for f in families if f.name == "atlas_operator_reconcile" for s in f.samples)
        return sum(s.value for s in counted if s.name == "atlas_operator_reconcile_total")


def first_child_figures(names: list[str], created_at: dict, seen: dict[str, dict]) -> dict:
    """create -> the first child written: p50 and p95 (how soon a controller answers a new object, whatever the
    number of its children)."""
    firsts = [min(seen[n].values()) - created_at[n] for n in names if seen[n]]
    return {"p50": statistics.median(firsts), "p95": percentile(firsts, 0.95)} if firsts else {}


def jobset(name: str) -> dict:
    """A suspended JobSet of two single-pod Jobs (its controller makes the two Jobs and a headless Service)."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"]}]}
    job = {"parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": pod}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name},
        "spec": {"suspend": True, "replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}]},
    }


JOBSET_CHILDREN = (("jobs", "{}-workers-0"), ("jobs", "{}-workers-1"), ("services", "{}"))


def bench_jobset(runs: int, interval: float, settle: float, window: float, pace: float = 20.0, **_) -> dict:
    """The peer: the real JobSet controller (atlas_cluster/controllers.py) on the same kind of cluster, N suspended
    JobSets created at ``pace`` by one client; create -> its first child and -> all three, from the audit log (the
    controller's ServiceAccount), and the controller's CPU over the burst."""
    bin_dir = default_bin_dir()
    ensure_built(bin_dir)
    workdir = Path(tempfile.mkdtemp(prefix="atlas-bench-"))
    cluster = LocalCluster(
        workdir,
        bin_dir,
        start_operator=False,
        log=lambda line: None,
        controllers=("jobset",),
        controller_binaries=ensure_controllers(("jobset",)),
    )
    figures: dict = {"runs": runs, "api": "jobset", "pace": pace}
    try:
        cluster.up()
        api_client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig))
        api = kubernetes.client.CustomObjectsApi(api_client)
        kubernetes.client.CoreV1Api(api_client).create_namespace(
            {"metadata": {"name": NS}}  # type: ignore[arg-type]  # see create_checkpoint_claim
        )
        spec = CONTROLLER_VERSIONS["jobset"]
        audit = Audit(cluster.control_plane.audit_log, f"system:serviceaccount:{spec.namespace}:")
        controller = cluster.supervisor.children["jobset"].pid
        control_plane = [cluster.supervisor.children[n].pid for n in ("kube-apiserver", "etcd")]
        names = [f"js-{i:04d}" for i in range(runs)]
        owner = {pattern.format(n): n for n in names for _, pattern in JOBSET_CHILDREN}
        created_at: dict[str, float] = {}
        seen: dict[str, dict[tuple[str, str], float]] = {n: {} for n in names}
        ready_at: dict[str, float] = {}
        writes = dict.fromkeys(names, 0)
        last_write = [time.time()]

        def follow() -> None:
            for e in audit.poll():
                ref = e.get("objectRef", {})
                if e["verb"] not in WRITES or e.get("responseStatus", {}).get("code", 500) >= 400:
                    continue
                if ref.get("namespace") != NS:
                    continue
                last_write[0] = max(last_write[0], audit_time(e))
                run = owner.get(ref.get("name", ""))
                if run is None:
                    continue
                writes[run] += 1
                key = (ref.get("resource"), ref.get("name"))
                if e["verb"] == "create" and not ref.get("subresource") and key not in seen[run]:
                    seen[run][key] = audit_time(e)
                    if len(seen[run]) == len(JOBSET_CHILDREN):
                        ready_at[run] = max(seen[run].values())

        cpu0 = {"controller": process_cpu(controller), "api": process_cpu(*control_plane)}
        started = time.time()
        for index, name in enumerate(names):
            if pace:
                time.sleep(max(0.0, started + index / pace - time.time()))
            created_at[name] = time.time()
            api.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets", jobset(name))
            if len(created_at) % 50 == 0:
                follow()
        figures["created_s"] = time.time() - started
        wait(lambda: every_run_ready(follow, ready_at, names), 300, 0.1)
        figures["all_ready_s"] = time.time() - started
        figures.update(latency_figures(names, created_at, ready_at))
        figures["first"] = first_child_figures(names, created_at, seen)
        while time.time() - last_write[0] < settle:
            time.sleep(0.25)
            follow()
        figures["busy_cpu"] = {
            "operator": process_cpu(controller) - cpu0["controller"],
            "api": process_cpu(*control_plane) - cpu0["api"],
            "seconds": time.time() - started,
        }
        figures["writes"] = [writes[n] for n in names]
        figures["rss"] = peak_rss_mb(controller)
        figures["admission"] = admission_figures(api, kubernetes.client.CoreV1Api(api_client), runs)
    finally:
        cluster.down()
        shutil.rmtree(workdir, ignore_errors=True)
    return figures


def admission_figures(api, core, count: int) -> dict:
    """What the API server takes to admit each kind, as a user applying them one after another sees it: ``count``
    JobSets (their webhook called for each), then ``count`` AtlasTrainings (the CRD's schema and CEL rules), each
    kind unpaced into a namespace of its own, no operator running (only the JobSet controller, answering its own)."""
    seconds = {}
    for kind, make in (("jobsets", jobset), ("atlastrainings", lambda n: training(n, checkpoint={"pvc": "ckpt"}))):
        namespace = f"admit-{kind}"
        core.create_namespace({"metadata": {"name": namespace}})
        group, version = ("jobset.x-k8s.io", "v1alpha2") if kind == "jobsets" else ("atlas.arc.computer", "v1alpha1")
        started = time.perf_counter()
        for index in range(count):
            body = make(f"admit-{index:04d}")
            body["metadata"]["namespace"] = namespace
            api.create_namespaced_custom_object(group, version, namespace, kind, body)
        seconds[kind] = time.perf_counter() - started
    return seconds


def audit_requests_per_run(events: list[dict], core, names: list[str], owner: dict[str, str]):
    """The operator's successful writes for each run (its own, its children's) from the audit log, plus the Events
    it posted about each (an Event's name is generated: counted from the Events themselves); its reads of each run
    and its children; the first run's requests by kind; and its reads in the namespace of objects no run is named
    after (the shared checkpoint PVC)."""
    reads = dict.fromkeys(names, 0)
    counts = dict.fromkeys(names, 0)
    sample: dict[str, int] = {}
    other_reads = 0  # of objects no run is named after (a checkpoint PVC the runs share): none on a new run's way
    for e in events:
        ref = e.get("objectRef", {})
        run = owner.get(ref.get("name", ""))
        if run is None and ref.get("namespace") == NS and e["verb"] not in WRITES and e["verb"] != "watch":
            other_reads += 1
        if run is None or ref.get("namespace") != NS:
            continue
        key = f"{e['verb'].upper()} {ref['resource']}{'/' + ref['subresource'] if ref.get('subresource') else ''}"
        if e["verb"] not in WRITES:
            reads[run] += 1
            if run == names[0]:
                sample[key] = sample.get(key, 0) + 1
            continue
        if e.get("responseStatus", {}).get("code", 500) >= 400:
            continue
        counts[run] += 1
        if run == names[0]:
            sample[key] = sample.get(key, 0) + 1
    for event in core.list_namespaced_event(NS).items:
        run = event.involved_object.name
        if event.involved_object.kind == "AtlasTraining" and run in counts:  # the operator's and kopf's
            counts[run] += 1
            if run == names[0]:
                sample["CREATE events"] = sample.get("CREATE events", 0) + 1
    return [counts[n] for n in names], [reads[n] for n in names], sample, other_reads


def writes_per_run(emu, names: list[str]) -> tuple[list[int], dict[str, int]]:
    """The successful writes the operator made for each run (its own, its children's, its Events), in one pass over
    the request log; and those of the first run by kind."""
    owner = {}
    for name in names:
        owner[name] = name
        for _, attribute in CHILDREN:
            owner[getattr(ChildNames(name), attribute)] = name
    counts = dict.fromkeys(names, 0)
    sample: dict[str, int] = {}
    for c in emu.calls(lambda c: c.is_write and c.status is not None and c.status < 400):
        if c.method == "POST" and c.resource == "atlastrainings":
            continue  # the benchmark's own create
        body = c.body if isinstance(c.body, dict) else {}
        names_written = (
            c.name,
            (body.get("metadata") or {}).get("name"),
            (body.get("involvedObject") or {}).get("name"),
        )
        run = next((owner[n] for n in names_written if n is not None and owner.get(n)), None)
        if run is None:
            continue
        counts[run] += 1
        if run == names[0]:
            key = f"{c.method} {c.resource}{'/' + c.subresource if c.subresource else ''}"
            sample[key] = sample.get(key, 0) + 1
    return [counts[n] for n in names], sample


def log_tail(path: Path, lines: int = 20) -> str:
    """The end of a process's log (the bench's folder is removed when it exits)."""
    text = path.read_text(errors="replace").splitlines() if path.exists() else [f"({path} is missing)"]
    return f"the end of {path.name}:\n" + "\n".join(text[-lines:])


def cpu_ms(figures: dict) -> float:
    """The controller's (operator's, floor's, JobSet controller's) busy CPU per object created, in ms."""
    return 1000 * figures["busy_cpu"]["operator"] / figures["runs"]


def shown(show, figures: dict) -> str:
    """A cell of the table; "-" where that API has no such figure (the floor has no idle window)."""
    try:
        return show(figures)
    except KeyError:
        return "-"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", default="real,emulator", help="real, emulator or both (side by side)")
    parser.add_argument("--runs", default="100,1000", help="sizes, comma-separated (each one a fresh API and operator)")
    parser.add_argument("--interval", type=float, default=15.0, help="the operator's ATLAS_PROGRESS_INTERVAL")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds without a write = settled")
    parser.add_argument("--window", type=float, default=None, help="idle seconds measured (default 2 intervals)")
    parser.add_argument(
        "--pace", type=float, default=0.0, help="real and floor: runs created per second (default: as fast as it goes)"
    )
    parser.add_argument(
        "--peer-pace", type=float, default=20.0, help="jobset: JobSets, and runs beside them, created per second"
    )
    parser.add_argument("--profile", type=Path, help="a folder for py-spy stacks of the busy operator (real API)")
    args = parser.parse_args()
    # A timeout's SIGTERM unwinds like Ctrl-C: the real API's processes are stopped (bench_real's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = [int(n) for n in args.runs.split(",")]
    apis = [a.strip() for a in args.api.split(",")]
    benches: dict[str, Callable[..., dict]] = {
        "real": bench_real,
        "floor": bench_floor,
        "emulator": bench_emulator,
        "jobset": bench_jobset,
    }
    if unknown := set(apis) - set(benches):
        parser.error(f"--api: {', '.join(sorted(unknown))}: expected real, floor, jobset and/or emulator")
    window = args.window or 2 * args.interval
    results = []
    for runs in sizes:
        for api in apis:
            print(f"... {runs} runs, {api} API", file=sys.stderr, flush=True)
            options = {"profile": args.profile, "pace": args.pace} if api in ("real", "floor") else {}
            if api == "jobset":  # the peer, and the operator at the same pace on the same kind of cluster
                options = {"pace": args.peer_pace}
                results.append(bench_jobset(runs, args.interval, args.settle, window, **options))
                print(f"... {runs} runs, real API at the JobSets' pace", file=sys.stderr, flush=True)
                options.update(controllers=("jobset",), busy_only=True)
                results.append({**bench_real(runs, args.interval, args.settle, window, **options), "peer": True})
                # What the control plane alone allows at that pace: the floor on the same kind of cluster.
                print(f"... {runs} runs, floor API at the JobSets' pace", file=sys.stderr, flush=True)
                results.append({**bench_floor(runs, args.interval, args.settle, window, **options), "peer": True})
                continue
            results.append(benches[api](runs, args.interval, args.settle, window, **options))

    children = len(CHILDREN)
    rows = [
        ("API", lambda f: f["api"]),
        ("created at", lambda f: f"{f['pace']:g}/s" if f.get("pace") else "once"),
        (f"runs (AtlasTraining, {children} children; JobSet, 3)", lambda f: f"{f['runs']}"),
        ("all children present", lambda f: f"{f['present']}/{f['runs']} in {f['all_ready_s']:.1f} s"),
        ("runs created (the bench's client) in", lambda f: f"{f['created_s']:.1f} s"),
        ("create -> children p50", lambda f: f"{f['p50']:.2f} s"),
        ("create -> children p95", lambda f: f"{f['p95']:.2f} s"),
        ("create -> children max", lambda f: f"{f['max']:.2f} s"),
        ("create -> first child p50 / p95", lambda f: f"{f['first']['p50']:.2f} / {f['first']['p95']:.2f} s"),
        (
            "median by creation tenth (1st/5th/10th)",
            lambda f: " / ".join(f"{f['deciles'][i]:.2f}" for i in (0, len(f["deciles"]) // 2 - 1, -1)),
        ),
        (
            "median s to: finalizer / name checks / creates / children",
            lambda f: " / ".join(
                f"{f['steps'][step]:.2f}" if step in f["steps"] else "-" for step in (*STEPS.values(), "children")
            ),
        ),
        (
            "busy CPU s: operator / API",
            lambda f: (
                f"{f['busy_cpu']['operator']:.1f} / {f['busy_cpu']['api']:.1f} (in {f['busy_cpu']['seconds']:.0f} s)"
            ),
        ),
        (
            "busy CPU s: apiserver / etcd / ctrl-manager",
            lambda f: " / ".join(f"{v:.1f}" for v in f["busy_parts"].values()) if "busy_parts" in f else "-",
        ),
        ("busy controller CPU ms per object", lambda f: f"{cpu_ms(f):.1f}"),
        ("operator passes per run (busy: its reconciliations)", lambda f: f"{f['passes']:.2f}"),
        ("busy CPU s: whole bench process", lambda f: f"{f['busy_cpu']['bench']:.1f}"),
        (
            "API writes per settled run (med/max)",
            lambda f: f"{statistics.median(f['writes']):.0f} / {max(f['writes'])}",
        ),
        (
            "API reads per settled run (med/max)",
            lambda f: f"{statistics.median(f['reads']):.0f} / {max(f['reads'])}" if "reads" in f else "-",
        ),
        ("API reads of shared objects (the PVC), all runs", lambda f: f"{f['other_reads']}"),
        ("idle: all Running and scraped", lambda f: "yes" if f["idle_ready"] else "NO"),
        ("idle: API requests/s (beyond watches)", lambda f: f"{f['requests_per_s']:.2f}"),
        ("idle: watches (re)opened in window", lambda f: f"{f['watches_opened']}"),
        ("idle: API writes in window", lambda f: f"{f['idle_writes']}"),
        (
            "idle: trainer scrapes/s",
            lambda f: f"{f['scrapes_per_s']:.1f} (runs/interval {f['runs'] / args.interval:.1f})",
        ),
        ("idle: operator CPU (cores)", lambda f: f"{f['idle_cpu']['operator']:.3f}"),
        (
            "idle: API / fake trainers CPU",
            lambda f: f"{f['idle_cpu']['api']:.3f} / {f['idle_cpu']['trainers']:.3f}",
        ),
        ("operator peak RSS", lambda f: f"{f['rss']:.0f} MB"),
        (
            "admission, one client: JobSets / AtlasTrainings",
            lambda f: f"{f['admission']['jobsets']:.1f} / {f['admission']['atlastrainings']:.1f} s",
        ),
    ]
    width = max(len(label) for label, _ in rows)
    cells = [[shown(show, f) for f in results] for _, show in rows]
    col = max(len(c) for row in cells for c in row)
    print(
        f"interval {args.interval:g} s, idle window {window:g} s, settle {args.settle:g} s, "
        f"pace {f'{args.pace:g} runs/s' if args.pace else 'unpaced'}; load {os.getloadavg()}; "
        "API real: kube-apiserver + etcd (audit log), emulator: kmock in this process"
    )
    for (label, _), row in zip(rows, cells, strict=True):
        print(f"{label:<{width}}  " + "  ".join(f"{c:>{col}}" for c in row))
    for f in results:
        if f["runs"] == min(sizes) and "sample" in f:
            sample = ", ".join(f"{k} x{v}" for k, v in sorted(f["sample"].items()))
            print(f"requests of run-0000 ({f['runs']} runs, {f['api']} API): {sample}")

    # The targets are ratios to the floor and to the JobSet controller, measured in this sitting (issue #59: the
    # absolute ones are out of reach on 2 cores for any operator, the floor included).
    judged = [f for f in results if f["api"] == "real" and not f.get("peer")]
    if not judged:
        print("targets not checked: they are the real API's with the operator, unpaced (--api real)")
        return 0
    checks = []
    for f in judged:
        n = f["runs"]
        floor = next((g for g in results if g["api"] == "floor" and not g.get("peer") and g["runs"] == n), None)
        if floor is not None:
            ratio = f["p95"] / floor["p95"]
            checks.append(
                (
                    f"{n} runs: p95 {f['p95']:.2f} s <= 1.25 x the floor's {floor['p95']:.2f} s ({ratio:.2f}x)",
                    ratio <= 1.25 and f["present"] == n,
                )
            )
        checks.append(
            (
                f"{n} runs: requests per new run <= {children} creates + 1 status",
                max(f["writes"]) + max(f["reads"]) <= children + 1,
            )
        )
        checks.append(
            (
                f"{n} runs: no read on a new run's way (shared objects: {f['other_reads']} in all)",
                max(f["reads"]) == 0 and f["other_reads"] <= 2,
            )
        )
        checks.append((f"{n} runs: operator CPU {cpu_ms(f):.1f} ms per run <= 15", cpu_ms(f) <= 15))
    for peer in (g for g in results if g["api"] == "jobset"):
        n = peer["runs"]
        paced = next((g for g in results if g["api"] == "real" and g.get("peer") and g["runs"] == n), None)
        if paced is None:
            continue
        latency, cpu = paced["first"]["p95"] / peer["first"]["p95"], cpu_ms(paced) / cpu_ms(peer)
        floor = next((g for g in results if g["api"] == "floor" and g.get("peer") and g["runs"] == n), None)
        # The floor's own ratio says whether the JobSet target is within reach of any operator on this machine.
        alone = f"; the floor's: {floor['first']['p95'] / peer['first']['p95']:.2f}x" if floor else ""
        checks.append(
            (
                f"{n} at {peer['pace']:g}/s: first child p95 <= 2 x the JobSet controller's ({latency:.2f}x{alone})",
                latency <= 2,
            )
        )
        if floor is not None:
            ratio = paced["first"]["p95"] / floor["first"]["p95"]
            checks.append(
                (
                    f"{n} at {peer['pace']:g}/s: first child p95 {paced['first']['p95']:.2f} s <= 1.25 x the floor's "
                    f"{floor['first']['p95']:.2f} s at that pace ({ratio:.2f}x)",
                    ratio <= 1.25,
                )
            )
        checks.append(
            (f"{n} at {peer['pace']:g}/s: CPU per object <= 1.5 x the JobSet controller's ({cpu:.2f}x)", cpu <= 1.5)
        )
        admitted = peer["admission"]["atlastrainings"] / peer["admission"]["jobsets"]
        checks.append(
            (
                f"{n} created by one client: AtlasTrainings in <= 1.5 x the JobSets' time ({admitted:.2f}x)",
                admitted <= 1.5,
            )
        )
    big = max(judged, key=lambda f: f["runs"])
    n = big["runs"]
    checks += [
        (f"idle at {n}: every run Running and scraped", big["idle_ready"]),
        (f"idle at {n}: < 5 API requests/s beyond open watches", big["requests_per_s"] < 5),
        # (1 % for the window's edges: a run's two scrapes in a window of two intervals may be three at its ends)
        (f"idle at {n}: scrapes/s <= runs / interval", big["scrapes_per_s"] <= 1.01 * n / args.interval),
        (f"idle at {n}: operator CPU < 0.3 core", big["idle_cpu"]["operator"] < 0.3),
        (f"idle at {n}: operator RSS < 250 MB", big["rss"] < 250),
    ]
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
