"""The step watchdog (atlas_core.training.watchdog) with real stalls, in real processes.

A training process whose reward function blocks forever, and a wait on a server that stops answering: each
process must end by itself within its limit, with every thread's stack, a one-line reason naming what it was
waiting for, and the watchdog's exit code. (Restarting and resuming under the real controllers:
tests/kube/test_runs.py.)
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from atlas_contract.names import ENV_RESULT_FILE, WATCHDOG_EXIT_CODE
from harness.env import free_port

pytestmark = [pytest.mark.serial, pytest.mark.timeout(300)]  # real stalls, timed: the serial lane (tests/conftest.py)

STALLED_TRAINING = textwrap.dedent(
    """
    import sys, threading
    from datasets import Dataset
    from atlas_core.tasks.arithmetic import make_arithmetic_dataset
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    calls = []

    def blocks_on_the_third_step(completions, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            print("the reward function blocks now", flush=True)
            threading.Event().wait()  # forever: a judge that never answers, a deadlocked client
        return [1.0] * len(completions)

    args = GRPOConfig(
        output_dir=sys.argv[1], model_name_or_path=sys.argv[2], max_steps=20, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, learning_rate=1e-4, logging_steps=1, report_to=[],
        save_strategy="no", disable_tqdm=True, gradient_checkpointing=False,
        step_timeout_seconds=float(sys.argv[3]), first_step_timeout_seconds=120.0,
    )
    trainer = GRPOTrainer(
        reward_funcs=[blocks_on_the_third_step], args=args,
        train_dataset=Dataset.from_list(make_arithmetic_dataset(64, seed=0)),
    )
    trainer.train()
    print("training finished: the watchdog did not fire", flush=True)
    """
)


def test_a_blocked_reward_function_ends_the_process_with_stacks_and_a_reason(tmp_path, tiny_model_dir):
    limit = 4.0
    result_file = tmp_path / "termination-log"
    env = {**os.environ, ENV_RESULT_FILE: str(result_file)}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", STALLED_TRAINING, str(tmp_path / "out"), str(tiny_model_dir), str(limit)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == WATCHDOG_EXIT_CODE, output[-3000:]
    assert "the reward function blocks now" in proc.stdout
    # Every thread's stack (faulthandler), the blocked frame among them, then the reason as the last line.
    assert "Thread 0x" in proc.stderr and "blocks_on_the_third_step" in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("atlas watchdog: no optimizer step completed in "), last
    assert "after step 2" in last and f"limit {limit:g} s" in last
    assert "the reward functions (blocks_on_the_third_step)" in last, last
    # The same reason is the container's termination message (what `kubectl describe pod` shows).
    assert result_file.read_text() == last
    assert time.monotonic() - started < 200


class _Server(http.server.BaseHTTPRequestHandler):
    """/health answers 200 until the test stops it; then requests are accepted and never answered."""

    stalled = threading.Event()
    release = threading.Event()

    def do_GET(self):
        if self.stalled.is_set():
            self.release.wait(60)  # a server that stopped answering (a hung vLLM)
            return
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def health_server(stalled: bool) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A running _Server on a free port (answering, or already stalled) and its base URL."""
    port = free_port()
    (_Server.stalled.set if stalled else _Server.stalled.clear)()
    _Server.release.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{port}"


WAIT_TWICE = textwrap.dedent(
    """
    import sys, time
    from atlas_core.training.watchdog import wait_for_server

    url, limit = sys.argv[1], float(sys.argv[2])
    wait_for_server(url, limit, poll_s=0.2)
    print("first wait: the server answered", flush=True)
    while not __import__("os").path.exists(sys.argv[3]):
        time.sleep(0.05)
    wait_for_server(url, limit, poll_s=0.2)
    print("second wait returned: no watchdog", flush=True)
    """
)


def test_an_unreachable_rollout_server_ends_the_process_naming_its_url(tmp_path):
    """The health check generation makes first (GRPOTrainer._generate with vllm_mode server): a server that
    stops answering ends the process within its limit, naming the URL, instead of a hang."""
    server, base = health_server(stalled=False)
    url = f"{base}/health"
    go = tmp_path / "stall-now"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", WAIT_TWICE, url, "2", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = proc.stdout.readline()
        assert first.startswith("first wait: the server answered"), first
        _Server.stalled.set()
        stalled_at = time.monotonic()
        go.write_text("")
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - stalled_at
    finally:
        _Server.release.set()
        server.shutdown()
    assert proc.returncode == WATCHDOG_EXIT_CODE, out + err
    assert "second wait returned" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"atlas watchdog: the server at {url} did not answer for 2 s"), last
    assert took < 30, took  # its limit (2 s) plus one request's timeout, not a hang


GENERATE_WITH_A_SILENT_SERVER = textwrap.dedent(
    """
    import sys
    from datasets import Dataset
    from atlas_core.tasks.arithmetic import make_arithmetic_dataset
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    args = GRPOConfig(
        output_dir=sys.argv[1], model_name_or_path=sys.argv[2], max_steps=2, per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, report_to=[], save_strategy="no", disable_tqdm=True,
        server_timeout_seconds=2.0, step_timeout_seconds=600.0,
    )
    trainer = GRPOTrainer(
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)], args=args,
        train_dataset=Dataset.from_list(make_arithmetic_dataset(16, seed=0)),
    )
    # As vllm_mode server would have it (TRL's own server client needs vLLM, absent on CPU): the trainer's
    # generation step checks the server first.
    args.use_vllm, args.vllm_mode, args.vllm_server_base_url = True, "server", sys.argv[3]
    trainer._generate([[{"role": "user", "content": "1+1?"}]])
    print("generation returned: no watchdog", flush=True)
    """
)


def test_the_trainers_generation_checks_its_rollout_server_first(tmp_path, tiny_model_dir):
    """GRPOTrainer._generate (and so TeacherGRPOTrainer's) with a rollout server that accepts connections and never
    answers: the process ends within server_timeout_seconds, naming the URL, instead of hanging in TRL's client."""
    server, base = health_server(stalled=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", GENERATE_WITH_A_SILENT_SERVER, str(tmp_path / "out"), str(tiny_model_dir), base],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        _Server.release.set()
        server.shutdown()
    assert proc.returncode == WATCHDOG_EXIT_CODE, (proc.stdout + proc.stderr)[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"atlas watchdog: the server at {base}/health did not answer for 2 s"), last


def test_rollout_server_url_follows_the_trainer_config():
    from types import SimpleNamespace

    from atlas_core.training.watchdog import rollout_server_url

    server = {"use_vllm": True, "vllm_mode": "server", "vllm_server_host": "h", "vllm_server_port": 8000}
    assert rollout_server_url(SimpleNamespace(**server, vllm_server_base_url="http://r:8000/")) == "http://r:8000"
    assert rollout_server_url(SimpleNamespace(**server, vllm_server_base_url=None)) == "http://h:8000"
    assert rollout_server_url(SimpleNamespace(**{**server, "vllm_mode": "colocate"})) is None
    assert rollout_server_url(SimpleNamespace(use_vllm=False)) is None


def test_watchdog_settings_are_checked_and_documented():
    from atlas_core.training.algorithms.grpo_config import GRPOConfig
    from atlas_core.training.algorithms.sft import SFTConfig
    from atlas_core.training.watchdog import StepWatchdog, watchdog_callbacks

    for config in (GRPOConfig, SFTConfig):
        with pytest.raises(ValueError, match="step_timeout_seconds"):
            config(output_dir="/tmp/x", step_timeout_seconds=-1, report_to=[])
        assert watchdog_callbacks(config(output_dir="/tmp/x", report_to=[])) == []  # off unless set
        (watchdog,) = watchdog_callbacks(config(output_dir="/tmp/x", step_timeout_seconds=60, report_to=[]))
        assert isinstance(watchdog, StepWatchdog)
        assert (watchdog.step_timeout_s, watchdog.first_step_timeout_s) == (60, 3600)  # at least an hour first
        (watchdog,) = watchdog_callbacks(
            config(output_dir="/tmp/x", step_timeout_seconds=2000, first_step_timeout_seconds=9, report_to=[])
        )
        assert (watchdog.step_timeout_s, watchdog.first_step_timeout_s) == (2000, 9)


def test_a_step_timeout_of_0_is_off_and_a_first_step_allowance_of_0_is_no_limit():
    """stepTimeoutSeconds 0 = off: no watchdog and no rollout-server check that could end the process;
    first_step_timeout_seconds 0 = no limit on the first step (not "the default"), unset = the default."""
    from types import SimpleNamespace

    from atlas_contract import defaults
    from atlas_core.training.watchdog import StepWatchdog, first_step_timeout, server_check_timeout

    assert server_check_timeout(SimpleNamespace(step_timeout_seconds=0.0, server_timeout_seconds=300.0)) is None
    assert server_check_timeout(SimpleNamespace(step_timeout_seconds=60.0, server_timeout_seconds=300.0)) == 300.0
    assert first_step_timeout(1800.0, None) == defaults.first_step_timeout(1800.0)
    assert first_step_timeout(1800.0, 0.0) == 0.0
    watchdog = StepWatchdog(10.0, first_step_timeout(10.0, 0.0), on_stall=lambda reason: None)
    long_after = watchdog.last_progress + 1e6
    assert watchdog.stalled(long_after) is None  # the first step: no limit
    watchdog.on_step_end(None, SimpleNamespace(global_step=1), None)
    assert "after step 1; limit 10 s" in watchdog.stalled(watchdog.last_progress + 11)
