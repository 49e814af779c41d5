"""The run's experiment tracking as its status shows it, pure: ``.status.tracking`` and condition Tracking from what
the Running trainer's ``/metrics`` says (``atlas_tracking_up``, ``atlas_tracking_run_info``:
atlas_core/training/tracking.py) or the finished trainer's result; a Warning Event when the server stops answering.
Only spec.tracking.mlflow has a server to answer: W&B's client keeps its own queue (and offline mode has none)."""

from __future__ import annotations

import math
from typing import Any

from atlas_contract.tracking import MLFLOW
from atlas_operator.run_status import ConditionType, EventReason

UP_METRIC = "atlas_tracking_up"
RUN_METRIC = "atlas_tracking_run_info"
LOGGING = "Logging"  # condition Tracking's reason while the server takes the steps
LOGGED = "Logged"  # ... once the finished trainer reported its tracking run
WAITING = "Waiting"  # ... before the trainer reported anything


def parse_tracking(metrics_text: str, run: str, namespace: str) -> dict[str, Any] | None:
    """``{up, runId?, url?}`` of ``run``'s MLflow logging from Prometheus text; None when the trainer says nothing
    of it (tracking off, or not started yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    seen: dict[str, Any] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name not in (UP_METRIC, RUN_METRIC) or labels.get("backend") != MLFLOW:
                continue
            if labels.get("run", run) != run or labels.get("namespace", namespace) != namespace:
                continue
            if sample.value is None or math.isnan(sample.value):
                continue
            if sample.name == UP_METRIC:
                seen["up"] = sample.value >= 1
            elif labels.get("run_id"):
                seen["runId"] = labels["run_id"][:1024]
                if labels.get("url"):
                    seen["url"] = labels["url"][:1024]
    return seen if "up" in seen else None


def tracking_condition(uri: str, seen: dict[str, Any] | None, finished: dict[str, str] | None) -> dict[str, Any]:
    """Condition Tracking for a run tracked at ``uri``: the finished trainer's run (``finished``), else what the
    Running trainer says (``seen``), else Waiting."""
    if finished:
        return _condition(True, LOGGED, f"MLflow run {finished['runId']} at {finished.get('url') or uri}")
    if seen is None:
        return _condition(False, WAITING, f"the trainer logs to MLflow at {uri} once it trains")
    if seen["up"]:
        where = f"MLflow run {seen['runId']} at {seen.get('url') or uri}" if seen.get("runId") else f"MLflow at {uri}"
        return _condition(True, LOGGING, f"the trainer logs to {where}")
    return _condition(
        False,
        EventReason.TRACKING_UNREACHABLE,
        f"MLflow at {uri} does not answer the trainer; training goes on and its steps are logged when it is back",
    )


def _condition(ok: bool, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": str(ConditionType.TRACKING),
        "status": "True" if ok else "False",
        "reason": str(reason),
        "message": message,
    }


def tracked_uri(spec: dict[str, Any]) -> str | None:
    """spec.tracking.mlflow.uri of a run's raw spec, or None."""
    mlflow = ((spec or {}).get("tracking") or {}).get("mlflow") or {}
    uri = mlflow.get("uri")
    return uri if isinstance(uri, str) else None


def running_update(
    status: dict[str, Any], spec: dict[str, Any], seen: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, dict[str, str] | None, tuple[str, str] | None]:
    """What a Running run's scrape changes: (condition Tracking when it differs from the shown one, ``.status.tracking``
    when the trainer names a run the status does not show yet, the Warning Event ``(reason, message)`` of a server
    that just stopped answering). Nothing for a run without spec.tracking.mlflow, or when the trainer said nothing."""
    uri = tracked_uri(spec)
    if uri is None or seen is None:
        return None, None, None
    new = tracking_condition(uri, seen, None)
    shown = next((c for c in status.get("conditions") or [] if c.get("type") == ConditionType.TRACKING), None)
    changed = shown is None or any(shown.get(k) != new[k] for k in ("status", "reason", "message"))
    reference = {k: seen[k] for k in ("runId", "url") if seen.get(k)}
    tracking = reference if reference.get("runId") and (status.get("tracking") or {}) != reference else None
    warning = (str(new["reason"]), new["message"]) if changed and new["status"] == "False" else None
    return (new if changed else None), tracking, warning
