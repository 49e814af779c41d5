"""``atlas demo``: the whole pipeline on the offline tiny model, on CPU, in minutes.

Stages run through the same run configurations and runner as ``python -m atlas_core.cli.train``, on the
bundled teaching task ``builtin://multistep`` (:mod:`atlas_core.tasks.multistep`):
1. ``sft`` — the student's warm-up: one-step sums alone, two-step sums only with their first step given;
2. ``grpo`` — GRPO (recipe ``tiny_grpo`` on the warmed-up model, ``builtin://arithmetic``) raises the
   exact-match reward on sums it was not warmed up on (those with a 0);
3. ``teacher-sft`` — a teacher warm-up on (task, probe, guidance) demonstrations of mixed quality;
4. ``teacher`` — teacher GRPO (recipe ``tiny_teacher``): the warmed-up teacher guides the frozen
   stage-1 student and is rewarded by the student's improvement (the teaching reward);
5. ``eval`` — ATLAS's two-pass evaluation (:mod:`atlas_core.evaluation`) on held-out problems: the
   student alone, with the SFT-only teacher and with the GRPO-trained teacher.

Leaves in the output folder: one folder per stage (checkpoints, final model; ``eval/sft-teacher`` and
``eval/grpo-teacher`` with ``eval.json`` and ``problems.jsonl``), ``metrics.jsonl`` (every logged step,
tagged with its stage) and ``curves.png``; prints a live progress bar and two summary tables; serves
Prometheus on 127.0.0.1 while it runs.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from transformers import TrainerCallback

from atlas_contract.names import METRICS_LOG_FILE, STOP_EXIT_CODE, TRAINER_METRICS_PORT
from atlas_core.cli import display
from atlas_core.cli.demo_options import DEMO_SEED, DemoSize
from atlas_core.cli.display import points, quiet_libraries

METRICS_FILE = METRICS_LOG_FILE
CURVES_FILE = "curves.png"
#: The two teachers the evaluation compares: (label, stage whose model it is, folder under eval/).
EVAL_TEACHERS = (("SFT-only teacher", "teacher-sft", "sft-teacher"), ("GRPO teacher", "teacher", "grpo-teacher"))
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
    (
        "sft",
        "tiny_sft",
        [
            "dataset.source=builtin://multistep",
            "dataset.num_samples=12000",
            "trainer.per_device_train_batch_size=32",
        ],
    ),
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
    (
        "teacher-sft",
        "tiny_sft",
        ["model={output}/sft", "dataset.source=builtin://teacher-multistep", "dataset.num_samples=8000"],
    ),
    (
        "teacher",
        "tiny_teacher",
        [
            "model={output}/teacher-sft",
            "student={output}/sft",
            "dataset.source=builtin://multistep",
            "dataset.num_samples=4096",
            "trainer.per_device_train_batch_size=16",
            "trainer.max_completion_length=40",
            "trainer.learning_rate=5e-4",
            # a greedy student: the reward measures the guidance, not the student's sampling noise
            "trainer.student_temperature=0.0",
            "trainer.student_samples=1",
        ],
    ),
)


def _stage_overrides(recipe: str, extra: list[str], stage: str, output: Path, steps: int, metrics_port: int, seed: int):
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
        f"trainer.seed={seed}",  # sampling, shuffling; the teaching evaluation's sampling follows it
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


def evaluate_teachers(output: Path, teacher_args, problems: int, progress: Progress | None = None):
    """The two-pass evaluation of both teachers on the held-out split, with the student and the protocol
    settings the teacher was trained with (greedy student: see STAGES); returns {label: TeachingEvaluation}."""
    from atlas_contract.teaching import TeachingSettings
    from atlas_core.evaluation import GuidanceMeter, evaluate_teaching
    from atlas_core.tasks.multistep import make_multistep_dataset
    from atlas_core.teaching.student import LocalStudent
    from atlas_core.training.finish import evaluation_settings

    student = LocalStudent(str(output / "sft"))
    rows = make_multistep_dataset(problems, "test")
    teaching = TeachingSettings.of(teacher_args)  # the settings the teacher stage trained with
    settings = evaluation_settings(teaching, teacher_args, samples=teaching.student_samples)
    task = progress.add_task("eval", total=problems * len(EVAL_TEACHERS), info="") if progress else None

    def advance(teachers_done: int) -> Callable[[int, int], None] | None:
        """The progress bar's update while the next teacher is evaluated (None without a bar)."""
        if not progress or task is None:
            return None
        bar, bar_task = progress, task
        return lambda done, total: bar.update(bar_task, completed=teachers_done * problems + done)

    reports = {}
    for i, (label, stage, folder) in enumerate(EVAL_TEACHERS):
        teacher = LocalStudent(str(output / stage), role="teacher")
        target = output / "eval" / folder
        for stale in target.glob("*"):  # a new demo run evaluates new models
            stale.unlink()
        reports[label] = evaluate_teaching(
            teacher,
            student,
            rows,
            settings,
            output_dir=target,
            meter=GuidanceMeter(teacher.tokenizer),
            on_progress=advance(i),
            names={
                "teacher": str(output / stage),
                "student": str(output / "sft"),
                "dataset": "builtin://multistep",
                "split": "test",
            },
        )
    return reports


def _evaluation_table(reports: dict) -> Table:
    first = next(iter(reports.values()))
    table = Table(title=f"teaching evaluation: {first.problems} held-out problems (builtin://multistep, test split)")
    for column in ("student", "accuracy", "delta (points, 95% CI)", "non-degradation", "guidance tokens"):
        table.add_column(column)
    table.add_column("teaching reward")
    table.add_row("alone", f"{first.student_accuracy:.1%}", "", "", "", "")
    for label, r in reports.items():
        table.add_row(
            f"+ {label}",
            f"{r.guided_accuracy:.1%}",
            f"{points(r.accuracy_delta)} [{points(r.accuracy_delta_low)}, {points(r.accuracy_delta_high)}]",
            f"{r.non_degradation_rate:.1%}",
            f"{r.guidance_tokens_mean:.1f}",
            f"{r.teaching_reward_mean:.3f}",
        )
    return table


def plot_curves(records: list[dict], path: Path, reports: dict | None = None) -> None:
    """Reward and KL of the GRPO and teacher stages against the step, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4 if reports else 3, figsize=(20 if reports else 15, 4))
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
    if reports:
        first = next(iter(reports.values()))
        labels = ["alone", *reports]
        values = [first.student_accuracy, *(r.guided_accuracy for r in reports.values())]
        bars = axes[3].bar(labels, [100 * v for v in values], color=["tab:gray", "tab:orange", "tab:green"])
        axes[3].bar_label(bars, fmt="%.1f%%")
        axes[3].set(title=f"student accuracy, {first.problems} held-out problems", ylabel="%", ylim=(0, 100))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_demo(
    output: Path, size: DemoSize | None = None, metrics_port: int = TRAINER_METRICS_PORT, seed: int = DEMO_SEED
) -> int:
    size = size or DemoSize()
    from atlas_contract.errors import InvalidFields
    from atlas_core.cli.train import report_problems
    from atlas_core.models.tiny import build_tiny_model
    from atlas_core.telemetry.metrics import stop_metrics_servers
    from atlas_core.training.callbacks import JsonlMetricsCallback
    from atlas_core.training.load_config import load_run_config, parse_run_config, validate_run_config
    from atlas_core.training.runner import run_training

    quiet_libraries(hide_warnings=True)
    console = display.console()
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
            steps_of = {
                "sft": size.sft_steps,
                "grpo": size.grpo_steps,
                "teacher-sft": size.teacher_sft_steps,
                "teacher": size.teacher_steps,
            }
            for stage, recipe, extra in STAGES:
                steps = steps_of[stage]
                cfg = load_run_config(_stage_overrides(recipe, extra, stage, output, steps, metrics_port, seed))
                problems = validate_run_config(cfg)
                if problems:
                    raise InvalidFields(problems)
                started = time.perf_counter()
                callbacks = [
                    _ProgressCallback(progress, stage, steps),
                    JsonlMetricsCallback(metrics_path, extra={"stage": stage}),
                ]
                result = run_training(parse_run_config(cfg), callbacks=callbacks, quiet=True)
                if result.stopped is not None:  # SIGTERM: the stage saved its step; the demo ends there
                    console.print(result.stopped.message())
                    return STOP_EXIT_CODE
                summaries.append(_summarise(stage, result.log_history, time.perf_counter() - started))
            started = time.perf_counter()
            reports = evaluate_teachers(output, result.args, size.eval_problems, progress=progress)
            summaries.append(StageSummary("eval", 0, time.perf_counter() - started, None, None, None, None))
    except InvalidFields as exc:
        report_problems(exc.problems)
        return 2
    finally:
        stop_metrics_servers()

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    plot_curves(records, output / CURVES_FILE, reports)
    console.print(_summary_table(summaries))
    console.print(_evaluation_table(reports))
    console.print(f"metrics: {metrics_path}   curves: {output / CURVES_FILE}")
    return 0
