"""`atlas eval` at work: the models loaded, the two-pass evaluation run with progress, gauges and the report."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from atlas_contract.names import ENV_KIND, ENV_NAMESPACE, ENV_RUN, EVAL_PROBLEMS_FILE, EVAL_REPORT_FILE
from atlas_core.cli import display
from atlas_core.cli.display import points, quiet_libraries
from atlas_core.cli.eval_options import METRICS_KIND
from atlas_core.cli.eval_plan import Plan, done_before


def _device(name: str) -> str | None:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else None


def load_models(plan: Plan) -> tuple[Any, Any, list[str]]:
    """(teacher, student, problems): each model loaded, or what stopped it, under its option's name."""
    from atlas_core.teaching.student import is_endpoint, load_student

    loaded: dict[str, Any] = {}
    problems = []
    device = _device(plan.device)
    for option, ref in (("--teacher", plan.teacher), ("--student", plan.student)):
        role = option.removeprefix("--")
        if role == "student" and ref == plan.teacher and "teacher" in loaded and not is_endpoint(ref):
            loaded[role] = loaded["teacher"]  # one local model teaching itself: loaded once
            continue
        try:
            loaded[role] = load_student(ref, device=device, role=role)
        except Exception as exc:  # noqa: BLE001 - any loading failure is the user's model, reported by field
            reason = " ".join(str(exc).split()).removeprefix(f"{role}_model: ")[:300]
            if not reason.startswith("cannot load"):
                reason = f"cannot load {ref!r}: {type(exc).__name__}: {reason}"
            problems.append(f"{option}: {reason}")
    return loaded.get("teacher"), loaded.get("student"), problems


def metric_labels(output: Path) -> dict[str, str]:
    """namespace, run, kind of the eval gauges: ``$ATLAS_NAMESPACE`` else local, ``$ATLAS_RUN`` else the output
    folder's name, ``$ATLAS_KIND`` else eval."""
    return {
        "namespace": os.environ.get(ENV_NAMESPACE) or "local",
        "run": os.environ.get(ENV_RUN) or output.resolve().name,
        "kind": os.environ.get(ENV_KIND) or METRICS_KIND,
    }


def set_gauges(figures: Any, labels: dict[str, str]) -> None:
    from atlas_core.telemetry import metrics

    for gauge, value in (
        (metrics.eval_student_accuracy, figures.student_accuracy),
        (metrics.eval_guided_accuracy, figures.guided_accuracy),
        (metrics.eval_accuracy_delta, figures.accuracy_delta),
        (metrics.eval_non_degradation_rate, figures.non_degradation_rate),
    ):
        if value is not None:
            gauge.labels(**labels).set(value)


def _live_gauges(plan: Plan, labels: dict[str, str]) -> None:
    """The gauges from the problems finished so far (``problems.jsonl``), while the evaluation runs."""
    from atlas_core.evaluation_figures import figures

    path = plan.output / EVAL_PROBLEMS_FILE
    if not path.exists():
        return
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    if records:
        set_gauges(figures(records, plan.settings.seed), labels)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _number_text(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def report_table(report: Any, title: str):
    """Every figure (rows) for all problems and each capability band (columns)."""
    from rich.table import Table

    columns = {"all": asdict(report), **{band: asdict(f) for band, f in report.by_capability.items()}}
    table = Table(title=title)
    table.add_column("", no_wrap=True)
    for name in columns:
        table.add_column(name, justify="right")
    rows = (
        ("problems", lambda f: str(f["problems"])),
        ("accuracy alone", lambda f: _percent(f["student_accuracy"])),
        ("accuracy guided", lambda f: _percent(f["guided_accuracy"])),
        (
            "delta, points [95% CI]",
            lambda f: (
                "–"
                if f["accuracy_delta"] is None
                else f"{points(f['accuracy_delta'])} [{points(f['accuracy_delta_low'])}, "
                f"{points(f['accuracy_delta_high'])}]"
            ),
        ),
        ("non-degradation", lambda f: _percent(f["non_degradation_rate"])),
        ("improvement", lambda f: _percent(f["improvement_rate"])),
        (
            "mean degradation, points",
            lambda f: _number_text(None if f["mean_degradation"] is None else 100 * f["mean_degradation"]),
        ),
        ("completion alone", lambda f: _percent(f["completion_rate_alone"])),
        ("completion guided", lambda f: _percent(f["completion_rate_guided"])),
        (f"guidance ({report.token_unit})", lambda f: _number_text(f["guidance_tokens_mean"])),
        ("student tokens alone", lambda f: _number_text(f["student_tokens_alone_mean"])),
        ("student tokens guided", lambda f: _number_text(f["student_tokens_guided_mean"])),
        ("teaching reward", lambda f: _number_text(f["teaching_reward_mean"], 3)),
    )
    for label, shown in rows:
        table.add_row(label, *(shown(f) for f in columns.values()))
    return table


def run(plan: Plan, notes: Sequence[str] = ()) -> int:
    from atlas_core.evaluation import EvaluationError

    err, out = display.console(stderr=True), display.console()
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if plan.metrics_port and not _serve_metrics(plan, err):
        return 2
    _announce(plan, err)
    quiet_libraries()
    teacher, student, problems = load_models(plan)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    done = {"problems": 0}
    kept = plan.output / EVAL_PROBLEMS_FILE
    try:
        report = _evaluate_with_progress(plan, teacher, student, err, done)
    except EvaluationError as exc:
        cause = " ".join(str(exc.__cause__ or exc).split())[:300]
        print(
            f"error: evaluation stopped after {exc.done} of {exc.total} problems ({cause}); the {exc.done} finished "
            f"are kept in {kept}: run the same command again to resume",
            file=sys.stderr,
        )
        return 1
    except ValueError as exc:  # rows that cannot be scored, another evaluation's problems.jsonl
        for line in str(exc).splitlines():
            print(f"error: {'--' + line if line.startswith('output: ') else line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        total = len(plan.rows)
        print(
            f"interrupted: {done['problems']} of {total} problems kept in {kept}: run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    finally:
        for scorer in plan.scorers:
            if hasattr(scorer, "close"):
                scorer.close()
    if plan.metrics_port:
        set_gauges(report, metric_labels(plan.output))
    _print_report(plan, report, out)
    _track(plan, report)
    return 0


def _track(plan: Plan, report: Any) -> None:
    """The table as an MLflow run of its own when MLFLOW_TRACKING_URI is set (atlas_core/training/tracking.py)."""
    from dataclasses import asdict

    from atlas_core.training.tracking import track_evaluation

    settings = asdict(plan.settings)
    files = [plan.output / EVAL_REPORT_FILE, plan.output / EVAL_PROBLEMS_FILE]
    tracked = track_evaluation(plan.names, settings, report.to_dict(), files)
    if tracked is not None:
        print(f"tracked: MLflow run {tracked['runId']} {tracked.get('url', '')}".rstrip(), file=sys.stderr)


def _serve_metrics(plan: Plan, err) -> bool:
    """The Prometheus endpoint of --metrics-port; False (after one error line) when it cannot be served."""
    from atlas_core.telemetry.metrics import serve_metrics

    try:
        port = serve_metrics(plan.metrics_port, plan.metrics_host)
    except OSError as exc:
        print(
            f"error: --metrics-port: cannot serve on {plan.metrics_host}:{plan.metrics_port} ({exc.strerror or exc})",
            file=sys.stderr,
        )
        return False
    err.print(f"Prometheus: http://{plan.metrics_host}:{port}/metrics while it runs", soft_wrap=True)
    return True


def _announce(plan: Plan, err) -> None:
    """What is evaluated, where it goes, and how much an earlier run of the same command already did."""
    from rich.markup import escape

    total, already = len(plan.rows), done_before(plan)
    what = (
        f"teacher {plan.teacher}, student {plan.student}; {total} problems of {plan.dataset} ({plan.split}), "
        f"{plan.settings.samples} answers each alone and guided → {plan.output}"
    )
    err.print("[bold]atlas eval[/]: " + escape(what), highlight=False, soft_wrap=True)
    if already:
        resuming = f"resuming: {min(already, total)} of {total} problems already in {plan.output / EVAL_PROBLEMS_FILE}"
        err.print(escape(resuming), highlight=False, soft_wrap=True)


def _evaluate_with_progress(plan: Plan, teacher, student, err, done: dict[str, int]):
    """The two-pass evaluation behind a progress bar; ``done`` counts the finished problems as they land."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from atlas_core.evaluation import evaluate_teaching

    labels = metric_labels(plan.output)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err) as progress:
        task = progress.add_task("problems", total=len(plan.rows))

        def on_progress(finished: int, of: int) -> None:
            done["problems"] = finished
            progress.update(task, completed=finished, total=of)
            if plan.metrics_port and finished:
                _live_gauges(plan, labels)

        return evaluate_teaching(
            teacher,
            student,
            plan.rows,
            plan.settings,
            output_dir=plan.output,
            scorers=plan.scorers,
            weights=plan.weights,
            on_progress=on_progress,
            names=plan.names,
        )


def _print_report(plan: Plan, report, out) -> None:
    from rich.markup import escape

    title = f"teaching evaluation: {report.problems} problems of {plan.dataset} ({plan.split}), K = {report.samples}"
    out.print(report_table(report, escape(title)))
    out.print(escape(f"eval.json: {plan.output / EVAL_REPORT_FILE}"), highlight=False, soft_wrap=True)
    out.print(escape(f"problems.jsonl: {plan.output / EVAL_PROBLEMS_FILE}"), highlight=False, soft_wrap=True)
