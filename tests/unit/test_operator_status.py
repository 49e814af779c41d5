"""The status logic (atlas_operator.status_update and the trainer scrape): phases from job conditions, conditions,
progress from the trainer's metrics, absent fields removed."""

from __future__ import annotations

import pytest
from atlas_operator.status_update import Outcome, job_phase, merge_conditions, parse_progress, status_update

from harness.polling import wait_for


def test_queued_phase_until_kueue_unsuspends_the_job():
    suspended = {"spec": {"runPolicy": {"suspend": True}}, "status": {"conditions": []}}
    assert job_phase(suspended, False, queued=True) == "Queued"
    kubeflow_suspended = {
        "spec": {"runPolicy": {"suspend": True}},
        "status": {"conditions": [{"type": "Suspended", "status": "True"}]},
    }
    assert job_phase(kubeflow_suspended, False, queued=True) == "Queued"
    assert job_phase(kubeflow_suspended, False) == "Suspended"
    running = {
        "spec": {"runPolicy": {"suspend": False}},
        "status": {"conditions": [{"type": "Running", "status": "True"}]},
    }
    assert job_phase(running, False, queued=True) == "Running"
    assert job_phase(None, False, queued=True) == "Pending"
    done = {
        "spec": {"runPolicy": {"suspend": True}},
        "status": {"conditions": [{"type": "Succeeded", "status": "True"}]},
    }
    assert job_phase(done, False, queued=True) == "Succeeded"


def test_phase_follows_the_last_true_job_condition():
    def job(*types):
        return {
            "status": {
                "conditions": [
                    {"type": t, "status": "True" if i == len(types) - 1 else "False"} for i, t in enumerate(types)
                ]
            }
        }

    assert job_phase(None, False) == "Pending"
    assert job_phase(job("Created"), False) == "Pending"
    assert job_phase(job("Created", "Running"), False) == "Running"
    assert job_phase(job("Created", "Running", "Restarting"), False) == "Running"
    assert job_phase(job("Created", "Running", "Succeeded"), False) == "Succeeded"
    assert job_phase(job("Created", "Running", "Failed"), True) == "Failed"
    assert job_phase(job("Created", "Running"), True) == "Suspended"


def test_conditions_keep_their_transition_time_while_unchanged():
    first = merge_conditions(None, [{"type": "Training", "status": "False", "reason": "JobPending"}], "t1")
    same = merge_conditions(first, [{"type": "Training", "status": "False", "reason": "JobPending"}], "t2")
    moved = merge_conditions(same, [{"type": "Training", "status": "True", "reason": "Running"}], "t3")
    assert same == first and first[0]["lastTransitionTime"] == "t1" and moved[0]["lastTransitionTime"] == "t3"


def test_progress_from_real_trainer_metrics(fresh_trainer_metrics):
    """The trainer's own registry, rendered by prometheus_client: what the operator will parse."""
    from prometheus_client import generate_latest

    metrics = fresh_trainer_metrics

    labels = {"namespace": "team-a", "run": "render-progress-run", "kind": "AtlasTraining"}
    metrics.training_step.labels(**labels).set(120)
    metrics.training_reward.labels(**labels).set(0.61)
    metrics.training_reward_std.labels(**labels).set(0.2)
    text = generate_latest(metrics.TRAINER_REGISTRY).decode()
    assert parse_progress(text, "render-progress-run", "team-a") == {"step": 120, "reward": 0.61}  # no KL at beta 0
    metrics.training_step.labels(**labels).set(121)
    metrics.training_kl.labels(**labels).set(0.013)
    text = generate_latest(metrics.TRAINER_REGISTRY).decode()
    assert parse_progress(text, "render-progress-run", "team-a") == {"step": 121, "reward": 0.61, "kl": 0.013}
    assert parse_progress(text, "other-run", "team-a") == {}


def test_status_absent_means_absent():
    """A server the spec no longer has leaves status.children, and a KL the trainer no longer exports
    (beta set to 0) leaves status.progress: the merge patch deletes them instead of keeping stale values."""
    old = {
        "phase": "Running",
        "children": {"pytorchJob": "r", "configMap": "r-config", "rollout": "r-rollout"},
        "progress": {"step": 7, "reward": 0.5, "kl": 0.01, "updatedAt": "2026-01-01T00:00:00Z"},
    }
    result = Outcome(
        "Running", [], children={"pytorchJob": "r", "configMap": "r-config"}, progress={"step": 8, "reward": 0.6}
    )
    patch, _ = status_update(old, 2, result, "2026-01-01T00:01:00Z")
    assert patch["children"] == {"pytorchJob": "r", "configMap": "r-config", "rollout": None}
    assert patch["progress"] == {"step": 8, "reward": 0.6, "kl": None, "updatedAt": "2026-01-01T00:01:00Z"}
    unchanged, _ = status_update({**old, "conditions": []}, 2, Outcome("Running", [], children=old["children"]), "t")
    assert "children" not in unchanged and "progress" not in unchanged  # nothing scraped: progress kept


def test_trainer_scrape_is_bounded_in_time_and_size():
    """fetch_text: a deadline for the whole request (a trickling endpoint is cut), and a size cap."""
    import http.server
    import threading
    import time

    from atlas_operator.reconcile import fetch_text

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            try:
                if self.path == "/slow":
                    for _ in range(300):  # 60 s of one line every 0.2 s, unless cut
                        self.wfile.write(b"# still here\n")
                        self.wfile.flush()
                        time.sleep(0.2)
                elif self.path == "/big":
                    self.wfile.write(b"#" * (3 << 20))
                else:
                    self.wfile.write(b"atlas_training_step 42\n")
            except OSError:
                self.server.cut.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads, server.cut = True, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert fetch_text(base + "/ok", 5, 1 << 20) == "atlas_training_step 42\n"
        with pytest.raises(TimeoutError):
            fetch_text(base + "/slow", 0.5, 1 << 20)
        with pytest.raises(ValueError, match="larger than"):
            fetch_text(base + "/big", 5, 1 << 20)
        wait_for(lambda: "/slow" in server.cut, timeout=10, what="the slow answer cut by the client")
    finally:
        server.shutdown()
        server.server_close()


def test_every_event_the_operator_posts_has_a_declared_reason():
    """Event reasons are EventReason members: a phase's transition, a stuck pod's kubelet reason, a missing
    prerequisite are all declared; an undeclared reason raises where the Event is made; and no Event in the
    operator's source spells its reason as a literal."""
    import ast
    from pathlib import Path

    import atlas_operator
    from atlas_operator.reconcile import JOB_CRDS
    from atlas_operator.run_status import EventReason
    from atlas_operator.status_update import STUCK_REASONS, Event

    from atlas_contract.names import PHASES

    assert set(PHASES) <= set(EventReason)
    assert {str(r) for r in STUCK_REASONS} <= set(EventReason)
    assert {reason for reason, _, _ in JOB_CRDS.values()} <= set(EventReason)
    assert Event("Normal", "PreemptionSave", "m").reason == EventReason.PREEMPTION_SAVE
    with pytest.raises(ValueError):
        Event("Warning", "SomethingNew", "m")
    literal = []
    for path in Path(atlas_operator.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Event" and len(node.args) > 1:
                if isinstance(node.args[1], ast.Constant):
                    literal.append(f"{path.name}:{node.lineno}")
    assert not literal, f"Event reasons spelt as literals (use EventReason): {literal}"


def test_the_timer_retries_a_run_its_handler_never_reconciled_after_stuck_after_intervals():
    """reconcile/retry.py: a run whose status is not at its generation is its handler's, until it has waited
    STUCK_AFTER intervals (the memory keeps since when); a reconciled run is retried only for what no event brings."""
    from atlas_operator.reconcile import RunMemory
    from atlas_operator.reconcile.retry import STUCK_AFTER, needs_retry, stuck

    memory, run = RunMemory(), ("AtlasTraining", "ns", "waiting")
    new = {}
    assert not stuck(memory, run, new, 1, interval_s=60.0)  # just started waiting
    assert stuck(memory, run, new, 1, interval_s=0.0)  # waited 0 >= STUCK_AFTER x 0
    assert STUCK_AFTER * 60.0 > 0 and not needs_retry(new, 1) and needs_retry(new, 1, stuck=True)
    settled = {"phase": "Running", "observedGeneration": 1, "conditions": []}
    assert not stuck(memory, run, settled, 1, interval_s=0.0)
    assert not memory.holds("ns", "waiting")  # reconciled: nothing kept for the wait
    taken = {**settled, "phase": "Invalid", "conditions": [{"type": "Valid", "status": "False", "reason": "NameTaken"}]}
    assert needs_retry(taken, 1)
    assert needs_retry({"phase": "Succeeded", "observedGeneration": 1}, 1)
