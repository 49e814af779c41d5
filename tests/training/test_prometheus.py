"""The dashboard and the alerts against a real Prometheus (Debian's 2.42, on 127.0.0.1, scraping every second).

The operator (`atlas operator` on the API emulator) renders two real tiny runs, one after the other: an AtlasTeacher
(teaching metrics) and an AtlasTraining rewarded by RIM judges (a local OpenAI-compatible server), whose judge hangs
for a while mid-run. No controller runs: each run's rank 0 is its rendered PyTorchJob's Master container, started
here as a local process (``Trainer``: its command, env and ConfigMap files, the mount paths remapped to local
directories, its metrics port served on a free host port), and the PyTorchJob's status and finished Master pod are
set by hand from that process (the real training-operator runs these pods in tests/kube/test_runs.py). Prometheus
scrapes the operator and rank 0's /metrics as the chart's ServiceMonitor and PodMonitor would (honor_labels; the
`run` label from the pod, which the PodMonitor relabels from app.kubernetes.io/instance) and evaluates the chart's
alert rules, rendered by helm with a short stall limit. Then every dashboard query runs through the HTTP API as
Grafana would send it, and the hung judge's run must have made AtlasRunStalled fire.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from harness.env import REPO, free_port, python_env
from harness.kube_emulator import PYTORCHJOBS
from harness.manifests import NS, tiny_training
from harness.polling import wait_for
from tests.support.operator_cluster import own_cluster
from tests.support.prometheus_server import MISSING, Prometheus, binaries, finite_points, grafana_expr, grafana_interval

pytestmark = [
    pytest.mark.serial,  # times a real trainer and Prometheus: the serial lane (tests/conftest.py)
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(binaries() is None, reason=MISSING),
]

DASHBOARD = REPO / "charts/atlas-operator/dashboards/atlas.json"
SCRAPE_S = 1.0
STALL_LIMIT_S = 5  # alerts.runStalled.noStepForSeconds for this test (the chart's default: 1200)
RUN_TIMEOUT = 400
TEACHER, RIM_RUN = "prom-teacher", "rim-run"


def dashboard_panels() -> list[tuple[str, str, list[str]]]:
    """(row title, panel title, PromQL of each target) of every graph panel, in order."""
    row, panels = "", []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        else:
            panels.append((row, panel["title"], [t["expr"] for t in panel.get("targets", [])]))
    return panels


def scrape_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def teacher_run() -> dict:
    manifest = yaml.safe_load((REPO / "examples/local-teacher.yaml").read_text())
    manifest["metadata"] = {"name": TEACHER, "namespace": NS}
    manifest["spec"]["resources"]["nodes"] = 1  # rank 0 alone serves metrics: one process is enough here
    # Long enough for several scrapes while it steps (rate() needs two samples in its window): 10 steps were not,
    # once the student's batches shrank (a finished answer leaves the batch) and the steps got faster.
    manifest["spec"]["training"]["maxSteps"] = 30
    manifest["spec"]["checkpoint"]["saveSteps"] = 30
    return manifest


def rim_run(judge_url: str) -> dict:
    run = tiny_training(
        RIM_RUN,
        reward={"config": "interpretation_offline"},
        env=[
            {"name": "ATLAS_JUDGE_SMALL_URL", "value": judge_url},
            {"name": "ATLAS_JUDGE_LARGE_URL", "value": judge_url},
        ],
    )
    run["spec"]["training"]["beta"] = 0.04  # the KL panel
    return run


def render_rules(path: Path) -> Path:
    from tools.alert_rules import render_alert_rules

    path.write_text(
        render_alert_rules(f"alerts.runStalled.noStepForSeconds={STALL_LIMIT_S}", "alerts.runStalled.for=2s")
    )
    return path


MAX_TERMINATION_MESSAGE = 4096  # bytes of the termination message the kubelet keeps


class Trainer:
    """Rank 0 of run ``name`` (one node) as a local process: its rendered PyTorchJob's Master container, run as the
    kubelet would start it. The container's volumes are directories under ``root`` (the ConfigMap's keys written as
    files), every mount path (and the termination message path) remapped to them in the command, the env and those
    files; the topology env the training-operator gives a one-node job (MASTER_ADDR, MASTER_PORT, PET_*); the
    container's ``metrics`` port served on host port ``metrics_port``. What the training-operator and the kubelet
    would report, the test writes by hand: the job's Created and Running conditions once the process runs, and when
    it exits 0, the finished Master pod (its termination message, the run's result) and Succeeded."""

    def __init__(self, cluster, name: str, root: Path, metrics_port: int):
        self.cluster, self.name = cluster, name
        root.mkdir(parents=True, exist_ok=True)
        job = wait_for(lambda: cluster.emu.get(PYTORCHJOBS, NS, name), timeout=60, what=f"PyTorchJob {name}")
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert list(replicas) == ["Master"] and replicas["Master"]["replicas"] == 1, replicas
        pod = replicas["Master"]["template"]["spec"]
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        paths: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            paths[mount["mountPath"]] = root / mount["name"]
            paths[mount["mountPath"]].mkdir(parents=True, exist_ok=True)
        self.termination_log = root / "termination-log"
        self.termination_log.write_bytes(b"")
        paths[container["terminationMessagePath"]] = self.termination_log

        def remap(text: str) -> str:
            for mount_path, local in sorted(paths.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(mount_path, str(local))
            return text

        (rendered_port,) = [p["containerPort"] for p in container["ports"] if p["name"] == "metrics"]
        for mount in container.get("volumeMounts", []):
            config_map = volumes[mount["name"]].get("configMap")
            if config_map is None:
                continue
            cm = wait_for(lambda c=config_map: cluster.emu.get("v1/configmaps", NS, c["name"]), timeout=60)
            for key, value in cm["data"].items():
                text = remap(value)
                if key == "run.yaml":  # the container's metrics port, served on a host port of its own here
                    run = yaml.safe_load(text)
                    assert run["trainer"]["metrics_port"] == rendered_port, run["trainer"]
                    run["trainer"]["metrics_port"] = metrics_port
                    text = yaml.safe_dump(run, sort_keys=False)
                (paths[mount["mountPath"]] / key).write_text(text)
        env = python_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}")
        master_port = str(free_port())
        env.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=master_port,
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=master_port,
            PET_NNODES="1",
            PET_NODE_RANK="0",
            PET_NPROC_PER_NODE=str(job["spec"].get("nprocPerNode", "1")),
            WORLD_SIZE="1",
            RANK="0",
        )
        for var in container.get("env", []):
            source = var.get("valueFrom")
            if source:
                assert source == {"fieldRef": {"fieldPath": "metadata.namespace"}}, var
                env[var["name"]] = NS
            else:
                env[var["name"]] = remap(str(var.get("value", "")))
        command = [remap(part) for part in container.get("command", []) + container.get("args", [])]
        self.log = root / "trainer.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
            )
        cluster.set_job_conditions(name, "Created", "Running")

    def finish(self, timeout: float) -> None:
        """Wait for the process to exit 0, then what the training-operator and kubelet report of it: the finished
        Master pod with its termination message, and Succeeded."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout:.0f} s:\n{self.log_tail()}") from None
        assert code == 0, f"{self.name} exited {code}:\n{self.log_tail()}"
        message = self.termination_log.read_bytes()[:MAX_TERMINATION_MESSAGE].decode("utf-8", "ignore")
        self.cluster.finish_master_pod(self.name, message or None)
        self.cluster.set_job_conditions(self.name, "Created", "Running", "Succeeded")

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        """SIGKILL to the process and every process it started (``descendants``, atlas_cluster/node/container.py: the
        launcher's workers run in sessions of their own), as a container runtime kills a cgroup."""
        from atlas_cluster.node import descendants

        if self.proc.poll() is None:
            for pid in [*descendants(self.proc.pid), self.proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(10)


class Observed:
    """What the module's runs left behind, for the tests below."""

    prometheus: Prometheus
    windows: dict[str, tuple[float, float]]
    endpoint_text: dict[str, str]
    stalled_alert: dict | None


@pytest.fixture(scope="module")
def observed(tmp_path_factory, tiny_model_dir):
    from harness.judge_server import JudgeServer, Reply, judgment

    tmp = tmp_path_factory.mktemp("prometheus")
    metrics_port = free_port()  # rank 0's metrics port, served on this host port (Trainer)
    found = Observed()
    found.windows, found.endpoint_text, found.stalled_alert = {}, {}, None
    trainers: list[Trainer] = []
    with own_cluster(tmp, metrics_url=f"http://127.0.0.1:{metrics_port}/metrics") as cluster:
        operator_target = f"127.0.0.1:{cluster.operator.metrics_port}"
        prometheus = Prometheus(
            tmp / "prometheus",
            scrape_configs=[
                # The chart's ServiceMonitor (job = its Service's name; here the plain rules' job name).
                {
                    "job_name": "atlas-operator",
                    "honor_labels": True,
                    "static_configs": [{"targets": [operator_target]}],
                },
                # The chart's PodMonitor: the trainer's own labels kept, `run` (and namespace) from the pod.
                {"job_name": "atlas-trainers", "honor_labels": True, "file_sd_configs": [{"files": ["trainers.json"]}]},
            ],
            rule_files=[render_rules(tmp / "atlas-alerts.rules.yaml")],
        )
        prometheus.set_file_targets("trainers", [], {})  # file_sd paths are relative to the config file
        prometheus.start()
        found.prometheus = prometheus
        try:
            for name in (TEACHER, RIM_RUN):
                prometheus.set_file_targets("trainers", [f"127.0.0.1:{metrics_port}"], {"namespace": NS, "run": name})
                start = time.time()
                if name == TEACHER:
                    manifest = teacher_run()
                    cluster.apply(manifest)
                    trainers.append(Trainer(cluster, name, tmp / name, metrics_port))
                    capture_while_running(found, cluster, manifest, metrics_port)
                    trainers[-1].finish(RUN_TIMEOUT)
                    wait_finished(cluster, manifest)
                else:
                    hang, release = threading.Event(), threading.Event()

                    def judge(call, hang=hang, release=release):
                        if hang.is_set():
                            release.wait(120)  # the judge hangs: the whole server stops answering
                        return Reply(content=judgment(0.7, 0.1))

                    with JudgeServer(judge, served_model="judge") as server:
                        manifest = rim_run(server.base_url)
                        cluster.apply(manifest)
                        trainers.append(Trainer(cluster, name, tmp / name, metrics_port))
                        wait_for(lambda: trainer_step(metrics_port) >= 2, timeout=RUN_TIMEOUT, what="two steps")
                        capture_endpoints(found, cluster, metrics_port)
                        hang.set()
                        found.stalled_alert = wait_alert_firing(prometheus, "AtlasRunStalled", RIM_RUN, timeout=90)
                        release.set()
                        trainers[-1].finish(RUN_TIMEOUT)
                        wait_finished(cluster, manifest)
                time.sleep(3 * SCRAPE_S)  # the last scrapes of the finished run
                found.windows[name] = (start, time.time())
            yield found
        finally:
            prometheus.stop()
            for trainer in trainers:
                trainer.kill()


def trainer_step(port: int) -> float:
    try:
        text = scrape_text(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return -1
    steps = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("atlas_training_step{")]
    return max(steps, default=-1)


def capture_endpoints(found: Observed, cluster, metrics_port: int) -> None:
    found.endpoint_text["trainer"] = scrape_text(f"http://127.0.0.1:{metrics_port}/metrics")
    found.endpoint_text["operator"] = cluster.operator.get("/metrics")[1]


def capture_while_running(found: Observed, cluster, manifest, metrics_port: int) -> None:
    wait_for(lambda: trainer_step(metrics_port) >= 1, timeout=RUN_TIMEOUT, what=f"{manifest['metadata']['name']} steps")
    found.endpoint_text["teacher"] = scrape_text(f"http://127.0.0.1:{metrics_port}/metrics")


def wait_finished(cluster, manifest) -> None:
    status = cluster.wait_status(
        manifest, lambda s: s.get("phase") in ("Succeeded", "Failed"), "finished", timeout=RUN_TIMEOUT
    )
    assert status["phase"] == "Succeeded", status


def wait_alert_firing(prometheus: Prometheus, alertname: str, run: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        for alert in prometheus.alerts():
            if alert["labels"].get("alertname") == alertname and alert["labels"].get("run") == run:
                seen.append(alert["state"])
                if alert["state"] == "firing":
                    return {**alert, "states_seen": sorted(set(seen))}
        time.sleep(0.5)
    raise AssertionError(f"{alertname} for {run} did not fire in {timeout:.0f} s (states seen: {sorted(set(seen))})")


# ----------------------------------------------------------------------------- the dashboard

ROWS_FOR = {  # which runs each dashboard row must show data for
    "Training": (TEACHER, RIM_RUN),
    "Teaching (AtlasTeacher runs)": (TEACHER,),
    "Rewards (RIM)": (RIM_RUN,),
}


def test_every_dashboard_panel_returns_data_for_the_runs(observed):
    """Each panel's every query, as Grafana sends it for one run ($namespace, $run, $__rate_interval at a 1 s
    scrape interval), over the run's time range: at least one number. The operator row: over the whole test."""
    prom, empty = observed.prometheus, []
    everything = (min(w[0] for w in observed.windows.values()), max(w[1] for w in observed.windows.values()))
    for row, title, exprs in dashboard_panels():
        runs = ROWS_FOR.get(row)
        cases = [(run, observed.windows[run]) for run in runs] if runs else [(None, everything)]
        for run, (start, end) in cases:
            interval = grafana_interval(end - start, max_data_points=800, min_interval_s=SCRAPE_S)
            variables = {"namespace": [NS], "run": [run]} if run else {}
            for expr in exprs:
                query = grafana_expr(expr, variables, interval, SCRAPE_S)
                result = prom.query_range(query, start, end, interval)
                if finite_points(result) == 0:
                    empty.append(f"{row} / {title} [{run or 'all'}]: {query}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_dashboard_variables_list_the_runs(observed):
    """The Namespace and Run variables' queries (label_values) list what ran."""
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    start, end = min(w[0] for w in observed.windows.values()), max(w[1] for w in observed.windows.values())
    namespace = variables["namespace"]["definition"]  # label_values(<selector>, namespace)
    selector, label = namespace[len("label_values(") : -1].rsplit(", ", 1)
    assert NS in observed.prometheus.label_values(label, selector, start, end)
    run = variables["run"]["definition"]
    selector, label = run[len("label_values(") : -1].rsplit(", ", 1)
    selector = grafana_expr(selector, {"namespace": [NS]}, SCRAPE_S, SCRAPE_S)
    assert {TEACHER, RIM_RUN} <= set(observed.prometheus.label_values(label, selector, start, end))


# ----------------------------------------------------------------------------- the alerts


def test_a_hung_judge_makes_the_stalled_alert_fire_for_its_run(observed):
    alert = observed.stalled_alert
    assert alert["labels"]["run"] == RIM_RUN and alert["labels"]["namespace"] == NS
    assert alert["labels"]["kind"] == "AtlasTraining" and alert["labels"]["severity"] == "critical"
    assert f"AtlasTraining {NS}/{RIM_RUN} has completed no optimizer step" in alert["annotations"]["description"]
    assert float(alert["value"]) > STALL_LIMIT_S
    # Pending first (the rule's `for`), then firing.
    assert alert["states_seen"] == ["firing", "pending"] or alert["states_seen"] == ["firing"], alert
    started = min(w[0] for w in observed.windows.values())
    end = max(w[1] for w in observed.windows.values())
    # The teacher, stepping every second or two, never stalled; neither run after it finished (its series gone).
    fired = observed.prometheus.query_range(
        'ALERTS{alertname="AtlasRunStalled", alertstate="firing"}', started, end, SCRAPE_S
    )
    assert {s["metric"]["run"] for s in fired} == {RIM_RUN}, fired
    active = [a for a in observed.prometheus.alerts() if a["labels"].get("alertname") == "AtlasRunStalled"]
    assert not active, active


def test_every_alert_rule_loads_and_evaluates_without_error(observed):
    """Prometheus loaded every rule of the chart and evaluated each without an error over the runs."""
    groups = observed.prometheus.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    rendered = yaml.safe_load((REPO / "monitoring/atlas-alerts.rules.yaml").read_text())
    assert {r["name"] for r in rules} == {r["alert"] for g in rendered["groups"] for r in g["rules"]}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]


# ----------------------------------------------------------------------------- the endpoints


@pytest.mark.parametrize("endpoint", ["trainer", "teacher", "operator"])
def test_promtool_check_metrics_passes_on_each_endpoint(observed, endpoint):
    """`promtool check metrics` (naming, units, help, counter suffixes) on what the endpoints served mid-run."""
    text = observed.endpoint_text[endpoint]
    assert "# HELP" in text
    promtool = binaries()[1]
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_both_targets_were_scraped(observed):
    up = observed.prometheus.query_range(
        "up", min(w[0] for w in observed.windows.values()), max(w[1] for w in observed.windows.values()), SCRAPE_S
    )
    jobs = {s["metric"]["job"] for s in up if any(float(v) == 1 for _, v in s["values"])}
    assert jobs == {"atlas-operator", "atlas-trainers"}
    assert all(math.isfinite(float(v)) for s in up for _, v in s["values"])
