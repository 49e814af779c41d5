"""`atlas eval`'s checks, before any model loads: every problem of the command line, one line each, or a plan."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atlas_contract.names import EVAL_PROBLEMS_FILE
from atlas_core.cli.eval_options import (
    BUILTIN_DEFAULT_PROBLEMS,
    ENDPOINT_CHECK_TIMEOUT_S,
    MODEL_KINDS,
    SETTING_OPTIONS,
    is_float_setting,
    setting_defaults,
)


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


def _number(option: str, raw: Any, kind: type[float], problems: list[str], minimum: float | None = None) -> Any:
    """``raw`` as an int or float; None (and a problem) when it is not one."""
    value: float | None
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
    """EvaluationRunSettings (the teaching ones a TeachingSettings) from the options; its own range checks reported
    under the option names."""
    from atlas_core.evaluation import EvaluationRunSettings

    defaults = setting_defaults()
    values: dict[str, Any] = {}
    for name, option in SETTING_OPTIONS.items():
        raw = getattr(args, name)
        kind = float if is_float_setting(name) else int
        minimum = 0 if name == "seed" else None  # numpy's generators take no negative seed
        value = _number(option, raw, kind, problems, minimum)
        values[name] = defaults[name] if value is None and raw is not None else value
    settings = EvaluationRunSettings.from_flat(**values)
    for problem in settings.problems():
        name, _, rest = problem.partition(": ")
        problems.append(f"{SETTING_OPTIONS.get(name, name)}: {rest}")
    return settings


def _model_problems(option: str, ref: str | None) -> list[str]:
    """The contract's model-reference rule, under the option's name (endpoints are checked separately)."""
    from atlas_contract.checks import BUILTIN_MODELS, model_problems
    from atlas_core.sources import remote_problems

    if not ref:
        return [f"{option}: required ({MODEL_KINDS})"]
    remote = remote_problems(ref, option, "the model's folder")  # s3://, pvc://, hf://: fetched when it loads
    if remote is not None:
        return remote
    return model_problems(ref, option, builtins=BUILTIN_MODELS)


def models_url(url: str) -> str:
    """The ``/v1/models`` address of an endpoint given as ``http://host:port`` or ``http://host:port/v1``
    (the same base :class:`~atlas_core.teaching.student.EndpointStudent` calls)."""
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


def _reward_weights(args: argparse.Namespace, funcs: list[str], problems: list[str]) -> list[float] | None:
    """--reward-weights as numbers (None: unset), with the reward rules' problems of funcs and weights."""
    from atlas_contract import checks

    weights: list[float] | None = None
    if args.reward_weights is not None:
        weights = []
        for raw in _listed(args.reward_weights):
            value = _number("--reward-weights", raw, float, problems)
            weights.append(0.0 if value is None else value)
    problems += checks.reward_problems(
        funcs,
        bool(args.reward_config),
        weights,
        name=lambda f: {"funcs": "--reward-funcs", "weights": "--reward-weights"}.get(f, f),
    )
    return weights


def _rim_scorers(args: argparse.Namespace, problems: list[str]) -> list[Any]:
    """The RIM scorer of --reward-config (none when unset or when the config cannot be used)."""
    if not args.reward_config:
        return []
    from atlas_core.reward.config import RIMConfigError
    from atlas_core.reward.interpretation import RIMReward

    try:
        return [RIMReward(str(args.reward_config))]
    except (RIMConfigError, ValueError) as exc:
        for line in str(exc).splitlines():
            problems.append(f"--reward-config: {line.removeprefix('config_path: ')}")
        return []


def _models_problems(args: argparse.Namespace) -> list[str]:
    """--teacher and --student: a local model is checked on disk; endpoints are asked, both at once (each may
    take the whole timeout)."""
    from atlas_contract.checks import model_reference

    problems, endpoints = [], []
    for option, ref in (("--teacher", args.teacher), ("--student", args.student)):
        if ref and model_reference(ref) == "endpoint":
            endpoints.append((option, ref))
        else:
            problems += _model_problems(option, ref)
    if endpoints:
        with ThreadPoolExecutor(len(endpoints)) as pool:
            problems += [p for p in pool.map(lambda e: endpoint_problem(*e), endpoints) if p]
    return problems


def check(args: argparse.Namespace) -> tuple[Plan | None, list[str], list[str]]:
    """(plan, problems, notes): every problem of the command line found before any model is loaded."""
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
    weights = _reward_weights(args, funcs, problems)
    scorers = _rim_scorers(args, problems)
    problems += _output_problems(args.output)
    problems += _models_problems(args)

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
    from atlas_core.answers import REWARD_FUNCTIONS

    assert rows is not None  # no --dataset, or one that does not load, is a problem above
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
