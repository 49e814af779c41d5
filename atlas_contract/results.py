"""What a finished run reports: the trainer writes it, the operator copies it into ``.status.result``.

The trainer's rank 0 writes :func:`result_message` to ``$ATLAS_RESULT_FILE`` (the Master container's
``terminationMessagePath``); Kubernetes copies that file into the finished pod's
``status.containerStatuses[].state.terminated.message`` (at most 4096 bytes), and the operator
reads it back with :func:`parse_result_message`. Keys are camelCase, as the status shows them.
"""

from __future__ import annotations

import json
import math
from typing import Any

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
    step: int, reward: float | None, evaluation: dict[str, Any] | None = None, evaluation_error: str | None = None
) -> str:
    """The termination message of a finished trainer: compact JSON, always under the size limit.
    ``evaluation_error``: the evaluation after training failed (the trained run did not)."""
    result: dict[str, Any] = {"step": int(step)}
    if reward is not None and math.isfinite(reward):
        result["reward"] = round(float(reward), 6)
    if evaluation:
        result["evaluation"] = {
            k: (round(float(v), 6) if isinstance(v, float) else v) for k, v in evaluation_summary(evaluation).items()
        }
    if evaluation_error:
        result["evaluationError"] = one_line(evaluation_error)
    text = json.dumps(result, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_MESSAGE_BYTES:  # cannot happen with the fixed keys above; stay safe anyway
        text = json.dumps({"step": int(step)})
    return text


def parse_result_message(text: str | None) -> dict[str, Any] | None:
    """``.status.result`` from a termination message, keeping only known keys of the right type; ``None``
    when the message is not ours (empty, not JSON, a log tail written by ``FallbackToLogsOnError``)."""
    if not text or len(text.encode()) > MAX_MESSAGE_BYTES:
        return None
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not isinstance(raw, dict) or not _number(raw.get("step"), integer=True):
        return None
    result: dict[str, Any] = {"step": int(raw["step"])}
    if _number(raw.get("reward")):
        result["reward"] = float(raw["reward"])
    evaluation = raw.get("evaluation")
    if isinstance(evaluation, dict):
        kept = {
            key: (int(evaluation[key]) if key in INTEGER_KEYS else float(evaluation[key]))
            for key in EVALUATION_SUMMARY.values()
            if _number(evaluation.get(key), integer=key in INTEGER_KEYS)
        }
        if kept:
            result["evaluation"] = kept
    error = raw.get("evaluationError")
    if isinstance(error, str) and error.strip():
        result["evaluationError"] = one_line(error)
    return result


def _number(value: Any, integer: bool = False) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if integer:
        return isinstance(value, int) or (math.isfinite(value) and value == int(value))
    return math.isfinite(value)
