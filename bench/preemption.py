"""What a stop on SIGTERM costs and saves: a 2-node ZeRO-2 run on this machine (two launchers, as two pods).

For each round: the run trains with ``saveSteps`` far apart; SIGTERM goes to every trainer process after a few
steps (a Kueue preemption or a drain reaches them all); the script measures the time from the signal to the last
process's exit, reads the stop report (the step saved, the seconds from the signal to the saved checkpoint), and
restarts the run, which must train each remaining step exactly once. Printed per round: the step in flight when the
signal came, the step saved, the steps a stop would have lost before #32 (back to the last scheduled checkpoint)
and loses now, and the two times. A last round sends SIGKILL in the middle of the stop's save and shows the
restart falling back to the previous complete checkpoint.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.preemption [--rounds 3] [--save-steps 50] [--signal-after 4]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atlas_cluster.node import descendants
from atlas_contract.names import CHECKPOINT_PREFIX, CHECKPOINT_STAGING_DIR
from atlas_contract.stops import parse_stop_report
from harness.env import free_port
from harness.polling import wait_for

REPO = Path(__file__).resolve().parent.parent
LAUNCH = (
    "accelerate launch --config_file accelerate/deepspeed_zero2.yaml --mixed_precision no "
    "--num_machines 2 --machine_rank {node} --num_processes 2 --main_process_ip 127.0.0.1 --main_process_port {port} "
    "-m atlas_core.cli.train recipe@_global_=tiny_grpo output_dir={out} trainer.max_steps={steps} "
    "trainer.save_steps={save_steps} trainer.per_device_train_batch_size=4 trainer.metrics_port=0"
)


def start(out: Path, steps: int, save_steps: int, results: Path) -> list[subprocess.Popen]:
    port, procs = free_port(), []
    for node in range(2):
        env = dict(os.environ, HF_HUB_OFFLINE="1", ATLAS_RESULT_FILE=str(results / f"node{node}"))
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        command = LAUNCH.format(node=node, port=port, out=out, steps=steps, save_steps=save_steps)
        procs.append(
            subprocess.Popen(
                ["bash", "-c", command],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return procs


def workers(procs: list[subprocess.Popen]) -> list[int]:
    found = []
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                command = (Path("/proc") / str(pid) / "cmdline").read_bytes()
            except OSError:
                continue
            if b"atlas_core.cli.train" in command and b"accelerate" not in command:
                found.append(pid)
    return found


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def trained(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return [r["step"] for r in map(json.loads, lines) if "loss" in r]


def finish(procs: list[subprocess.Popen], timeout: float = 600) -> list[int]:
    return [proc.wait(timeout) for proc in procs]


def restart_ok(saved: int | None, after: list[int], steps: int, codes_after: list[int]) -> bool:
    """Whether the restart trained each step after the saved one exactly once and every node exited 0. A stop that
    saved nothing (no stop report) is not OK: the stop's save is what a round measures."""
    return saved is not None and after == list(range(saved + 1, steps + 1)) and codes_after == [0, 0]


def stop_round(steps: int, save_steps: int, signal_after: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-preemption-"))
    out = root / "run"
    procs = start(out, steps, save_steps, root)
    wait_for(lambda: len(trained(out)) >= signal_after, 600)
    in_flight = trained(out)[-1] + 1
    pids = workers(procs)
    signalled = time.monotonic()
    signal_all(pids, signal.SIGTERM)
    finish(procs)
    exited = time.monotonic() - signalled
    reports = [parse_stop_report((root / f"node{n}").read_text()) for n in range(2)]
    saved = reports[0].step if reports[0] else None
    before = trained(out)
    restart = start(out, steps, save_steps, root)
    codes_after = finish(restart)
    after = trained(out)[len(before) :]
    return {
        "in_flight": in_flight,
        "saved": saved,
        "lost_before": saved - (saved // save_steps) * save_steps if saved else None,
        "lost_now": max(0, in_flight - saved) if saved else None,  # the log may lag a step behind the signal
        "exit_s": exited,
        "save_s": reports[0].seconds if reports[0] else None,
        "after_ok": restart_ok(saved, after, steps, codes_after),
        "reports_agree": len({r.step if r else None for r in reports}) == 1,
        "trained_before": len(before),
        "trained_after": len(after),
    }


def kill_round(steps: int, save_steps: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-preemption-kill-"))
    out = root / "run"
    procs = start(out, steps, save_steps, root)
    wait_for(lambda: (out / f"{CHECKPOINT_PREFIX}{save_steps}").is_dir() and len(trained(out)) > save_steps, 600)
    signal_all(workers(procs), signal.SIGTERM)
    staging = out / CHECKPOINT_STAGING_DIR
    (written,) = wait_for(lambda: [p for p in staging.glob(f"{CHECKPOINT_PREFIX}*") if any(p.iterdir())], 120, 0.005)
    signal_all([pid for proc in procs for pid in (proc.pid, *descendants(proc.pid))], signal.SIGKILL)
    finish(procs)
    killed = int(written.name.removeprefix(CHECKPOINT_PREFIX))
    published = sorted(int(p.name.removeprefix(CHECKPOINT_PREFIX)) for p in out.glob(f"{CHECKPOINT_PREFIX}*"))
    before = trained(out)
    codes = finish(start(out, steps, save_steps, root))
    after = trained(out)[len(before) :]
    return {
        "killed_save": killed,
        "published": published,
        "resumed_from": max(published),
        "codes": codes,
        "after_ok": after == list(range(max(published) + 1, steps + 1)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=50, help="scheduled checkpoints (none before the signal)")
    parser.add_argument("--signal-after", type=int, default=4, help="trained steps before SIGTERM")
    args = parser.parse_args(argv)
    print(
        "round | step in flight | saved | lost before #32 | lost now | SIGTERM->exit | SIGTERM->saved | "
        "remaining steps each once"
    )
    ok = True
    for round_ in range(args.rounds):
        r = stop_round(args.steps, args.save_steps, args.signal_after)
        ok &= r["after_ok"] and r["saved"] is not None and r["reports_agree"]
        print(
            f"{round_ + 1} | {r['in_flight']} | {r['saved']} | {r['lost_before']} | {r['lost_now']} | "
            f"{r['exit_s']:.1f} s | {r['save_s']:.1f} s | {r['after_ok']} ({r['trained_before']} + "
            f"{r['trained_after']} steps)",
            flush=True,
        )
    k = kill_round(args.steps, 3)
    ok &= k["after_ok"] and k["killed_save"] not in k["published"]
    print(
        f"SIGKILL in the save of checkpoint-{k['killed_save']}: published {k['published']}, resumed from "
        f"checkpoint-{k['resumed_from']}, remaining steps each once: {k['after_ok']}"
    )
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
