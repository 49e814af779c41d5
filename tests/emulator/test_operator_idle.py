"""Regression guards for what idle runs cost the operator (nothing is timed): runs that train and whose numbers stand
still make no API write, and no API read, over several status refreshes. Their children and jobs are watched, a
Running trainer is scraped, and nothing else is asked of the API server (bench/operator_throughput.py measures the
same at a thousand runs)."""

from __future__ import annotations

import pytest
from atlas_operator.ticker import tick_line

from harness.env import free_port
from harness.manifests import NS, teacher, training
from harness.polling import wait_for
from tests.support.operator_cluster import TIMEOUT, own_cluster, wait_children

pytestmark = pytest.mark.timeout(120)

OPERATOR = ("atlas-operator/", "kopf/")
TICKS = 3  # status refreshes (ATLAS_PROGRESS_INTERVAL is 1 s in these clusters) each run goes through while measured
# API reads per status refresh of a settled run, beyond the operator's open watches.
READS_PER_INTERVAL = 0


@pytest.fixture(scope="module")
def idle(tmp_path_factory):
    """Four settled runs: three Running (their trainers answer with numbers that stand still), one Pending."""
    from atlas_core.telemetry import metrics
    from atlas_core.telemetry.metrics import serve_metrics

    port = serve_metrics(free_port(), host="127.0.0.1")
    with own_cluster(tmp_path_factory.mktemp("idle"), metrics_url=f"http://127.0.0.1:{port}/metrics") as cluster:
        running = [training("idle-a"), training("idle-b"), teacher("idle-c")]
        pending = training("idle-pending")
        for manifest in (*running, pending):
            cluster.apply(manifest)
            wait_children(cluster, manifest["metadata"]["name"], teacher_run=manifest["kind"] == "AtlasTeacher")
        for step, manifest in enumerate(running, start=3):
            name = manifest["metadata"]["name"]
            labels = {"namespace": NS, "run": name, "kind": manifest["kind"]}
            metrics.training_step.labels(**labels).set(step)
            metrics.training_reward.labels(**labels).set(0.5)
            cluster.set_job_conditions(name, "Created", "Running")
        for manifest, step in zip(running, (3, 4, 5), strict=True):
            cluster.wait_status(manifest, lambda s, n=step: (s.get("progress") or {}).get("step") == n, "progress")
        cluster.wait_status(
            pending, lambda s: s.get("phase") == "Pending" and s.get("observedGeneration"), "Pending, settled"
        )
        yield cluster, [m["metadata"]["name"] for m in (*running, pending)]


def ticks(cluster, name: str) -> int:
    return cluster.operator.output().count(tick_line(NS, name))


def operator_calls_over_ticks(cluster, names: list[str]) -> list:
    """The operator's requests (beyond opening watches) while every run goes through TICKS status refreshes."""
    mark = cluster.emu.request_count()
    before = {name: ticks(cluster, name) for name in names}
    wait_for(
        lambda: all(ticks(cluster, name) >= before[name] + TICKS for name in names),
        timeout=TIMEOUT,
        what=f"{TICKS} status refreshes of every run",
    )
    return cluster.emu.calls(
        lambda c: (c.user_agent or "").startswith(OPERATOR) and c.query.get("watch") != "true", start=mark
    )


def test_settled_runs_make_no_api_write_over_several_status_refreshes(idle):
    cluster, names = idle
    writes = [c for c in operator_calls_over_ticks(cluster, names) if c.is_write]
    assert writes == [], [(c.method, c.path, c.body) for c in writes]


def test_settled_runs_read_nothing_per_status_refresh(idle):
    """Children and jobs come by watch, the run by its own watch: a refresh of a settled run reads nothing."""
    cluster, names = idle
    reads = [c for c in operator_calls_over_ticks(cluster, names) if not c.is_write]
    per_interval = len(reads) / (TICKS * len(names))
    assert per_interval <= READS_PER_INTERVAL, [(c.method, c.path) for c in reads]
