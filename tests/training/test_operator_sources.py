"""What the operator shows of a run's sources and export: SourcesReady and Exported, .status.output, from the pods'
termination messages as the real initializer (atlas_core/sources/initializer.py) and the real result message
(atlas_contract.results) write them — a fetch from the real S3 server with a wrong secret, a missing object, a
closed port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from atlas_operator.reconcile.memory import RunMemory
from atlas_operator.reconcile.observe import Observation
from atlas_operator.status_update import Outcome, export_failure, sources_failure, status_update
from atlas_operator.validation import parse_run

from atlas_contract.results import result_message
from atlas_contract.sources import SOURCES_EXIT_CODE
from harness.manifests import teacher
from harness.s3 import S3

STORAGE = {"secretRef": {"name": "atlas-s3"}}


def initializer_message(tmp_path: Path, uri: str, env: dict[str, str], wait_s: float = 5.0) -> tuple[int, str]:
    """The real initializer's exit code and termination message for one model ``uri``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    message = tmp_path / "termination-log"
    message.write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "atlas_core.sources.initializer", "--uri", uri, "--message-file", str(message)]
        + ["--sources-dir", str(tmp_path / "sources"), "--unreachable-wait-s", str(wait_s)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, message.read_text()


def pod(name: str, component: str, *, init: list[dict] = (), containers: list[dict] = ()) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {"app.kubernetes.io/instance": "teacher-run", "app.kubernetes.io/component": component},
        },
        "spec": {"containers": [{"name": "pytorch" if component == "trainer" else "vllm"}]},
        "status": {"initContainerStatuses": list(init), "containerStatuses": list(containers)},
    }


def terminated(name: str, code: int, message: str, *, restarted: bool = False) -> dict:
    ended = {"terminated": {"exitCode": code, "message": message, "reason": "Error"}}
    if restarted:  # the kubelet's back-off: waiting again, the failure as lastState
        return {"name": name, "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": ended}
    return {"name": name, "state": ended}


def observed(run, memory: RunMemory, body: dict | None = None, phase: str = "Pending", progress=None) -> Outcome:
    outcome = Outcome(phase=phase, conditions=[], progress=progress)
    observation = Observation(None, memory)
    observation.observe_sources(run, body or {}, outcome)
    observation.observe_export(run, body or {}, outcome)
    return outcome


def by_type(outcome: Outcome) -> dict[str, dict]:
    return {c["type"]: c for c in outcome.conditions}


def test_a_wrong_secret_shows_as_access_denied_naming_the_uri_and_never_the_secret(s3_server: S3, tmp_path):
    bucket = s3_server.bucket("models-denied")
    s3_server.client().put_object(Bucket=bucket, Key="tiny/config.json", Body=b"{}")
    uri = f"s3://{bucket}/tiny"
    wrong = "not-the-secret-" + "x" * 24
    code, message = initializer_message(tmp_path, uri, {**s3_server.env(), "AWS_SECRET_ACCESS_KEY": wrong})
    assert code == SOURCES_EXIT_CODE
    run = parse_run(teacher(model=uri, storage=STORAGE))
    memory = RunMemory()
    memory.note_kind("team-a", "teacher-run", "AtlasTeacher")
    server = pod("teacher-run-rollout-x", "rollout", init=[terminated("initializer", code, message, restarted=True)])
    assert Observation(None, memory).pod_changed(server) == ("AtlasTeacher", "teacher-run")
    outcome = observed(run, memory)
    sources = by_type(outcome)["SourcesReady"]
    assert (sources["status"], sources["reason"]) == ("False", "AccessDenied")
    assert uri in sources["message"] and "teacher-run-rollout-x" in sources["message"]
    assert outcome.phase == "Pending"  # the kubelet's back-off retries: a fixed Secret lets it go on
    patch, events = status_update({}, 1, outcome, "2026-12-07T00:00:00Z")
    assert [(e.type, e.reason) for e in events if e.reason == "AccessDenied"] == [("Warning", "AccessDenied")]
    assert wrong not in str(patch) + str(events) + message
    # Said once: a second reconciliation with the same failure posts no second Event.
    again, events = status_update(patch, 1, observed(run, memory), "2026-12-07T00:00:10Z")
    assert not [e for e in events if e.reason == "AccessDenied"]


def test_a_missing_object_is_not_found_and_an_endpoint_that_does_not_answer_fails_the_run(s3_server: S3, tmp_path):
    bucket = s3_server.bucket("models-empty")
    missing = f"s3://{bucket}/nothing-here"
    code, message = initializer_message(tmp_path / "a", missing, s3_server.env())
    assert code == SOURCES_EXIT_CODE
    failure = sources_failure(pod("p", "trainer", containers=[terminated("pytorch", code, message)]))
    assert failure is not None and failure.reason == "NotFound" and failure.uri == missing

    closed = "http://127.0.0.1:9"  # discard: nothing listens
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": closed}
    code, message = initializer_message(tmp_path / "b", f"s3://{bucket}/m", env, wait_s=2.0)
    assert code == SOURCES_EXIT_CODE
    memory = RunMemory()
    trainer = pod("teacher-run-master-0", "trainer", containers=[terminated("pytorch", code, message)])
    Observation(None, memory).pod_changed(trainer)
    run = parse_run(teacher(model=f"s3://{bucket}/m", storage={**STORAGE, "endpoint": closed}))
    outcome = observed(run, memory)
    sources = by_type(outcome)["SourcesReady"]
    assert sources["reason"] == "Unreachable" and "127.0.0.1:9" in sources["message"]
    assert outcome.phase == "Failed"
    patch, events = status_update({"phase": "Pending"}, 1, outcome, "2026-12-07T00:00:00Z")
    (failed,) = [e for e in events if e.reason == "Failed"]
    assert "127.0.0.1:9" in failed.message  # the transition names the endpoint, not the job's words


def test_sources_ready_once_training_reports_and_only_for_runs_with_remote_sources():
    run = parse_run(teacher(model="s3://models/tiny", storage=STORAGE))
    memory = RunMemory()
    waiting = by_type(observed(run, memory))["SourcesReady"]
    assert (waiting["status"], waiting["reason"]) == ("False", "Fetching") and "s3://models/tiny" in waiting["message"]
    ready = by_type(observed(run, memory, phase="Running", progress={"step": 1}))["SourcesReady"]
    assert (ready["status"], ready["reason"]) == ("True", "Fetched")
    local = parse_run(teacher(model="builtin://tiny-llama", student={"model": "builtin://tiny-llama"}))
    assert "SourcesReady" not in by_type(observed(local, memory))
    assert "Exported" not in by_type(observed(local, memory))


def test_exported_from_the_finished_trainer_and_a_failed_export_from_its_pod():
    run = parse_run(teacher(output={"uri": "s3://out/teacher-run"}))
    memory = RunMemory()
    pending = by_type(observed(run, memory))["Exported"]
    assert (pending["status"], pending["reason"]) == ("False", "Pending")
    error = {"reason": "NotFound", "message": "s3://out/teacher-run: bucket 'out' does not exist"}
    failed = result_message(3, 0.5, export_error=error)
    trainer = pod("teacher-run-master-0", "trainer", containers=[terminated("pytorch", SOURCES_EXIT_CODE, failed)])
    assert export_failure(trainer, "pytorch").reason == "NotFound"
    Observation(None, memory).pod_changed(trainer)
    outcome = observed(run, memory, phase="Running")
    exported = by_type(outcome)["Exported"]
    assert (exported["status"], exported["reason"]) == ("False", "NotFound") and "bucket 'out'" in exported["message"]
    # Retried and done: the finished trainer's result carries the export, which becomes .status.output.
    output = {"uri": "s3://out/teacher-run", "files": 9, "bytes": 123456}
    done = Outcome(phase="Succeeded", conditions=[], output=output)
    Observation(None, memory).observe_export(run, {}, done)
    assert by_type(done)["Exported"]["status"] == "True" and "9 files" in by_type(done)["Exported"]["message"]
    patch, _ = status_update({}, 1, done, "2026-12-07T00:00:00Z")
    assert patch["output"] == output


def test_no_credentials_at_all_is_access_denied_naming_the_secret_to_set(s3_server: S3, tmp_path):
    bucket = s3_server.bucket("models-unsigned")
    env = {k: v for k, v in s3_server.env().items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    isolated = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    code, message = initializer_message(tmp_path, f"s3://{bucket}/m", {**env, **isolated})
    failure = sources_failure(pod("p", "rollout", init=[terminated("initializer", code, message)]))
    assert code == SOURCES_EXIT_CODE and failure is not None
    assert failure.reason == "AccessDenied" and "spec.storage.secretRef" in failure.message
