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
from atlas_contract.stops import StopReport, parse_stop_report
from tests.support.manifests import training

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
    command = launch_command(parse_run(training(resources={"nodes": 2, "gpusPerNode": 8})))

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
    ],
    ids=["stop", "watchdog", "crash", "other-code", "success", "later-line", "not-at-line-start"],
)
def test_the_exit_code_follows_the_termination_message(launch, message, code, expected):
    start, _ = launch
    proc, _ = start("message", message, code)
    assert proc.wait(timeout=20) == expected
