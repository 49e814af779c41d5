"""Experiment tracking (``spec.tracking``): what the operator, the trainer and ``atlas eval`` agree on.

A run's tracking goes through the libraries' own switches: TRL's ``report_to`` (``mlflow``, ``wandb``) and their
environment (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``WANDB_PROJECT``, ``WANDB_API_KEY``, …), which the
operator renders into the trainer pods and which a local ``atlas train`` reads from the user's shell. Rank 0 logs
(atlas_core/training/tracking.py). One tracking run per Atlas run across every resume: the trainer finds its run by
the tag ``atlas.uid`` (the cluster run's ``metadata.uid``; a local run's is kept in its output folder).

What a tracked run holds: the params (the spec flattened, the image, the backend, the library versions), the tags
below, every logged step's metrics under the Prometheus names of atlas_contract/metrics.py, the evaluation table as
``atlas_eval_*`` metrics, and the artifacts (metrics.jsonl, the curves, the model card).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from atlas_contract.metrics import TRAINER

# The libraries' own environment variables (MLflow's and W&B's documented names).
ENV_MLFLOW_URI = "MLFLOW_TRACKING_URI"
ENV_MLFLOW_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
ENV_MLFLOW_TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
ENV_MLFLOW_RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
ENV_WANDB_PROJECT = "WANDB_PROJECT"
ENV_WANDB_ENTITY = "WANDB_ENTITY"
ENV_WANDB_RUN_ID = "WANDB_RUN_ID"
ENV_WANDB_RESUME = "WANDB_RESUME"
#: The key of spec.tracking.wandb.secretRef's Secret the pods read (the operator never reads a Secret).
WANDB_SECRET_KEY = "WANDB_API_KEY"

#: TRL's ``report_to`` names of the two trackers.
MLFLOW = "mlflow"
WANDB = "wandb"

# spec.tracking.mlflow.uri: a tracking server (http, https) or a local store (file:).
MLFLOW_URI_SCHEMES = ("http://", "https://", "file:")
MLFLOW_URI_EXPECTED = "an http://, https:// or file: URI of an MLflow tracking store"
# The CRD's CEL rule uses it too (RE2): no backslash classes, which a CEL string literal would have to escape.
MLFLOW_URI_PATTERN = "^(https?://[^ /?#]+([/?#][^ ]*)?|file:[^ ]+)$"

# A tracking server that does not answer costs at most this per request (MLflow's own settings, set for the trainer
# process when the user did not set them): the logging runs beside training, and the end of a run waits for it at
# most FLUSH_WAIT_S.
REQUEST_TIMEOUT_S = 10
REQUEST_MAX_RETRIES = 1
#: After a failed request, the next attempt no sooner than this (steps logged meanwhile wait, in order).
RETRY_INTERVAL_S = 10.0
#: At the end of training, and after the evaluation, how long the trainer waits for what is queued to be logged.
FLUSH_WAIT_S = 30.0
#: Logged steps kept while the server does not answer (the oldest dropped beyond it, with a warning).
MAX_PENDING_STEPS = 100_000

# Tags of a tracked run: the Atlas run it belongs to.
TAG_UID = "atlas.uid"
TAG_NAMESPACE = "atlas.namespace"
TAG_NAME = "atlas.name"
TAG_KIND = "atlas.kind"
TAG_OUTPUT = "atlas.output.uri"  # the exported model, when the run has spec.output
#: The local run's uid, in its output folder (a cluster run's is its metadata.uid).
LOCAL_UID_FILE = "atlas-tracking-uid"

#: The trainer's log key → the Prometheus name it is logged under (atlas_contract/metrics.py); the step itself is
#: ``atlas_training_step``. Other numeric log keys keep the trainer's name.
STEP_METRIC = "atlas_training_step"
METRIC_NAMES: dict[str, str] = {metric.log_key: metric.name for metric in TRAINER if metric.log_key}
#: The evaluation report's fields (eval.json) → metric names: the four the trainer also exports to Prometheus keep
#: those names, the rest ``atlas_eval_<field>``.
EVALUATION_METRICS: dict[str, str] = {
    field: f"atlas_eval_{field}"
    for field in (
        "problems",
        "student_accuracy",
        "guided_accuracy",
        "accuracy_delta",
        "accuracy_delta_low",
        "accuracy_delta_high",
        "non_degradation_rate",
        "improvement_rate",
        "degradation_rate",
        "guidance_tokens_mean",
    )
}
# MLflow's metric and param names: letters, digits and _ - . space : / (others become _).
_UNSAFE = re.compile(r"[^0-9A-Za-z_\-. :/]")
MAX_PARAM_VALUE = 6000  # MLflow's limit on a param's value
#: spec fields left out of the params: spec.env's values may be literal (only names are logged), and suspend is the
#: user's switch, not a setting of the experiment.
PARAMS_LEFT_OUT = ("spec.suspend",)


def mlflow_uri_problem(uri: Any, path: str = "spec.tracking.mlflow.uri") -> str | None:
    """Why ``uri`` cannot be an MLflow tracking URI, naming ``path`` and the value; None when it can."""
    if isinstance(uri, str) and re.match(MLFLOW_URI_PATTERN, uri):
        return None
    return f"{path}: expected {MLFLOW_URI_EXPECTED}, got {uri!r}"


def metric_name(log_key: str) -> str:
    """The name a trainer log key is tracked under: its Prometheus name, else the key (MLflow-safe)."""
    return METRIC_NAMES.get(log_key) or _UNSAFE.sub("_", log_key)


#: A key of the trainer's end-of-training summary (train_runtime, train_loss, …), logged at the last step's number: it
#: is not a step of its own, so it carries no ``atlas_training_step``.
SUMMARY_KEY = "train_runtime"


def step_metrics(logs: Mapping[str, Any], step: int) -> dict[str, float]:
    """One logged step's numeric values under their tracked names, with the step as ``atlas_training_step`` (not on
    the end-of-training summary)."""
    values = {} if SUMMARY_KEY in logs else {STEP_METRIC: float(step)}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # NaN: not a value
            continue
        if value in (float("inf"), float("-inf")):
            continue
        values[metric_name(key)] = float(value)
    return values


def evaluation_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The evaluation table (eval.json's fields) as metrics."""
    return {
        name: float(report[field])
        for field, name in EVALUATION_METRICS.items()
        if isinstance(report.get(field), (int, float)) and not isinstance(report.get(field), bool)
    }


def flatten(value: Any, prefix: str) -> dict[str, str]:
    """A nested mapping as ``{"a.b.c": "value"}`` (lists as JSON), each value cut to MLflow's limit."""
    flat: dict[str, str] = {}
    if isinstance(value, Mapping):
        for key, inner in value.items():
            flat.update(flatten(inner, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    flat[prefix] = text[:MAX_PARAM_VALUE]
    return flat


def spec_params(spec: Mapping[str, Any]) -> dict[str, str]:
    """A run's spec as tracking params (``spec.training.learningRate`` …): every field but PARAMS_LEFT_OUT, and of
    spec.env only the variables' names (a literal value could be a secret)."""
    spec = dict(spec)
    env = spec.pop("env", None)
    params = {k: v for k, v in flatten(spec, "spec").items() if k not in PARAMS_LEFT_OUT}
    if env:
        params["spec.env"] = ",".join(str(var.get("name")) for var in env if isinstance(var, Mapping))
    return params


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI's page of a run (http(s) servers only)."""
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
