"""teaching_step batched (one generate call per phase) vs the per-prompt loop of the reference's pseudo-code.

Tiny teacher and student (the offline tiny model, local), a batch of 16 arithmetic prompts. Both
variants run the same phases with the same budgets: probe + baseline answers, teacher guidance,
guided answers, teaching reward. Rounds alternate the order; prints the median time of each and
the speed-up (target >= 3x).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/teaching_step.py [--rounds 3] [--batch 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import transformers  # noqa: E402
from datasets import Dataset  # noqa: E402

from atlas_contract.teaching import TeachingSettings  # noqa: E402
from atlas_core.models.tiny import build_tiny_model  # noqa: E402
from atlas_core.tasks.arithmetic import make_arithmetic_dataset  # noqa: E402
from atlas_core.training.algorithms.grpo_config import GRPOConfig  # noqa: E402
from atlas_core.training.algorithms.teacher_trainers import TeacherGRPOTrainer  # noqa: E402


def per_prompt_loop(trainer: TeacherGRPOTrainer, batch: dict) -> list[float]:
    """The reference's pseudo-code: every phase prompt by prompt."""
    args = TeachingSettings.of(trainer.args)  # the config's teaching fields, typed (they are generated at run time)
    diagnostics = [
        trainer.diagnostic_probe(p, args.max_probe_tokens, ground_truth=gt)
        for p, gt in zip(batch["prompts"], batch["ground_truth"], strict=True)
    ]
    guidances = [
        trainer.generate_guidance(p, d, args.max_guidance_tokens)
        for p, d in zip(batch["prompts"], diagnostics, strict=True)
    ]
    rewards = []
    for p, gt, d, g in zip(batch["prompts"], batch["ground_truth"], diagnostics, guidances, strict=True):
        reward, _ = trainer.teaching_rewards([p], [{"ground_truth": gt}], [d.baseline_score], [g])
        rewards.extend(reward)
    return rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    opts = parser.parse_args()
    transformers.logging.set_verbosity_error()

    model = str(build_tiny_model())
    rows = make_arithmetic_dataset(opts.batch, seed=7)
    batch = {"prompts": [r["prompt"][0]["content"] for r in rows], "ground_truth": [r["ground_truth"] for r in rows]}
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-teaching-"),
        model_name_or_path=model,
        per_device_train_batch_size=4,
        num_generations=4,
        report_to=[],
        max_probe_tokens=32,
        max_guidance_tokens=64,
        student_max_tokens=32,
        student_samples=2,
        seed=0,
    )
    trainer = TeacherGRPOTrainer(
        args=args, train_dataset=Dataset.from_list(make_arithmetic_dataset(32)), student_model=model
    )
    trainer.teaching_step({k: v[:2] for k, v in batch.items()})  # warm-up

    times: dict[str, list[float]] = {"batched": [], "per-prompt": []}
    for round_index in range(opts.rounds):
        order = ("batched", "per-prompt") if round_index % 2 == 0 else ("per-prompt", "batched")
        for kind in order:
            started = time.perf_counter()
            rewards = trainer.teaching_step(batch) if kind == "batched" else per_prompt_loop(trainer, batch)
            times[kind].append(time.perf_counter() - started)
            assert len(rewards) == opts.batch
        print(
            f"round {round_index + 1}: batched {times['batched'][-1]:.2f} s, per-prompt {times['per-prompt'][-1]:.2f} s"
        )

    batched, looped = statistics.median(times["batched"]), statistics.median(times["per-prompt"])
    print(f"\nbatch of {opts.batch} prompts, {args.student_samples} student samples, tiny teacher and student (CPU)")
    print(f"per-prompt loop (reference pseudo-code): {looped:6.2f} s")
    print(f"teaching_step, batched phases:           {batched:6.2f} s")
    print(f"speed-up: {looped / batched:.1f}x  (target >= 3x)")


if __name__ == "__main__":
    main()
