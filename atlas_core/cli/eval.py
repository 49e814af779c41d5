"""``atlas eval``: does the student do better with the teacher than without?

The two-pass evaluation (:func:`atlas_core.evaluation.evaluate_teaching`) from the command line: the
student answers held-out problems alone and with the teacher's guidance, ``--samples`` times each; a
progress bar while it runs, a table of every figure (overall and by diagnosed capability) at the end,
``eval.json`` and ``problems.jsonl`` in ``--output``.

Exit status: 0 done; 2 bad input (one ``error: --option: …`` line per problem, all found before any model
is loaded: numbers out of range, a missing or unreadable model folder, an endpoint that does not answer
``GET /v1/models``, a dataset that cannot be loaded or scored, unknown reward functions, a weight count
that does not match, a ``problems.jsonl`` of another evaluation in ``--output``; and a model that exists but
does not load); 1 a model failed mid-way: the finished problems are kept in ``problems.jsonl`` and running
the same command again resumes from them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from atlas_contract.names import ENV_KIND, ENV_NAMESPACE, ENV_RUN, EVAL_PROBLEMS_FILE, EVAL_REPORT_FILE
from atlas_core.cli.display import points, quiet_libraries

#: Problems drawn from a generated builtin dataset that has no fixed test mix (``builtin://arithmetic``,
#: the ``train`` split of ``builtin://multistep``) when no ``--limit`` is given.
BUILTIN_DEFAULT_PROBLEMS = 200
#: Seconds an endpoint has to answer ``GET /v1/models`` before the evaluation starts.
ENDPOINT_CHECK_TIMEOUT_S = 5.0
DEFAULT_OUTPUT = "atlas-eval"
METRICS_HOST = "127.0.0.1"
#: The ``kind`` label of the eval gauges unless ``$ATLAS_KIND`` is set.
METRICS_KIND = "eval"

# EvaluationSettings field → command-line option (the fields the command sets).
SETTING_OPTIONS = {
    "samples": "--samples",
    "limit": "--limit",
    "seed": "--seed",
    "batch_size": "--batch-size",
    "teacher_max_tokens": "--teacher-max-tokens",
    "max_guidance_tokens": "--max-guidance-tokens",
    "max_probe_tokens": "--max-probe-tokens",
    "student_max_tokens": "--student-max-tokens",
    "teacher_temperature": "--teacher-temperature",
    "student_temperature": "--student-temperature",
}
_FLOAT_SETTINGS = ("teacher_temperature", "student_temperature")
MODEL_KINDS = (
    "a saved model folder (a run's output or checkpoint-N folder), builtin://tiny-llama, a hub id, "
    "or an http(s):// OpenAI-compatible endpoint"
)


def _setting_defaults() -> dict[str, Any]:
    from atlas_core.evaluation import EvaluationSettings

    return {f.name: f.default for f in fields(EvaluationSettings)}


def _setting_docs() -> dict[str, str]:
    """Each EvaluationSettings field's docstring (the string literal after it), for ``--help``."""
    import ast
    import inspect

    from atlas_core.evaluation import EvaluationSettings

    try:
        body = ast.parse(inspect.getsource(EvaluationSettings)).body[0].body
    except (OSError, TypeError, SyntaxError):  # no source (a frozen build): help without the sentences
        return {}
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.replace("``", "").split()).rstrip(".")
    return docs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``atlas eval`` (shared by ``atlas eval`` and ``python -m atlas_core.cli.eval``).

    Numbers are read as text and checked together with everything else, so that every problem of a command
    line is reported at once, in the ``error: --option: …`` form."""
    defaults = _setting_defaults()
    docs = _setting_docs()

    def setting_help(name: str, text: str | None = None) -> str:
        default = defaults[name]
        shown = "all" if default is None else default
        return f"{text or docs.get(name, name)} (default {shown})".replace("%", "%%")

    models = parser.add_argument_group("models and data (required)")
    models.add_argument("--teacher", metavar="MODEL", help=f"the teacher: {MODEL_KINDS}")
    models.add_argument("--student", metavar="MODEL", help="the student, in any of the teacher's forms")
    models.add_argument(
        "--dataset",
        metavar="SOURCE",
        help="held-out problems (prompt + ground_truth): builtin://multistep (the bundled teaching task), "
        "builtin://arithmetic, a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, or hf://org/name",
    )
    run = parser.add_argument_group("evaluation")
    run.add_argument("--split", default=_default_split(), help="dataset split (default %(default)s)")
    run.add_argument("-k", "--samples", default=defaults["samples"], metavar="K", help=setting_help("samples"))
    run.add_argument(
        "--limit",
        default=None,
        metavar="N",
        help="evaluate the first N problems of the split (default: all; builtin://multistep's test split "
        f"holds its whole test mix, other builtins {BUILTIN_DEFAULT_PROBLEMS} problems)",
    )
    run.add_argument("--seed", default=defaults["seed"], metavar="N", help=setting_help("seed"))
    run.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        metavar="DIR",
        help=f"folder of {EVAL_REPORT_FILE} and {EVAL_PROBLEMS_FILE}; the same folder resumes an evaluation "
        "that stopped (default ./%(default)s)",
    )
    run.add_argument("--batch-size", default=defaults["batch_size"], metavar="N", help=setting_help("batch_size"))
    run.add_argument(
        "--device",
        default="auto",
        help="where local models run: auto (cuda when available, else cpu), cpu, cuda, cuda:N (default %(default)s)",
    )
    scoring = parser.add_argument_group("scoring (default: exact match of the answer with ground_truth)")
    scoring.add_argument(
        "--reward-funcs",
        action="append",
        default=None,
        metavar="NAMES",
        help="verifiable reward functions scoring the student's answers, comma-separated or repeated "
        f"({', '.join(_reward_names())})",
    )
    scoring.add_argument("--reward-config", metavar="CONFIG", help="a RIM config: a YAML file or a bundled name")
    scoring.add_argument(
        "--reward-weights",
        action="append",
        default=None,
        metavar="WEIGHTS",
        help="one weight per reward function, then one for the RIM config; comma-separated or repeated",
    )
    budgets = parser.add_argument_group("protocol")
    for name in (
        "teacher_max_tokens",
        "max_guidance_tokens",
        "max_probe_tokens",
        "student_max_tokens",
        "teacher_temperature",
        "student_temperature",
    ):
        metavar = "T" if name in _FLOAT_SETTINGS else "N"
        budgets.add_argument(SETTING_OPTIONS[name], default=defaults[name], metavar=metavar, help=setting_help(name))
    metrics = parser.add_argument_group("metrics")
    metrics.add_argument(
        "--metrics-port",
        default=0,
        metavar="PORT",
        help="serve the atlas_eval_* gauges on this port while it runs; 0 = off (default %(default)s)",
    )
    metrics.add_argument(
        "--metrics-host",
        default=METRICS_HOST,
        metavar="HOST",
        help="address of the metrics server (default %(default)s)",
    )


def _default_split() -> str:
    from atlas_contract.defaults import EVALUATION

    return EVALUATION["split"]


def _reward_names() -> tuple[str, ...]:
    from atlas_contract.rules import REWARD_FUNCTIONS

    return REWARD_FUNCTIONS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atlas eval",
        usage="atlas eval --teacher MODEL --student MODEL --dataset SOURCE [options]",
        description=(__doc__ or "").split("\n\n")[0].replace("``", ""),
    )
    add_arguments(parser)
    return parser


# ---------------------------------------------------------------------------------------------- checking


@dataclass
class Plan:
    """A checked command line: what :func:`run` evaluates."""

    settings: Any
    teacher: str
    student: str
    dataset: str
    split: str
    rows: list[dict[str, Any]]
    output: Path
    funcs: list[str]
    reward_config: str | None
    weights: list[float] | None
    device: str
    metrics_port: int
    metrics_host: str
    scorers: list[Any] = field(default_factory=list)

    @property
    def names(self) -> dict[str, str]:
        scorer = ", ".join([*self.funcs, *([self.reward_config] if self.reward_config else [])]) or "exact_match"
        return {
            "teacher": self.teacher,
            "student": self.student,
            "dataset": self.dataset,
            "split": self.split,
            "scorer": scorer,
        }


def _number(option: str, raw: Any, kind: type, problems: list[str], minimum: float | None = None):
    """``raw`` as an int or float; None (and a problem) when it is not one."""
    if raw is None or isinstance(raw, kind) and not isinstance(raw, bool):
        value = raw
    else:
        try:
            value = kind(str(raw).strip())
        except ValueError:
            what = "an integer" if kind is int else "a number"
            problems.append(f"{option}: expected {what}, got {raw!r}")
            return None
    if value is not None and minimum is not None and value < minimum:
        what = "an integer" if kind is int else "a number"
        problems.append(f"{option}: expected {what} >= {minimum:g}, got {value}")
        return None
    return value


def _listed(values: list[str] | None) -> list[str]:
    """Comma-separated or repeated values, flattened."""
    return [item.strip() for value in values or [] for item in value.split(",") if item.strip()]


def _settings(args: argparse.Namespace, problems: list[str]):
    """EvaluationSettings from the options; its own range checks reported under the option names."""
    from atlas_core.evaluation import EvaluationSettings

    defaults = _setting_defaults()
    values: dict[str, Any] = {}
    for name, option in SETTING_OPTIONS.items():
        raw = getattr(args, name)
        kind = float if name in _FLOAT_SETTINGS else int
        minimum = 0 if name == "seed" else None  # numpy's generators take no negative seed
        value = _number(option, raw, kind, problems, minimum)
        values[name] = defaults[name] if value is None and raw is not None else value
    settings = EvaluationSettings(**values)
    for problem in settings.problems():
        name, _, rest = problem.partition(": ")
        problems.append(f"{SETTING_OPTIONS.get(name, name)}: {rest}")
    return settings


def _model_problems(option: str, ref: str | None) -> list[str]:
    """The contract's model-reference rule, under the option's name (endpoints are checked separately)."""
    from atlas_contract.rules import model_problems
    from atlas_core.models.tiny import TINY_MODEL_URI

    if not ref:
        return [f"{option}: required ({MODEL_KINDS})"]
    return model_problems(ref, option, builtins=(TINY_MODEL_URI,))


def models_url(url: str) -> str:
    """The ``/v1/models`` address of an endpoint given as ``http://host:port`` or ``http://host:port/v1``
    (the same base :class:`~atlas_core.training.student.EndpointStudent` calls)."""
    base = url.rstrip("/")
    return f"{base if base.endswith('/v1') else base + '/v1'}/models"


def endpoint_problem(option: str, url: str, timeout_s: float = ENDPOINT_CHECK_TIMEOUT_S) -> str | None:
    """None when ``GET <url>/v1/models`` lists a model within ``timeout_s``; else what is wrong, named."""
    import socket

    target = models_url(url)
    try:
        request = urllib.request.Request(
            target, headers={"Accept": "application/json", "Authorization": "Bearer EMPTY"}
        )
        urllib.parse.urlsplit(target).port  # noqa: B018 - raises ValueError on a malformed host or port
    except ValueError as exc:
        return f"{option}: '{url}' is not a valid URL ({' '.join(str(exc).split())}); expected http(s)://host:port[/v1]"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read(4_000_000)
    except urllib.error.HTTPError as exc:
        return (
            f"{option}: endpoint {url} answered HTTP {exc.code} to GET {target} (expected an OpenAI-compatible server)"
        )
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(reason, (TimeoutError, socket.timeout)):
            why = f"no answer within {timeout_s:g} s"
        elif isinstance(reason, socket.gaierror):
            why = "unknown host"
        else:
            why = " ".join(str(reason).split())[:200] or type(reason).__name__
        return f"{option}: endpoint {url} is not reachable ({why}; GET {target})"
    try:
        listed = json.loads(body)
    except ValueError:
        return f"{option}: endpoint {url} did not answer JSON to GET {target} (expected an OpenAI-compatible server)"
    if not isinstance(listed, dict) or not isinstance(listed.get("data"), list) or not listed["data"]:
        return f"{option}: endpoint {url} serves no model (GET {target} listed none)"
    return None


def _output_problems(output: str) -> list[str]:
    path = Path(os.path.expanduser(output))
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:
        return []
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be created: '{existing}' is a file"
        return [f"--output: '{output}' {what}; expected a folder"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"--output: '{existing}' is not writable"]
    return []


def whole_test_mix() -> int:
    """How many problems ``builtin://multistep``'s test split holds in its mix (the largest ``--limit``)."""
    from atlas_core.tasks import multistep

    return multistep.test_mix_size()


#: The run-configuration field a dataset error names → the option of this command.
_DATASET_FIELDS = {"dataset.source": "--dataset", "dataset.split": "--split", "dataset.num_samples": "--limit"}


def _load_rows(source: str, split: str, limit: int | None, seed: int, notes: list[str], problems: list[str]):
    """The problems to evaluate (at most ``limit``), or None with the problems named."""
    from atlas_core.training.data import DatasetSourceError, load_evaluation_dataset

    shown: list[str] = []
    try:
        dataset = load_evaluation_dataset(
            source, split, limit, BUILTIN_DEFAULT_PROBLEMS, seed, prefix="dataset", notes=shown
        )
    except DatasetSourceError as exc:
        for line in str(exc).splitlines():
            name, _, rest = line.partition(": ")
            problems.append(f"{_DATASET_FIELDS[name]}: {rest}" if name in _DATASET_FIELDS else f"--dataset: {line}")
        return None
    notes += [f"--{note}" for note in shown]  # "limit N: …" → "--limit N: …"
    return dataset.to_list()


def check(args: argparse.Namespace) -> tuple[Plan | None, list[str], list[str]]:
    """(plan, problems, notes): every problem of the command line found before any model is loaded."""
    from atlas_contract import rules
    from atlas_contract.rules import model_reference

    problems: list[str] = []
    notes: list[str] = []
    settings = _settings(args, problems)
    port = _number("--metrics-port", args.metrics_port, int, problems, 0)
    if port is not None and port > 65535:
        problems.append(f"--metrics-port: expected a port in 0..65535 (0 = off), got {port}")
    device = str(args.device).strip()
    if device != "auto" and device != "cpu" and not (device == "cuda" or device.startswith("cuda:")):
        problems.append(f"--device: expected auto, cpu, cuda or cuda:N, got {device!r}")

    funcs = _listed(args.reward_funcs)
    weights: list[float] | None = None
    if args.reward_weights is not None:
        weights = []
        for raw in _listed(args.reward_weights):
            value = _number("--reward-weights", raw, float, problems)
            weights.append(0.0 if value is None else value)
    problems += rules.reward_problems(
        funcs,
        bool(args.reward_config),
        weights,
        name=lambda f: {"funcs": "--reward-funcs", "weights": "--reward-weights"}.get(f, f),
    )
    scorers: list[Any] = []
    if args.reward_config:
        from atlas_core.reward.config import RIMConfigError
        from atlas_core.reward.interpretation import RIMReward

        try:
            scorers.append(RIMReward(str(args.reward_config)))
        except (RIMConfigError, ValueError) as exc:
            for line in str(exc).splitlines():
                problems.append(f"--reward-config: {line.removeprefix('config_path: ')}")
    problems += _output_problems(args.output)

    endpoints = []
    for option, ref in (("--teacher", args.teacher), ("--student", args.student)):
        if ref and model_reference(ref) == "endpoint":
            endpoints.append((option, ref))
        else:
            problems += _model_problems(option, ref)
    if endpoints:  # both at once: each may take the whole timeout
        with ThreadPoolExecutor(len(endpoints)) as pool:
            problems += [p for p in pool.map(lambda e: endpoint_problem(*e), endpoints) if p]

    rows = None
    if not args.dataset:
        problems.append("--dataset: required (builtin://multistep, a file, a save_to_disk folder or hf://org/name)")
    else:
        limit = settings.limit if isinstance(settings.limit, int) and settings.limit >= 1 else None
        rows = _load_rows(args.dataset, args.split, limit, settings.seed, notes, problems)
    if rows is not None and not funcs and not args.reward_config:
        missing = [i for i, r in enumerate(rows) if r.get("ground_truth") in (None, "")]
        if missing:
            problems.append(
                f"--dataset: {len(missing)} of {len(rows)} problems have no ground_truth (first: row {missing[0]}); "
                "expected a ground_truth column, or a scorer (--reward-funcs, --reward-config)"
            )
    if problems:
        for scorer in scorers:
            scorer.close()
        return None, problems, notes
    from atlas_core.tasks.arithmetic import REWARD_FUNCTIONS

    plan = Plan(
        settings=settings,
        teacher=args.teacher,
        student=args.student,
        dataset=args.dataset,
        split=args.split,
        rows=rows,
        output=Path(os.path.expanduser(args.output)),
        funcs=funcs,
        reward_config=str(args.reward_config) if args.reward_config else None,
        weights=weights,
        device=device,
        metrics_port=port or 0,
        metrics_host=args.metrics_host,
        scorers=[*(REWARD_FUNCTIONS[name] for name in funcs), *scorers],
    )
    problem = _resume_problem(plan)
    if problem:
        for scorer in scorers:
            scorer.close()
        return None, [problem], notes
    return plan, [], notes


def _resume_problem(plan: Plan) -> str | None:
    """A ``problems.jsonl`` in the output folder that another evaluation wrote, found before models load
    (the evaluation itself refuses it too)."""
    from atlas_core import evaluation

    try:
        evaluation.resumable_records(
            plan.output / EVAL_PROBLEMS_FILE, plan.rows, evaluation.fingerprint(plan.settings, plan.names)
        )
    except ValueError as exc:
        return f"--output: {str(exc).removeprefix('output: ')}"
    return None


def done_before(plan: Plan) -> int:
    path = plan.output / EVAL_PROBLEMS_FILE
    if not path.exists():
        return 0
    done = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return min(done, len(plan.rows))  # a smaller --limit than before: its problems are all done


# ---------------------------------------------------------------------------------------------- running


def _device(name: str) -> str | None:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else None


def load_models(plan: Plan) -> tuple[Any, Any, list[str]]:
    """(teacher, student, problems): each model loaded, or what stopped it, under its option's name."""
    from atlas_core.training.student import is_endpoint, load_student

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
    from atlas_core.evaluation import figures

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


def run(plan: Plan, notes: list[str] = ()) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from atlas_core.evaluation import EvaluationError, evaluate_teaching

    err = Console(stderr=True)
    out = Console()
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    labels = metric_labels(plan.output)
    if plan.metrics_port:
        from atlas_core.telemetry.metrics import serve_metrics

        try:
            port = serve_metrics(plan.metrics_port, plan.metrics_host)
        except OSError as exc:
            print(
                f"error: --metrics-port: cannot serve on {plan.metrics_host}:{plan.metrics_port} "
                f"({exc.strerror or exc})",
                file=sys.stderr,
            )
            return 2
        err.print(f"Prometheus: http://{plan.metrics_host}:{port}/metrics while it runs", soft_wrap=True)
    total = len(plan.rows)
    already = done_before(plan)
    err.print(
        "[bold]atlas eval[/]: "
        + escape(
            f"teacher {plan.teacher}, student {plan.student}; {total} problems of {plan.dataset} ({plan.split}), "
            f"{plan.settings.samples} answers each alone and guided → {plan.output}"
        ),
        highlight=False,
        soft_wrap=True,
    )
    if already:
        err.print(
            escape(
                f"resuming: {min(already, total)} of {total} problems already in {plan.output / EVAL_PROBLEMS_FILE}"
            ),
            highlight=False,
            soft_wrap=True,
        )
    quiet_libraries()
    teacher, student, problems = load_models(plan)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2

    done = {"problems": 0}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=err) as progress:
            task = progress.add_task("problems", total=total)

            def on_progress(finished: int, of: int) -> None:
                done["problems"] = finished
                progress.update(task, completed=finished, total=of)
                if plan.metrics_port and finished:
                    _live_gauges(plan, labels)

            report = evaluate_teaching(
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
    except EvaluationError as exc:
        cause = " ".join(str(exc.__cause__ or exc).split())[:300]
        print(
            f"error: evaluation stopped after {exc.done} of {exc.total} problems ({cause}); the {exc.done} finished "
            f"are kept in {plan.output / EVAL_PROBLEMS_FILE}: run the same command again to resume",
            file=sys.stderr,
        )
        return 1
    except ValueError as exc:  # rows that cannot be scored, another evaluation's problems.jsonl
        for line in str(exc).splitlines():
            print(f"error: {'--' + line if line.startswith('output: ') else line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"interrupted: {done['problems']} of {total} problems kept in {plan.output / EVAL_PROBLEMS_FILE}: "
            "run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    finally:
        for scorer in plan.scorers:
            if hasattr(scorer, "close"):
                scorer.close()
    if plan.metrics_port:
        set_gauges(report, labels)
    title = escape(
        f"teaching evaluation: {report.problems} problems of {plan.dataset} ({plan.split}), K = {report.samples}"
    )
    out.print(report_table(report, title))
    out.print(escape(f"eval.json: {plan.output / EVAL_REPORT_FILE}"), highlight=False, soft_wrap=True)
    out.print(escape(f"problems.jsonl: {plan.output / EVAL_PROBLEMS_FILE}"), highlight=False, soft_wrap=True)
    return 0


def run_args(args: argparse.Namespace) -> int:
    """``atlas eval`` with parsed options."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    plan, problems, notes = check(args)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2
    return run(plan, notes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return run_args(args)


if __name__ == "__main__":
    sys.exit(main())
