"""Training time with the tracking server down, against without tracking, in one sitting (python -m bench.tracking).

The same tiny GRPO run (the tiny recipe, builtin://arithmetic, STEPS steps, a log every step, one process each) under
four tracking settings, interleaved over ROUNDS rounds, each round in another order, so that a slow minute of the
machine falls on every setting:

- ``none``: no MLFLOW_TRACKING_URI (no tracking);
- ``up``: a real MLflow server (atlas_cluster/mlflow.py, SQLite) that answers;
- ``refused``: the URI of a port where nothing listens (connection refused at once);
- ``silent``: a port that accepts connections and never answers (every request waits out MLflow's timeout,
  atlas_contract/tracking.py REQUEST_TIMEOUT_S, and its retry).

Measured in each process: the training (``trainer.train()``, from the first step to the last) and its CPU seconds,
the CPU seconds of the tracking thread itself (what tracking takes from training, whatever the machine's noise), and
the wait after training for the tracking server (``finish``'s flush: bounded by the timeouts). Printed: the median of
each over the rounds, each setting's training time as a ratio to ``none``'s median and, paired, the median over the
rounds of its ratio to the same round's ``none`` (a machine whose speed swings by a third from one minute to the next,
as these VMs' do, moves both runs of a round together); the target: ``refused`` and ``silent`` within 1.05×, i.e. 5%.
The tracking thread's CPU share is the direct measure of what tracking takes from training. About 12 minutes on 2
cores; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from atlas_cluster.controlplane import free_port

REPO = Path(__file__).resolve().parents[1]
STEPS = 30
ROUNDS = 5
SETTINGS = ("none", "up", "refused", "silent")

# The training process: one run, its training and tracking times as JSON on its last line.
CHILD = """
import json, resource, sys, time
from atlas_core.training import runner
from atlas_core.training.finish import finish_tracking
from atlas_core.training.load_config import load_run_config, parse_run_config

run = parse_run_config(load_run_config(sys.argv[1:]))
trainer_train = runner.build_trainer
timings = {}

def timed_build(*args, **kwargs):
    trainer = trainer_train(*args, **kwargs)
    train = trainer.train

    def timed_train(*a, **k):
        started, cpu = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        try:
            return train(*a, **k)
        finally:
            timings["train_s"] = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_SELF)
            timings["cpu_s"] = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime

    trainer.train = timed_train
    return trainer

runner.build_trainer = timed_build
done = runner.run_training(run, quiet=True)
timings["thread_cpu_s"] = done.tracking.thread_cpu_s if done.tracking is not None else 0.0
started = time.perf_counter()
finish_tracking(run, done, None, None, None, None)
timings["finish_s"] = time.perf_counter() - started
print(json.dumps(timings))
"""


def commit() -> str:
    done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


class SilentServer:
    """Accepts TCP connections and never answers: a tracking server that hangs."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)


def train(setting: str, uri: str | None, out: Path, steps: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if uri:
        env.update(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="bench-tracking")
    args = [
        "recipe=tiny_grpo",
        f"output_dir={out}",
        f"trainer.max_steps={steps}",
        "trainer.save_strategy=no",
        "trainer.logging_steps=1",
        # Steps of the size a real run's log interval spans at least (~0.5 s on 2 cores): what tracking adds per
        # step is compared with a step, not with the tiny model's 80 ms default.
        "trainer.per_device_train_batch_size=32",
        "trainer.num_generations=8",
        "trainer.max_completion_length=64",
        "trainer.metrics_port=0",
    ]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{setting}: the training failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)

    from atlas_cluster.mlflow import MLflowServer
    from atlas_cluster.processes import Supervisor

    with tempfile.TemporaryDirectory(prefix="atlas-bench-tracking-") as folder:
        root = Path(folder)
        server = MLflowServer(root / "mlflow", Supervisor(root / "mlflow")).start()
        silent = SilentServer()
        uris = {"none": None, "up": server.endpoint, "refused": f"http://127.0.0.1:{free_port()}", "silent": silent.uri}
        measured: dict[str, list[dict]] = {setting: [] for setting in SETTINGS}
        try:
            for round_ in range(args.rounds):
                shift = round_ % len(SETTINGS)  # each round in another order: no setting always after the same one
                order = SETTINGS[shift:] + SETTINGS[:shift]
                for setting in order:
                    out = root / f"{setting}-{round_}"
                    measured[setting].append(train(setting, uris[setting], out, args.steps))
                    print(f"round {round_ + 1}/{args.rounds} {setting}: {measured[setting][-1]}", file=sys.stderr)
        finally:
            server.stop()
    base = statistics.median(m["train_s"] for m in measured["none"])
    print(f"# bench.tracking at {commit()}: {args.steps} steps of tiny GRPO, {args.rounds} rounds, medians")
    header = f"{'setting':<9} {'training s':>10} {'× none':>7} {'paired ×':>9} {'CPU s':>7} {'tracking CPU s':>14}"
    print(f"{header} {'share':>6} {'wait after s':>12}")
    for setting in SETTINGS:
        train_s = statistics.median(m["train_s"] for m in measured[setting])
        # The same round's ratio to none, then the median over rounds: a slow minute of the machine counts once.
        rounds = zip(measured[setting], measured["none"], strict=True)
        paired = statistics.median(m["train_s"] / n["train_s"] for m, n in rounds)
        cpu_s = statistics.median(m["cpu_s"] for m in measured[setting])
        thread_s = statistics.median(m["thread_cpu_s"] for m in measured[setting])
        finish_s = statistics.median(m["finish_s"] for m in measured[setting])
        print(
            f"{setting:<9} {train_s:>10.2f} {train_s / base:>7.3f} {paired:>9.3f} {cpu_s:>7.2f} {thread_s:>14.3f} "
            f"{thread_s / cpu_s:>6.1%} {finish_s:>12.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
