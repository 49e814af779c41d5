"""What a finished run reports: the trainer writes it, the operator copies it into ``.status.result``.

The trainer's rank 0 writes :func:`result_message` to ``$ATLAS_RESULT_FILE`` (the Master container's
``terminationMessagePath``); Kubernetes copies that file into the finished pod's
``status.containerStatuses[].state.terminated.message`` (at most 4096 bytes), and the operator
reads it back with :func:`parse_result_message`. Keys are camelCase, as the status shows them.
"""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard

#: Kubernetes truncates a termination message to 4096 bytes; ours always fits.
MAX_MESSAGE_BYTES = 4096

#: ``eval.json`` field → ``.status.result.evaluation`` key (the summary a status can carry).
EVALUATION_SUMMARY = {
    "problems": "problems",
    "student_accuracy": "studentAccuracy",
    "guided_accuracy": "guidedAccuracy",
    "accuracy_delta": "accuracyDelta",
    "accuracy_delta_low": "accuracyDeltaLow",
    "accuracy_delta_high": "accuracyDeltaHigh",
    "non_degradation_rate": "nonDegradationRate",
    "guidance_tokens_mean": "guidanceTokensMean",
}
INTEGER_KEYS = frozenset({"step", "problems"})
# The largest status integer: a JSON number holds integers exactly up to 2**53 - 1, and the API server reads a schema's
# `maximum` as a float64 — 2**63 - 1 became 2**63, "not an integer", and every status write with a result was refused
# (422) by a real kube-apiserver.
MAX_STATUS_INTEGER = 2**53 - 1
#: The range of each ``.status.result`` value (``evaluation.*`` keys bare); the CRD's schema states the same bounds.
#: A value outside its range is dropped, never shown (a termination message is the trainer's word, not checked).
RESULT_RANGES: dict[str, tuple[float | None, float | None]] = {
    "step": (0, MAX_STATUS_INTEGER),
    "reward": (None, None),
    "kl": (None, None),
    "problems": (0, MAX_STATUS_INTEGER),
    "studentAccuracy": (0.0, 1.0),
    "guidedAccuracy": (0.0, 1.0),
    "accuracyDelta": (-1.0, 1.0),
    "accuracyDeltaLow": (-1.0, 1.0),
    "accuracyDeltaHigh": (-1.0, 1.0),
    "nonDegradationRate": (0.0, 1.0),
    "guidanceTokensMean": (0.0, None),
}
#: The longest tracking run id or URL a result carries (an MLflow run id is 32 characters).
MAX_TRACKING_TEXT = 1024
#: The result message's key of a failed export (the trainer container's launch script looks for it).
EXPORT_ERROR_KEY = "exportError"
#: ``.status.result.evaluationError``: why the evaluation after training failed (the run still succeeded), in
#: one line of at most this many characters.
MAX_EVALUATION_ERROR = 500


def evaluation_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The status summary of an evaluation report (``eval.json``'s fields, snake_case)."""
    return {key: report[field] for field, key in EVALUATION_SUMMARY.items() if report.get(field) is not None}


def one_line(text: str, limit: int = MAX_EVALUATION_ERROR) -> str:
    """``text`` on one line (whitespace runs collapsed), cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def result_message(
    step: int,
    reward: float | None,
    evaluation: dict[str, Any] | None = None,
    evaluation_error: str | None = None,
    output: dict[str, Any] | None = None,
    export_error: dict[str, str] | None = None,
    kl: float | None = None,
    tracking: dict[str, str] | None = None,
) -> str:
    """The termination message of a finished trainer: compact JSON, always under the size limit.
    ``evaluation_error``: the evaluation after training failed (the trained run did not). ``output``: the export
    (``{uri, files, bytes}``, ``.status.output``); ``export_error``: ``{reason, message}`` of an export that failed
    (condition ``Exported=False``; the trainer exits non-zero so its job retries the export alone). ``kl``: the last
    logged KL (the run's final figures, ``.status.progress``); ``tracking``: the tracking run's ``{runId, url}``
    (``.status.tracking``)."""
    result: dict[str, Any] = {"step": int(step)}
    if reward is not None and math.isfinite(reward):
        result["reward"] = round(float(reward), 6)
    if kl is not None and math.isfinite(kl):
        result["kl"] = round(float(kl), 6)
    if tracking and tracking.get("runId"):
        result["tracking"] = {k: str(tracking[k])[:MAX_TRACKING_TEXT] for k in ("runId", "url") if tracking.get(k)}
    if evaluation:
        result["evaluation"] = {
            k: (round(float(v), 6) if isinstance(v, float) else v) for k, v in evaluation_summary(evaluation).items()
        }
    if evaluation_error:
        result["evaluationError"] = one_line(evaluation_error)
    if output:
        result["output"] = {"uri": str(output["uri"]), "files": int(output["files"]), "bytes": int(output["bytes"])}
    if export_error:
        result[EXPORT_ERROR_KEY] = {
            "reason": one_line(export_error.get("reason", "ExportFailed"), 64),
            "message": one_line(export_error.get("message", "")),
        }
    text = json.dumps(result, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_MESSAGE_BYTES:  # cannot happen with the fixed keys above; stay safe anyway
        text = json.dumps({"step": int(step)})
    return text


def parse_result_message(text: str | None) -> dict[str, Any] | None:
    """``.status.result`` from a termination message, keeping only known keys of the right type and range; ``None``
    when the message is not ours (empty, not JSON, a log tail written by ``FallbackToLogsOnError``)."""
    return parse_result(text)[0]


def parse_result(text: str | None) -> tuple[dict[str, Any] | None, list[str]]:
    """:func:`parse_result_message`, and what it left out because it was out of range (``result.<key>: …``)."""
    if not text or len(text.encode()) > MAX_MESSAGE_BYTES:
        return None, []
    try:
        raw = json.loads(text)
    except ValueError:
        return None, []
    if not isinstance(raw, dict) or not _number(raw.get("step"), integer=True):
        return None, []
    dropped = _out_of_range(raw, ("step", "reward", "kl"), "result")
    if "result.step" in {problem.split(":")[0] for problem in dropped}:
        return None, dropped
    result: dict[str, Any] = {"step": int(raw["step"])}
    for key in ("reward", "kl"):
        if _number(raw.get(key)) and not any(p.startswith(f"result.{key}:") for p in dropped):
            result[key] = float(raw[key])
    tracked = raw.get("tracking")
    if isinstance(tracked, dict) and isinstance(tracked.get("runId"), str) and tracked["runId"].strip():
        result["tracking"] = {
            k: tracked[k][:MAX_TRACKING_TEXT] for k in ("runId", "url") if isinstance(tracked.get(k), str)
        }
    evaluation = raw.get("evaluation")
    if isinstance(evaluation, dict):
        out = _out_of_range(evaluation, EVALUATION_SUMMARY.values(), "result.evaluation")
        bad = {problem.split(":")[0].rsplit(".", 1)[-1] for problem in out}
        dropped += out
        kept = {
            key: (int(evaluation[key]) if key in INTEGER_KEYS else float(evaluation[key]))
            for key in EVALUATION_SUMMARY.values()
            if key not in bad and _number(evaluation.get(key), integer=key in INTEGER_KEYS)
        }
        if kept:
            result["evaluation"] = kept
    error = raw.get("evaluationError")
    if isinstance(error, str) and error.strip():
        result["evaluationError"] = one_line(error)
    output = raw.get("output")
    if (
        isinstance(output, dict)
        and isinstance(output.get("uri"), str)
        and all(
            _number(output.get(k), integer=True) and 0 <= output[k] <= MAX_STATUS_INTEGER for k in ("files", "bytes")
        )
    ):
        result["output"] = {"uri": output["uri"][:1024], "files": int(output["files"]), "bytes": int(output["bytes"])}
    export_error = raw.get(EXPORT_ERROR_KEY)
    if isinstance(export_error, dict) and isinstance(export_error.get("message"), str):
        result[EXPORT_ERROR_KEY] = {
            "reason": one_line(str(export_error.get("reason") or "ExportFailed"), 64),
            "message": one_line(export_error["message"]),
        }
    return result, dropped


def _out_of_range(values: dict[str, Any], keys: Any, where: str) -> list[str]:
    problems = []
    for key in keys:
        value = values.get(key)
        if not _number(value, integer=key in INTEGER_KEYS):
            continue
        low, high = RESULT_RANGES[key]
        if (low is not None and value < low) or (high is not None and value > high):
            expected = f"from {low}" + (f" to {high}" if high is not None else "")
            problems.append(f"{where}.{key}: expected a number {expected}, got {str(value)[:40]}")
    return problems


def _number(value: Any, integer: bool = False) -> TypeGuard[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integer:
        return isinstance(value, int) or (math.isfinite(value) and value == int(value))
    return math.isfinite(value)
