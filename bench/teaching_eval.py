"""Does teaching help? The demo's student alone vs with the SFT-only teacher vs with the GRPO-trained teacher.

Runs ``atlas demo`` (all stages, metrics off) into an output folder — or, with ``--reuse``, takes the
models a demo already left there — then evaluates both teachers on the held-out split of
``builtin://multistep`` with the protocol settings the teacher trained with, and prints every figure
side by side with the targets of issue 13:

* the GRPO teacher lifts the student by >= 15.7 points (ATLAS's average) with non-degradation >= 97%;
* the student alone is between 20% and 80%;
* the GRPO teacher's delta beats the SFT-only teacher's;
* the teaching reward of the demo's last 10 teacher-GRPO steps is above 0;
* the stages learn: the GRPO reward of the last 30 steps beats the first 30 by more than 0.05, and the
  teacher's reward of the last 20 steps beats its first 20 (``make test`` runs a small demo, whose
  few steps show the stages work, not that they learn: these are checked here, on the full one).

With ``--seeds N`` the demo runs N times (``atlas demo --seed`` 0 .. N-1: its training stages' sampling and data
order, and the evaluation's sampling; the same held-out problems and the same initial tiny model): float paths
differ between CPU kinds (AVX2 vs AVX-512) and a training that diverges shows up as a seed's figures. Each seed's
figures are printed, then the mean and the minimum over seeds of the targeted ones, and the targets are checked on
the minimum.

Measured here (2 cores, AMD EPYC, ``--seeds 3``; demos of 227, 231 and 230 s): the GRPO teacher +42.5 / +47.0 / +35.5
points (mean +41.7, min +35.5), non-degradation 100% on every seed; the SFT-only teacher +18.0 / +26.0 / +11.5
(non-degradation 100 / 100 / 86%); the student alone 34.5 / 29.0 / 29.5%; every target passes on the minimum. A strong
problem gets no guidance from the GRPO teacher (the warm-up's demonstrations may give none:
atlas_core/tasks/multistep.py), which keeps non-degradation at 100%; before that option the minimum was 96.5%.

    HF_HUB_OFFLINE=1 .venv/bin/python -m bench.teaching_eval [--output DIR] [--reuse] [--problems 200] [--seeds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGET_DELTA = 0.157
TARGET_NON_DEGRADATION = 0.97
ALONE_RANGE = (0.2, 0.8)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="demo folder (default: a temporary one)")
    parser.add_argument("--reuse", action="store_true", help="evaluate the models already in --output")
    parser.add_argument("--problems", type=int, default=None, help="held-out problems (default: the demo's)")
    parser.add_argument("--seeds", type=int, default=1, help="demo runs, seeds 0 .. N-1 (default 1)")
    args = parser.parse_args()
    output = Path(args.output or tempfile.mkdtemp(prefix="atlas-teaching-eval-"))
    if args.seeds == 1:
        return _report([_one_seed(output, 0, args)])
    return _report([_one_seed(output / f"seed-{seed}", seed, args) for seed in range(args.seeds)])


def _one_seed(output: Path, seed: int, args: argparse.Namespace) -> dict:
    """One demo (seed ``seed``) and its figures; prints them with the checks of that seed."""

    from atlas_core.cli.demo import evaluate_teachers, run_demo
    from atlas_core.cli.demo_options import DemoSize
    from atlas_core.cli.display import quiet_libraries
    from atlas_core.evaluation_figures import comparison_lines
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    quiet_libraries()
    started = time.perf_counter()
    if not args.reuse:
        code = run_demo(output, metrics_port=0, seed=seed)
        if code:
            raise SystemExit(code)
    demo_seconds = time.perf_counter() - started
    teacher_args = GRPOConfig(**_trainer_args(output / "teacher"))
    reports = evaluate_teachers(output, teacher_args, args.problems or DemoSize().eval_problems)

    records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    teaching = [r["teaching/reward"] for r in records if r.get("stage") == "teacher" and "teaching/reward" in r]
    last10 = statistics.mean(teaching[-10:]) if teaching else float("nan")
    grpo_rise = _rise([r["reward"] for r in records if r.get("stage") == "grpo" and "reward" in r], 30)
    teacher_rise = _rise([r["reward"] for r in records if r.get("stage") == "teacher" and "reward" in r], 20)
    sft, grpo = reports["SFT-only teacher"], reports["GRPO teacher"]

    print(f"\nseed {seed} — teaching evaluation: {grpo.problems} held-out problems, demo {demo_seconds:.0f} s")
    print("\n".join(comparison_lines(reports)))
    checks = [
        (
            f"GRPO teacher delta >= {100 * TARGET_DELTA:.1f} pts",
            100 * grpo.accuracy_delta,
            grpo.accuracy_delta >= TARGET_DELTA,
        ),
        (
            f"GRPO teacher non-degradation >= {TARGET_NON_DEGRADATION:.0%}",
            grpo.non_degradation_rate,
            grpo.non_degradation_rate >= TARGET_NON_DEGRADATION,
        ),
        (
            "student alone in [20%, 80%]",
            grpo.student_accuracy,
            ALONE_RANGE[0] <= grpo.student_accuracy <= ALONE_RANGE[1],
        ),
        (
            "GRPO delta - SFT-only delta (pts) > 0",
            100 * (grpo.accuracy_delta - sft.accuracy_delta),
            grpo.accuracy_delta > sft.accuracy_delta,
        ),
        ("teaching reward, last 10 GRPO steps > 0", last10, last10 > 0),
        ("GRPO reward, last 30 steps - first 30 > 0.05", grpo_rise, grpo_rise > 0.05),
        ("teacher reward, last 20 steps - first 20 > 0", teacher_rise, teacher_rise > 0),
    ]
    print()
    for name, value, ok in checks:
        print(f"  {'PASS' if ok else 'MISS'}  {name}: {value:.3f}")
    print(f"\nmodels and per-problem records: {output}")
    return {"seed": seed, "checks": checks}


def _report(seeds: list[dict]) -> int:
    """With several seeds: each check's value, mean and minimum over them, the target checked on the minimum
    (every check is "higher is better" except the student-alone range, checked on every seed)."""
    if len(seeds) == 1:
        return 0
    print(f"\nover {len(seeds)} seeds ({', '.join(str(s['seed']) for s in seeds)}): mean / min, target on the minimum")
    for i, (name, _, _) in enumerate(seeds[0]["checks"]):
        values = [s["checks"][i][1] for s in seeds]
        oks = [s["checks"][i][2] for s in seeds]
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(
            f"  {'PASS' if all(oks) else 'MISS'}  {name}: mean {statistics.mean(values):.3f}, min {min(values):.3f}"
            f"  ({shown})"
        )
    return 0


def _rise(rewards: list[float], window: int) -> float:
    """Mean reward of the last ``window`` steps minus that of the first ``window`` (NaN if too few)."""
    if len(rewards) < 2 * window:
        return float("nan")
    return statistics.mean(rewards[-window:]) - statistics.mean(rewards[:window])


def _trainer_args(stage: Path) -> dict:
    """The teaching fields the demo's teacher stage trained with (its saved training arguments)."""
    import torch

    from atlas_contract.teaching import TeachingSettings

    saved = torch.load(stage / "training_args.bin", weights_only=False)
    teaching = TeachingSettings.of(saved).to_dict()
    run = {name: getattr(saved, name) for name in ("seed", "max_completion_length")}
    return {"output_dir": str(stage), "report_to": [], **run, **teaching}


if __name__ == "__main__":
    raise SystemExit(main())
