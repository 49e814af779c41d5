"""The trainers' metrics scrapes through the operator process (`atlas operator` on kmock's API emulator): bounded in
time and size, in a pool of their own, off the reconcile path (reconcile/scrape.py; fetch_text's own bounds:
tests/unit/test_operator_status.py)."""

from __future__ import annotations

import pytest

from harness.manifests import NS, training
from harness.polling import wait_for
from tests.support.operator_cluster import TIMEOUT, own_cluster, wait_children

pytestmark = pytest.mark.timeout(300)


class TricklingMetrics:
    """Trainer metrics endpoints on 127.0.0.1 under /<run>/metrics: runs named slow-* answer one line every
    0.2 s and never finish (for at most 60 s); the others answer at once with their step."""

    def __init__(self):
        import http.server
        import threading
        import time

        outer = self
        self.slow_connections: set[str] = set()
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                run = self.path.strip("/").split("/")[0]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                if not run.startswith("slow"):
                    labels = f'namespace="{NS}",run="{run}",kind="AtlasTraining"'
                    self.wfile.write(f"atlas_training_step{{{labels}}} 42\n".encode())
                    return
                with outer.lock:
                    outer.slow_connections.add(run)
                end = time.monotonic() + 60
                try:
                    while time.monotonic() < end:
                        self.wfile.write(b"# still here\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                except OSError:
                    pass  # the operator gave up on it: what it should do

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    @property
    def template(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{{name}}/metrics"


def test_a_trickling_trainer_endpoint_delays_no_other_run(tmp_path):
    """Two runs whose trainers trickle their /metrics forever, two reconcile workers: a new run still gets
    its children and its progress, because scrapes are bounded and off the reconcile path."""
    with (
        TricklingMetrics() as metrics,
        own_cluster(tmp_path, metrics_url=metrics.template, operator_env={"ATLAS_WORKERS": "2"}) as cluster,
    ):
        for name in ("slow-a", "slow-b"):
            cluster.apply(training(name))
            wait_children(cluster, name, teacher_run=False)
            cluster.set_job_conditions(name, "Created", "Running")
        wait_for(lambda: metrics.slow_connections == {"slow-a", "slow-b"}, timeout=TIMEOUT, what="both slow scrapes")
        fast = training("fast-run")
        cluster.apply(fast)
        wait_children(cluster, "fast-run", teacher_run=False)
        cluster.set_job_conditions("fast-run", "Created", "Running")
        cluster.wait_status(fast, lambda s: (s.get("progress") or {}).get("step") == 42, "the fast run's progress")
        for name in ("slow-a", "slow-b"):  # the slow runs themselves keep being reconciled
            cluster.wait_status(training(name), lambda s: s.get("phase") == "Running", f"{name} Running")
