"""The trainer container's launch script (atlas_operator.render.trainer.launch_command), run by bash with a stand-in
for ``accelerate`` on PATH: SIGTERM reaches the launcher, and the container's exit code says what the termination
message says (a stop on SIGTERM after a save: 143; the step watchdog: 75; anything else: the launcher's own)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from atlas_operator.render.trainer import launch_command
from atlas_operator.validation import parse_run

from atlas_contract.names import STOP_EXIT_CODE, WATCHDOG_EXIT_CODE
from atlas_contract.results import result_message
from atlas_contract.stops import StopReport, parse_stop_report
from harness.manifests import training

# The stand-in for `accelerate launch`: what torch elastic's launcher does, in each case, seen from outside: it exits 1
# whatever its workers' codes were; on SIGTERM it passes the signal on and exits once they are done.
STANDIN = """#!/bin/bash
case "$STANDIN_MODE" in
  stop-on-term)  # every rank saves at the step in flight, node 0 writes the report, the launcher reports 1
    trap 'printf "%s\\n" "$STANDIN_MESSAGE" > "$ATLAS_RESULT_FILE"; exit 1' TERM
    touch "$STANDIN_READY"
    while true; do sleep 0.05; done ;;
  killed-on-term)  # SIGTERM, no save: nothing written
    trap 'exit 1' TERM
    touch "$STANDIN_READY"
    while true; do sleep 0.05; done ;;
  message)  # exits at once with this message written
    printf "%s\\n" "$STANDIN_MESSAGE" > "$ATLAS_RESULT_FILE"
    exit "$STANDIN_CODE" ;;
esac
exit 2
"""
REPORT = StopReport(step=120, seconds=41.5).message()
EXPORT_FAILED = result_message(4, 0.5, export_error={"reason": "NotFound", "message": "s3://out/x: no bucket 'out'"})


@pytest.fixture
def launch(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "accelerate"
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    result_file = tmp_path / "termination-log"
    result_file.write_text("")
    ready = tmp_path / "ready"
    # A builtin model: nothing to fetch, the launcher is the first step (the fetch step: the tests below).
    command = launch_command(
        parse_run(training(model="builtin://tiny-llama", resources={"nodes": 2, "gpusPerNode": 8}))
    )

    def start(mode: str, message: str = "", code: int = 1) -> tuple[subprocess.Popen, Path]:
        env = {
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "ATLAS_RESULT_FILE": str(result_file),
            "PET_NNODES": "2",
            "PET_NODE_RANK": "0",
            "PET_NPROC_PER_NODE": "8",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "23456",
            "STANDIN_MODE": mode,
            "STANDIN_MESSAGE": message,
            "STANDIN_CODE": str(code),
            "STANDIN_READY": str(ready),
        }
        return subprocess.Popen(command, env=env), ready

    return start, result_file


def _terminate_when_ready(proc: subprocess.Popen, ready: Path) -> int:
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the launcher did not start"
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # what the kubelet sends the container's first process
    return proc.wait(timeout=20)


def test_sigterm_reaches_the_launcher_and_a_saved_stop_exits_with_the_stop_code(launch):
    start, result_file = launch
    proc, ready = start("stop-on-term", REPORT)
    assert _terminate_when_ready(proc, ready) == STOP_EXIT_CODE
    assert parse_stop_report(result_file.read_text()) == StopReport(120, 41.5)  # what the operator reads


def test_sigterm_without_a_saved_checkpoint_keeps_the_launchers_code(launch):
    start, _ = launch
    proc, ready = start("killed-on-term")
    assert _terminate_when_ready(proc, ready) == 1


@pytest.mark.parametrize(
    ("message", "code", "expected"),
    [
        (REPORT, 1, STOP_EXIT_CODE),  # torch elastic reports a worker's 143 as 1
        ("atlas watchdog: no optimizer step in 1800 s", 1, WATCHDOG_EXIT_CODE),  # kept
        ("Traceback (most recent call last): ...", 1, 1),  # a crash stays a crash
        ("", 3, 3),
        (REPORT, 0, 0),  # a launcher that succeeded is a success, whatever the file says
        (f"some words before\n{REPORT}", 1, STOP_EXIT_CODE),  # the mark starts a line, not necessarily the first
        (f"the trainer said: {REPORT}", 1, 1),  # … but must start one
        (EXPORT_FAILED, 1, 69),  # torch elastic reports rank 0's SOURCES_EXIT_CODE as 1: the operator reads 69
        (EXPORT_FAILED, 0, 0),
    ],
    ids=["stop", "watchdog", "crash", "other-code", "success", "later-line", "not-at-line-start", "export", "exported"],
)
def test_the_exit_code_follows_the_termination_message(launch, message, code, expected):
    start, _ = launch
    proc, _ = start("message", message, code)
    assert proc.wait(timeout=20) == expected


# The initializer and the export retry, as the stand-in `python` on PATH sees them: it records its arguments and
# exits with STANDIN_PYTHON_CODE, writing STANDIN_MESSAGE to the file after --message-file when it has one.
PYTHON_STANDIN = """#!/bin/bash
echo "$*" >> "$STANDIN_CALLS"
while [ $# -gt 0 ]; do
  if [ "$1" = --message-file ]; then printf "%s" "$STANDIN_MESSAGE" > "$2"; fi
  shift
done
exit "$STANDIN_PYTHON_CODE"
"""


def _run_with_standins(tmp_path: Path, manifest: dict, rank: str, python_code: int, message: str = "") -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("accelerate", STANDIN), ("python", PYTHON_STANDIN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    result_file, calls = tmp_path / "termination-log", tmp_path / "calls"
    result_file.write_text("")
    calls.write_text("")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ATLAS_RESULT_FILE": str(result_file),
        **{"PET_NNODES": "2", "PET_NODE_RANK": rank, "PET_NPROC_PER_NODE": "1", "MASTER_ADDR": "127.0.0.1"},
        **{"MASTER_PORT": "23456", "STANDIN_MODE": "message", "STANDIN_CODE": "0", "STANDIN_MESSAGE": message},
        **{"STANDIN_CALLS": str(calls), "STANDIN_PYTHON_CODE": str(python_code)},
    }
    done = subprocess.run(launch_command(parse_run(manifest)), env=env, timeout=30, check=False)
    return {"code": done.returncode, "calls": calls.read_text().splitlines(), "message": result_file.read_text()}


def test_a_run_with_s3_sources_fetches_them_first_and_a_failed_fetch_ends_the_container_with_its_code(tmp_path):
    from atlas_contract.sources import SOURCES_EXIT_CODE, SOURCES_MARK

    manifest = training(model="s3://models/tiny", resources={"nodes": 2, "gpusPerNode": 8})
    failure = SOURCES_MARK + ' {"reason": "AccessDenied", "uri": "s3://models/tiny", "message": "denied"}'
    failed = _run_with_standins(tmp_path / "failed", manifest, "0", SOURCES_EXIT_CODE, failure)
    assert failed["code"] == SOURCES_EXIT_CODE and failed["message"] == failure
    (call,) = failed["calls"]  # the initializer alone: the launcher never started
    assert call.startswith("-m atlas_core.sources.initializer --config /etc/atlas/run.yaml")
    fetched = _run_with_standins(tmp_path / "fetched", manifest, "1", 0)
    assert fetched["code"] == 0 and len(fetched["calls"]) == 1  # then accelerate (the stand-in) ran and succeeded


def test_a_pending_export_is_retried_alone_on_the_first_node_and_the_others_exit(tmp_path):
    from atlas_contract.sources import EXPORT_PENDING_FILE

    checkpoints = tmp_path / "checkpoints"
    manifest = training(
        model="builtin://tiny-llama",
        output={"uri": "s3://out/grpo-run"},
        checkpoint={"path": str(checkpoints)},
        resources={"nodes": 2, "gpusPerNode": 8},
    )
    (checkpoints / "grpo-run").mkdir(parents=True)
    first = _run_with_standins(tmp_path / "none-pending", manifest, "0", 0, "trained")
    assert first["calls"] == [] and first["message"] == "trained\n"  # nothing pending: the launcher ran
    (checkpoints / "grpo-run" / EXPORT_PENDING_FILE).write_text("{}")
    rank0 = _run_with_standins(tmp_path / "rank0", manifest, "0", 69)
    assert rank0["code"] == 69 and rank0["calls"] == ["-m atlas_core.cli.export --config /etc/atlas/run.yaml"]
    assert rank0["message"] == ""  # the launcher (whose stand-in writes the message) never ran
    rank1 = _run_with_standins(tmp_path / "rank1", manifest, "1", 0)
    assert rank1["code"] == 0 and rank1["calls"] == [] and rank1["message"] == ""
