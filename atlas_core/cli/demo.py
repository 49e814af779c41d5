"""``atlas demo``: the whole pipeline on the offline tiny model, on CPU, in minutes.

Stages run through the same run configurations and runner as ``python -m atlas_core.cli.train``:
1. ``sft`` — SFT warm-up (recipe ``tiny_sft``) teaches the answer format; half the tasks come with
   teacher guidance, so the model can later serve as a student that reads guidance;
2. ``grpo`` — GRPO (recipe ``tiny_grpo`` on the warmed-up model) raises the exact-match reward;
3. ``teacher-sft`` — a teacher warm-up on (task, probe, guidance) examples;
4. ``teacher`` — teacher GRPO (recipe ``tiny_teacher``): the warmed-up teacher guides the frozen
   stage-1 student and is rewarded by the student's improvement (the teaching reward).

Leaves in the output folder: one folder per stage (checkpoints, final model), ``metrics.jsonl``
(every logged step, tagged with its stage) and ``curves.png``; prints a live progress bar and a
summary table; serves Prometheus on 127.0.0.1 while it runs.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from transformers import TrainerCallback

from atlas_contract.names import METRICS_LOG_FILE, TRAINER_METRICS_PORT

METRICS_FILE = METRICS_LOG_FILE
CURVES_FILE = "curves.png"
#: Steps averaged at each end of a stage for the "first" and "last" columns of the summary.
SUMMARY_WINDOW = 10


@dataclass
class StageSummary:
    name: str
    steps: int
    seconds: float
    first_reward: float | None
    last_reward: float | None
    last_kl: float | None
    last_loss: float | None


class _ProgressCallback(TrainerCallback):
    """Advances a rich progress bar and shows the latest reward / KL / loss in its description."""

    def __init__(self, progress: Progress, stage: str, total: int):
        self.progress, self.stage = progress, stage
        self.task = progress.add_task(stage, total=total, info="")

    def on_step_end(self, args, state, control, **kwargs):
        self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        shown = [f"{k} {logs[k]:.3f}" for k in ("reward", "kl", "loss") if isinstance(logs.get(k), (int, float))]
        self.progress.update(self.task, info="  ".join(shown))


#: (stage, recipe, overrides) of each stage; {steps} and {output} are filled in.
STAGES = (
    ("sft", "tiny_sft", ["dataset.num_samples=4000", "dataset.guided_fraction=0.5"]),
    (
        "grpo",
        "tiny_grpo",
        [
            "model={output}/sft",
            "dataset.num_samples=8192",
            "trainer.per_device_train_batch_size=32",
            "trainer.learning_rate=5e-4",
        ],
    ),
    ("teacher-sft", "tiny_sft", ["dataset.source=builtin://teacher-arithmetic", "dataset.num_samples=2000"]),
    (
        "teacher",
        "tiny_teacher",
        [
            "model={output}/teacher-sft",
            "student={output}/sft",
            "dataset.num_samples=4096",
            "trainer.per_device_train_batch_size=16",
            "trainer.max_completion_length=48",
            "trainer.learning_rate=5e-4",
        ],
    ),
)


def _stage_overrides(recipe: str, extra: list[str], stage: str, output: Path, steps: int, metrics_port: int):
    return [
        f"recipe={recipe}",
        *(item.format(output=output) for item in extra),
        f"output_dir={output / stage}",
        f"run_name=demo-{stage}",
        f"trainer.max_steps={steps}",
        f"trainer.metrics_port={metrics_port}",
        "trainer.metrics_host=127.0.0.1",
        "trainer.logging_steps=1",
        "trainer.save_steps=50",
        "resume=false",
    ]


def _summarise(stage: str, records: list[dict], seconds: float) -> StageSummary:
    rewards = [r["reward"] for r in records if isinstance(r.get("reward"), (int, float))]
    kls = [r["kl"] for r in records if isinstance(r.get("kl"), (int, float))]
    losses = [r["loss"] for r in records if isinstance(r.get("loss"), (int, float))]
    window = min(SUMMARY_WINDOW, max(1, len(rewards) // 2))
    return StageSummary(
        name=stage,
        steps=max((r["step"] for r in records), default=0),
        seconds=seconds,
        first_reward=statistics.mean(rewards[:window]) if rewards else None,
        last_reward=statistics.mean(rewards[-window:]) if rewards else None,
        last_kl=kls[-1] if kls else None,
        last_loss=losses[-1] if losses else None,
    )


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _summary_table(summaries: list[StageSummary]) -> Table:
    table = Table(title="atlas demo")
    for column in ("stage", "steps", f"reward (first {SUMMARY_WINDOW})", f"reward (last {SUMMARY_WINDOW})"):
        table.add_column(column)
    for column in ("KL (last)", "loss (last)", "wall time"):
        table.add_column(column)
    for s in summaries:
        table.add_row(
            s.name,
            str(s.steps),
            _fmt(s.first_reward),
            _fmt(s.last_reward),
            _fmt(s.last_kl),
            _fmt(s.last_loss),
            f"{s.seconds:.1f} s",
        )
    return table


def plot_curves(records: list[dict], path: Path) -> None:
    """Reward and KL of the GRPO and teacher stages against the step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = (("grpo", "GRPO reward (exact match)"), ("teacher", "teacher GRPO: teaching reward"))
    for ax, (stage, title) in zip(axes, panels, strict=False):
        rows = [r for r in records if r.get("stage") == stage and isinstance(r.get("reward"), (int, float))]
        steps, rewards = [r["step"] for r in rows], [r["reward"] for r in rows]
        ax.plot(steps, rewards, color="tab:blue", alpha=0.4, label="reward")
        if len(rows) >= SUMMARY_WINDOW:
            smooth = [statistics.mean(rewards[max(0, i - SUMMARY_WINDOW + 1) : i + 1]) for i in range(len(rewards))]
            ax.plot(steps, smooth, color="tab:blue", label=f"{SUMMARY_WINDOW}-step mean")
        ax.set(title=title, xlabel="step", ylabel="reward")
        ax.legend()
    for stage, color in (("grpo", "tab:red"), ("teacher", "tab:purple")):
        rows = [r for r in records if r.get("stage") == stage and isinstance(r.get("kl"), (int, float))]
        axes[2].plot([r["step"] for r in rows], [r["kl"] for r in rows], color=color, label=stage)
    axes[2].set(title="KL to the reference model", xlabel="step", ylabel="KL")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _quiet_libraries() -> None:
    """The demo shows its own progress; library warnings and bars would bury it."""
    import warnings

    import datasets
    import transformers

    warnings.filterwarnings("ignore")
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def run_demo(
    output: Path,
    grpo_steps: int = 300,
    sft_steps: int = 300,
    teacher_steps: int = 60,
    metrics_port: int = TRAINER_METRICS_PORT,
) -> int:
    from atlas_core.cli.train import report_problems
    from atlas_core.models.tiny import build_tiny_model
    from atlas_core.telemetry.metrics import stop_metrics_servers
    from atlas_core.training.callbacks import JsonlMetricsCallback
    from atlas_core.training.run_config import RunConfigError, load_run_config, validate_run_config
    from atlas_core.training.runner import run_training

    _quiet_libraries()
    console = Console()
    output.mkdir(parents=True, exist_ok=True)
    metrics_path = output / METRICS_FILE
    metrics_path.unlink(missing_ok=True)
    console.print(f"[bold]atlas demo[/] → {output}  (tiny model built locally, no hub access)")
    build_tiny_model()
    if metrics_port:
        console.print(f"Prometheus: http://127.0.0.1:{metrics_port}/metrics while it runs")

    summaries = []
    columns = (TextColumn("{task.description:>11}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, TextColumn("{task.fields[info]}"), console=console) as progress:
            steps_of = {"sft": sft_steps, "grpo": grpo_steps, "teacher-sft": 200, "teacher": teacher_steps}
            for stage, recipe, extra in STAGES:
                steps = steps_of[stage]
                cfg = load_run_config(_stage_overrides(recipe, extra, stage, output, steps, metrics_port))
                problems = validate_run_config(cfg)
                if problems:
                    raise RunConfigError(problems)
                started = time.perf_counter()
                callbacks = [
                    _ProgressCallback(progress, stage, steps),
                    JsonlMetricsCallback(metrics_path, extra={"stage": stage}),
                ]
                result = run_training(cfg, callbacks=callbacks, quiet=True)
                summaries.append(_summarise(stage, result.log_history, time.perf_counter() - started))
    except RunConfigError as exc:
        report_problems(exc.problems)
        return 2
    finally:
        stop_metrics_servers()

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    plot_curves(records, output / CURVES_FILE)
    console.print(_summary_table(summaries))
    console.print(f"metrics: {metrics_path}   curves: {output / CURVES_FILE}")
    return 0
