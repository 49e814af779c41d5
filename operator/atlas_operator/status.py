"""Pure status logic: the run's phase from its PyTorchJob, conditions, progress from metrics text, and
the status patch and Events that one reconciliation's :class:`Result` turns into."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from atlas_contract.metrics import PROGRESS

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


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Result:
    """What a reconciliation observed: the status fields to write and the events to post."""

    phase: str
    conditions: list[dict[str, Any]]
    children: dict[str, str] = field(default_factory=dict)
    progress: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    actions: dict[str, str] = field(default_factory=dict)  # child → created | patched | recreated
    # .status.result: the finished trainer's report to write (None: nothing new); ``result_stale``: the job it
    # came from is gone or no longer succeeded (recreated after a spec change), so a result shown is removed.
    result: dict[str, Any] | None = None
    result_stale: bool = False


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


def job_phase(job: dict[str, Any] | None, suspend: bool, queued: bool = False) -> str:
    """Pending until the job reports; then its last condition. A suspend request shows at once. A queued
    run (spec.queueName) whose job Kueue keeps suspended is Queued: Kueue, not the run, owns suspend."""
    condition = last_job_condition(job)
    phase = JOB_PHASES[condition["type"]] if condition else "Pending"
    if queued:
        held = job is not None and bool(((job.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
        if held and phase not in FINISHED:
            return "Queued"
        return phase
    if suspend and phase not in FINISHED:
        return "Suspended"
    return phase


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

    wanted = {metric: key for key, metric in PROGRESS.items()}
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


def status_update(old: dict[str, Any], generation: int | None, result: Result, at: str) -> tuple[dict, list[Event]]:
    """The status fields that changed (a merge patch, empty when nothing did) and the Events to post: one
    for a phase transition, and each of ``result.events`` that the conditions do not already say."""
    new = {
        "phase": result.phase,
        "observedGeneration": generation,
        "conditions": merge_conditions(old.get("conditions"), result.conditions, at),
        "children": result.children or None,
    }
    for cond in new["conditions"]:
        cond["observedGeneration"] = generation
    if result.progress is not None:
        progress = {k: v for k, v in (old.get("progress") or {}).items() if k != "updatedAt"}
        if progress != result.progress:
            new["progress"] = {**result.progress, "updatedAt": at}
    if result.result is not None:
        new["result"] = result.result
    elif result.result_stale:
        new["result"] = None
    patch = {key: value for key, value in new.items() if old.get(key) != value}
    for key in ("children", "progress"):  # a merge patch keeps keys it does not name: delete what is gone
        before, after = old.get(key) or {}, patch.get(key)
        if isinstance(after, dict):
            patch[key] = {**{k: None for k in before if k not in after}, **after}
    events = []
    transitioned = old.get("phase") != result.phase
    if transitioned:
        warning = result.phase in ("Failed", "Invalid")
        events.append(Event("Warning" if warning else "Normal", result.phase, transition_message(result)))
    said = {(c.get("reason"), c.get("message")) for c in old.get("conditions") or []}
    for event in result.events:
        # A Warning the transition event already says (Invalid: the problems) is not posted twice.
        carried = transitioned and event.type == "Warning" and event.message == transition_message(result)
        if (event.reason, event.message) not in said and not carried:
            events.append(event)
    return patch, events


def transition_message(result: Result) -> str:
    """Invalid/Pending: what blocks the run; otherwise what the PyTorchJob said."""
    by_type = {c["type"]: c for c in result.conditions}
    for blocking in ("Valid", "PrerequisitesMet", "SpecApplied"):
        if by_type.get(blocking, {}).get("status") == "False":
            return by_type[blocking]["message"]
    training = by_type.get("Training")
    return training["message"] if training else result.phase


def termination_message(pod: dict[str, Any] | None, container: str) -> str | None:
    """The ``state.terminated.message`` of ``container`` in ``pod``'s status (None when it has none)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    for entry in statuses:
        if isinstance(entry, dict) and entry.get("name") == container:
            terminated = (entry.get("state") or {}).get("terminated") or {}
            message = terminated.get("message") if isinstance(terminated, dict) else None
            return message if isinstance(message, str) else None
    return None


def job_has_news(job: dict[str, Any], run_status: dict[str, Any] | None) -> bool:
    """Whether a PyTorchJob says something its run's status does not show yet (its last condition)."""
    if not (job.get("status") or {}).get("conditions"):
        return False
    training = next((c for c in (run_status or {}).get("conditions") or [] if c["type"] == "Training"), {})
    return training_reason(job) != (training.get("reason"), training.get("message"))
