"""Overhead of Atlas's GRPOTrainer over TRL's on the same tiny config and seed.

Runs the two trainers in alternating order for several rounds (so machine noise hits both),
times every optimizer step with a callback, and prints the median step-time ratio
(ours / TRL's; target ≤ 1.05) and the tokens/s of each.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/grpo_overhead.py [--rounds 5] [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from transformers.trainer_callback import PrinterCallback  # noqa: E402

from atlas_core.answers import exact_match_reward  # noqa: E402
from atlas_core.models.tiny import build_tiny_model  # noqa: E402
from atlas_core.tasks.arithmetic import make_arithmetic_dataset  # noqa: E402
from atlas_core.training.algorithms.grpo import GRPOTrainer  # noqa: E402
from atlas_core.training.algorithms.grpo_config import GRPOConfig  # noqa: E402

WARMUP_STEPS = 3


class StepTimer(TrainerCallback):
    """Wall time and tokens of every optimizer step."""

    def __init__(self):
        self.times: list[float] = []
        self.tokens: list[float] = []
        self._start = 0.0
        self._seen = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "num_tokens" in logs:
            self.tokens.append(logs["num_tokens"] - self._seen)
            self._seen = logs["num_tokens"]


def run_once(kind: str, model_dir: str, steps: int, seed: int) -> StepTimer:
    fields: dict[str, Any] = dict(
        output_dir=tempfile.mkdtemp(prefix=f"bench-{kind}-"),
        per_device_train_batch_size=16,
        num_generations=4,
        max_completion_length=32,
        max_steps=steps,
        learning_rate=5e-4,
        beta=0.04,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        gradient_checkpointing=False,
        disable_tqdm=True,
        bf16=False,
        seed=seed,
    )
    dataset = Dataset.from_list(make_arithmetic_dataset(steps * 16, seed=seed))
    timer = StepTimer()
    trainer: trl.GRPOTrainer
    if kind == "atlas":
        trainer = GRPOTrainer(
            model=model_dir,
            reward_funcs=exact_match_reward,
            args=GRPOConfig(**fields),
            train_dataset=dataset,
            callbacks=[timer],
        )
    else:
        trainer = trl.GRPOTrainer(
            model=model_dir,
            # TRL only reads the rewards: a list[float] is a list[float | None] to it (mypy's lists are invariant)
            reward_funcs=cast(Callable[..., list[float | None]], exact_match_reward),
            args=trl.GRPOConfig(**fields),
            train_dataset=dataset,
            callbacks=[timer],
        )
    trainer.remove_callback(PrinterCallback)  # keep the output to the figures
    trainer.train()
    return timer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args()
    transformers.logging.set_verbosity_error()
    model_dir = str(build_tiny_model())

    step_times: dict[str, list[float]] = {"atlas": [], "trl": []}
    tokens: dict[str, float] = {"atlas": 0.0, "trl": 0.0}
    seconds: dict[str, float] = {"atlas": 0.0, "trl": 0.0}
    for round_index in range(opts.rounds):
        order = ("atlas", "trl") if round_index % 2 == 0 else ("trl", "atlas")
        for kind in order:
            timer = run_once(kind, model_dir, opts.steps, opts.seed)
            kept = timer.times[WARMUP_STEPS:]
            step_times[kind] += kept
            tokens[kind] += sum(timer.tokens[WARMUP_STEPS:])
            seconds[kind] += sum(kept)
        medians = {kind: statistics.median(times) * 1e3 for kind, times in step_times.items()}
        print(
            f"round {round_index + 1}/{opts.rounds}: median step atlas {medians['atlas']:.1f} ms, "
            f"trl {medians['trl']:.1f} ms",
            flush=True,
        )

    ratio = statistics.median(step_times["atlas"]) / statistics.median(step_times["trl"])
    print()
    print(f"{'trainer':<8} {'median step (ms)':>17} {'tokens/s':>10} {'steps':>6}")
    for kind in ("atlas", "trl"):
        print(
            f"{kind:<8} {statistics.median(step_times[kind]) * 1e3:>17.1f} "
            f"{tokens[kind] / seconds[kind]:>10.0f} {len(step_times[kind]):>6}"
        )
    print(f"\nmedian step-time ratio atlas/trl: {ratio:.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
