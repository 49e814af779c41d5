"""`atlas eval`'s options: the settings it takes (each with the contract's default) and its parser."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from atlas_contract.names import EVAL_PROBLEMS_FILE, EVAL_REPORT_FILE

#: Problems drawn from a generated builtin dataset that has no fixed test mix (``builtin://arithmetic``,
#: the ``train`` split of ``builtin://multistep``) when no ``--limit`` is given.
BUILTIN_DEFAULT_PROBLEMS = 200

#: Seconds an endpoint has to answer ``GET /v1/models`` before the evaluation starts.
ENDPOINT_CHECK_TIMEOUT_S = 5.0

DEFAULT_OUTPUT = "atlas-eval"

METRICS_HOST = "127.0.0.1"

#: The ``kind`` label of the eval gauges unless ``$ATLAS_KIND`` is set.
METRICS_KIND = "eval"

# The settings the command sets (EvaluationRunSettings.flat()'s names; the teaching ones are the contract's
# TeachingSettings fields), the protocol's in the order --help lists them. Each option is its setting's name.
PROTOCOL_SETTINGS = (
    "teacher_max_tokens",
    "max_guidance_tokens",
    "max_probe_tokens",
    "student_max_tokens",
    "teacher_temperature",
    "student_temperature",
)
SETTING_OPTIONS = {
    name: "--" + name.replace("_", "-") for name in ("samples", "limit", "seed", "batch_size", *PROTOCOL_SETTINGS)
}


def is_float_setting(name: str) -> bool:
    """Whether a setting takes any number (its default is a float), not a whole one."""
    return isinstance(setting_defaults()[name], float)


MODEL_KINDS = (
    "a saved model folder (a run's output or checkpoint-N folder), builtin://tiny-llama, "
    "builtin://smollm2-135m-instruct (a real chat model: make real-model), a hub id, "
    "or an http(s):// OpenAI-compatible endpoint"
)


def setting_defaults() -> dict[str, Any]:
    from atlas_core.evaluation import EvaluationRunSettings

    return EvaluationRunSettings().flat()


def _setting_docs() -> dict[str, str]:
    """Each setting's meaning, for ``--help``: a teaching setting's help (the contract's TeachingSettings), an
    EvaluationRunSettings field's docstring (the string literal after it)."""
    import ast
    import inspect

    from atlas_contract.teaching import TeachingSettings
    from atlas_core.evaluation import EvaluationRunSettings

    docs = {f.name: f.metadata["help"].rstrip(".") for f in fields(TeachingSettings)}
    try:
        definition = ast.parse(inspect.getsource(EvaluationRunSettings)).body[0]
    except (OSError, TypeError, SyntaxError):  # no source (a frozen build): help without the sentences
        return docs
    assert isinstance(definition, ast.ClassDef)  # the source of a class
    body = definition.body
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
    defaults, docs = setting_defaults(), _setting_docs()

    def setting_help(name: str, text: str | None = None) -> str:
        default = defaults[name]
        shown = "all" if default is None else default
        return f"{text or docs.get(name, name)} (default {shown})".replace("%", "%%")

    _model_and_data_options(parser.add_argument_group("models and data (required)"))
    _evaluation_options(parser.add_argument_group("evaluation"), defaults, setting_help)
    _scoring_options(parser.add_argument_group("scoring (default: exact match of the answer with ground_truth)"))
    budgets = parser.add_argument_group("protocol")
    for name in PROTOCOL_SETTINGS:
        metavar = "T" if is_float_setting(name) else "N"
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


def _model_and_data_options(models) -> None:
    models.add_argument("--teacher", metavar="MODEL", help=f"the teacher: {MODEL_KINDS}")
    models.add_argument("--student", metavar="MODEL", help="the student, in any of the teacher's forms")
    models.add_argument(
        "--dataset",
        metavar="SOURCE",
        help="held-out problems (prompt + ground_truth): builtin://multistep (the bundled teaching task), "
        "builtin://arithmetic, a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, or hf://org/name",
    )


def _evaluation_options(run, defaults: dict, setting_help) -> None:
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


def _scoring_options(scoring) -> None:
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


def _default_split() -> str:
    from atlas_contract.defaults import EVALUATION

    return EVALUATION["split"]


def _reward_names() -> tuple[str, ...]:
    from atlas_contract.checks import REWARD_FUNCTIONS

    return REWARD_FUNCTIONS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atlas eval",
        usage="atlas eval --teacher MODEL --student MODEL --dataset SOURCE [options]",
        description=(__doc__ or "").split("\n\n")[0].replace("``", ""),
    )
    add_arguments(parser)
    return parser
