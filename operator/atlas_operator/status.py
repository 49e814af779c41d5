"""Pure status logic: the run's phase from its PyTorchJob, conditions, and progress from metrics text."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

# PyTorchJob condition type → run phase (design.md: Restarting counts as Running).
JOB_PHASES = {
    "Created": "Pending",
    "Running": "Running",
    "Restarting": "Running",
    "Succeeded": "Succeeded",
    "Failed": "Failed",
    "Suspended": "Suspended",
}
FINISHED = ("Succeeded", "Failed")
PROGRESS_METRICS = {"step": "atlas_training_step", "reward": "atlas_training_reward", "kl": "atlas_training_kl"}


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def last_job_condition(job: dict[str, Any] | None) -> dict[str, Any] | None:
    """The PyTorchJob's newest condition whose status is True (Kubeflow appends them in order)."""
    conditions = ((job or {}).get("status") or {}).get("conditions") or []
    true = [c for c in conditions if c.get("status") == "True" and c.get("type") in JOB_PHASES]
    return true[-1] if true else None


def training_reason(job: dict[str, Any] | None) -> tuple[str, str]:
    """Reason and message of the run's Training condition: the job's last condition, in its words."""
    last = last_job_condition(job)
    if last is None:
        return "JobPending", "waiting for the PyTorchJob to start"
    return last["type"], last.get("message") or f"PyTorchJob {last['type']}"


def job_phase(job: dict[str, Any] | None, suspend: bool) -> str:
    """Pending until the job reports; then its last condition. A suspend request shows at once."""
    condition = last_job_condition(job)
    phase = JOB_PHASES[condition["type"]] if condition else "Pending"
    if suspend and phase not in FINISHED:
        return "Suspended"
    return phase


def condition(type_: str, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def merge_conditions(old: list[dict[str, Any]] | None, new: list[dict[str, Any]], at: str) -> list[dict[str, Any]]:
    """Conditions in ``new`` replace those of the same type; lastTransitionTime moves only when the
    status changes, so an unchanged condition writes nothing."""
    by_type = {c["type"]: dict(c) for c in old or []}
    for cond in new:
        previous = by_type.get(cond["type"])
        merged = {k: v for k, v in cond.items() if v is not None}
        if previous and previous.get("status") == cond["status"] and previous.get("lastTransitionTime"):
            merged["lastTransitionTime"] = previous["lastTransitionTime"]
        else:
            merged["lastTransitionTime"] = at
        by_type[cond["type"]] = merged
    return list(by_type.values())


def parse_progress(metrics_text: str, run: str, namespace: str) -> dict[str, Any]:
    """step/reward/kl of ``run`` from Prometheus text; metrics that are absent (KL at beta 0) or NaN
    are left out. Samples labelled for another run are ignored."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {metric: key for key, metric in PROGRESS_METRICS.items()}
    progress: dict[str, Any] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is None:
                continue
            labels = sample.labels
            if labels.get("run", run) != run or labels.get("namespace", namespace) != namespace:
                continue
            if sample.value is None or math.isnan(sample.value) or math.isinf(sample.value):
                continue
            progress[key] = int(sample.value) if key == "step" else round(float(sample.value), 6)
    return progress
