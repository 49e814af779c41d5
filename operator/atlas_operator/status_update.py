"""The status update, pure: the run's phase from its job (as its backend reads it), conditions, progress from
metrics text, and the status patch and Events that one reconciliation's :class:`Outcome` turns into."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from atlas_contract.metrics import PROGRESS
from atlas_contract.names import CHECKPOINT_PREFIX, STOP_EXIT_CODE
from atlas_contract.results import parse_result
from atlas_contract.sources import REASONS, SOURCES_EXIT_CODE, SOURCES_MARK
from atlas_contract.stops import StopReport, parse_stop_report
from atlas_operator import backends
from atlas_operator.run_status import CHILD_KEYS, ConditionType, EventReason

FINISHED = ("Succeeded", "Failed")

# Waiting reasons the kubelet gives a container that will not start until someone fixes the run or its namespace
# (the operator holds no Secret permission: a missing pull Secret or env Secret shows up here), with what to check.
_PULL_HINT = "check the image name and spec.imagePullSecrets (each Secret must exist in the run's namespace)"
STUCK_REASONS = {
    EventReason.ERR_IMAGE_PULL: _PULL_HINT,
    EventReason.IMAGE_PULL_BACK_OFF: _PULL_HINT,
    EventReason.INVALID_IMAGE_NAME: "check spec.image and the rollout images",
    EventReason.ERR_IMAGE_NEVER_PULL: _PULL_HINT,
    EventReason.CREATE_CONTAINER_CONFIG_ERROR: (
        "check that the Secrets and ConfigMaps spec.env names exist, with those keys"
    ),
    EventReason.CREATE_CONTAINER_ERROR: "check spec.env and the image",
}


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str  # an EventReason, kept as its plain string
    message: str

    def __post_init__(self) -> None:
        self.reason = str(EventReason(self.reason))  # a reason not declared raises here, not in someone's cluster


@dataclass
class Outcome:
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
    restarts: int | None = None  # the whole-gang restarts (None: the backend restarts no gang)
    watchdog_restarts: int = 0  # of those, new ones since the last status that followed a step-watchdog exit
    # .status.preemption to write when a new save on SIGTERM was seen (None: nothing new), and how many new saves
    # that is (atlas_training_preemption_saves_total).
    preemption: dict[str, Any] | None = None
    preemption_saves: int = 0
    output: dict[str, Any] | None = None  # .status.output to write: the export the finished trainer reported
    tracking: dict[str, Any] | None = None  # .status.tracking to write: the tracking run the finished trainer reported


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_state(job: dict[str, Any] | None, gang: dict[str, Any] | None = None) -> tuple[str, str, str]:
    """(phase, reason, message) of the job that runs the trainer, as its backend reads it (``gang``: what the
    backend read beside it, Backend.read_gang)."""
    return backends.of_job(job).state(job or {}, gang)


# The Training condition's reason while Kueue holds back a queued run it had admitted (preemption, eviction).
PREEMPTED = "Preempted"


def job_ran(job: dict[str, Any] | None) -> bool:
    """Whether the job's own status shows that it ran before (a job suspended again after admission), as its backend
    reads it; False for a backend whose job keeps no such trace."""
    return job is not None and backends.of_job(job).job_ran(job)


def preempted_message(preemption: dict[str, Any] | None) -> str:
    """The Training condition's message for a run Kueue suspended again after admitting it."""
    message = (
        "Kueue suspended the job after admitting it (preemption or eviction); it resumes from its newest "
        "checkpoint when Kueue admits it again"
    )
    step = (preemption or {}).get("step")
    if step is not None:
        message += f" (the last save on SIGTERM: {CHECKPOINT_PREFIX}{step}, step {step})"
    return message


def stop_report(pod: dict[str, Any]) -> tuple[StopReport, str | None] | None:
    """The trainer's stop report in ``pod``: a container that ended (``state`` or ``lastState``, after an in-place
    restart) with exit code STOP_EXIT_CODE and a termination message that parses as one (atlas_contract.stops), with
    when it ended (``finishedAt``); the one of the highest step when several; None when there is none."""
    found: list[tuple[StopReport, str | None]] = []
    for entry in ((pod.get("status") or {}).get("containerStatuses")) or []:
        if not isinstance(entry, dict):
            continue
        for key in ("state", "lastState"):
            terminated = (entry.get(key) or {}).get("terminated")
            if not isinstance(terminated, dict) or terminated.get("exitCode") != STOP_EXIT_CODE:
                continue
            message = terminated.get("message")
            report = parse_stop_report(message) if isinstance(message, str) else None
            if report is not None:
                finished = terminated.get("finishedAt")
                found.append((report, finished if isinstance(finished, str) else None))
    return max(found, key=lambda item: item[0].step) if found else None


@dataclass(frozen=True)
class Failure:
    """Why a pod's source fetch or export failed: a reason of atlas_contract.sources.REASONS (or ExportFailed), the
    URI, and the message, as the pod's termination message says them (credentials never in it: the fetcher
    redacts them)."""

    reason: str
    uri: str
    message: str


def _failed_terminations(pod: dict[str, Any], statuses: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(container, terminated, state) of each container of ``statuses`` that ended with SOURCES_EXIT_CODE, now or
    before its restart (``lastState``) — unless it has since succeeded (an init container that ended with 0)."""
    found = []
    for entry in (pod.get("status") or {}).get(statuses) or []:
        if not isinstance(entry, dict):
            continue
        state = entry.get("state") or {}
        if (state.get("terminated") or {}).get("exitCode") == 0:
            continue
        for key in ("state", "lastState"):
            terminated = (entry.get(key) or {}).get("terminated")
            if isinstance(terminated, dict) and terminated.get("exitCode") == SOURCES_EXIT_CODE:
                found.append((str(entry.get("name")), terminated, state))
                break
    return found


def sources_failure(pod: dict[str, Any]) -> Failure | None:
    """The failure a pod's initializer reported (a server's init container, or the trainer container's first step):
    ``atlas sources: {reason, uri, message}`` in the termination message of a container that exited with
    SOURCES_EXIT_CODE; None when there is none."""
    import json

    for statuses in ("initContainerStatuses", "containerStatuses"):
        for _, terminated, _ in _failed_terminations(pod, statuses):
            message = terminated.get("message")
            if not isinstance(message, str) or not message.startswith(SOURCES_MARK):
                continue
            try:
                said = json.loads(message.removeprefix(SOURCES_MARK))
            except ValueError:
                continue
            if isinstance(said, dict) and isinstance(said.get("reason"), str):
                return Failure(str(said["reason"]), str(said.get("uri", "")), str(said.get("message", "")))
    return None


def export_failure(pod: dict[str, Any], container: str) -> Failure | None:
    """The failed export the trainer container reported (a result message with ``exportError``, exit code
    SOURCES_EXIT_CODE), or None."""
    for name, terminated, _ in _failed_terminations(pod, "containerStatuses"):
        if name != container:
            continue
        message = terminated.get("message")
        result, _ = parse_result(message if isinstance(message, str) else None)
        error = (result or {}).get("exportError")
        if error:
            return Failure(error["reason"], "", error["message"])
    return None


def save_message(report: StopReport) -> str:
    """The PreemptionSave Event's message."""
    return (
        f"every rank saved {CHECKPOINT_PREFIX}{report.step} (step {report.step}) on {report.signal} in "
        f"{report.seconds:.1f} s; training resumes from it"
    )


def job_suspended(job: dict[str, Any] | None) -> bool:
    """The job's suspend flag (``spec.suspend``, or ``spec.runPolicy.suspend`` where the job keeps it there)."""
    spec = (job or {}).get("spec") or {}
    return bool(spec.get("suspend") or (spec.get("runPolicy") or {}).get("suspend"))


def training_reason(job: dict[str, Any] | None, gang: dict[str, Any] | None = None) -> tuple[str, str]:
    """Reason and message of the run's Training condition."""
    _, reason, message = job_state(job, gang)
    return reason, message


def job_phase(
    job: dict[str, Any] | None, suspend: bool, queued: bool = False, gang: dict[str, Any] | None = None
) -> str:
    """Pending until the job reports; then what it says. A suspend request shows at once. A queued
    run (spec.queueName) whose job Kueue keeps suspended is Queued: Kueue, not the run, owns suspend."""
    phase = job_state(job, gang)[0] if job is not None else "Pending"
    if queued:
        if job is None and suspend:  # a suspended queued run holds no job
            return "Suspended"
        if job is not None and job_suspended(job) and phase not in FINISHED:
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


def status_update(
    old: dict[str, Any], generation: int | None, result: Outcome, at: str
) -> tuple[dict[str, Any], list[Event]]:
    """The status fields that changed (a merge patch, empty when nothing did) and the Events to post: one
    for a phase transition, and each of ``result.events`` that the conditions do not already say."""
    undeclared = set(result.children) - CHILD_KEYS
    if undeclared:  # the CRD's schema would prune them: a child the status cannot show is a bug, said here
        raise ValueError(f"status.children: keys not declared in run_status.Children: {sorted(undeclared)}")
    new: dict[str, Any] = {
        "phase": result.phase,
        "observedGeneration": generation,
        "conditions": merge_conditions(old.get("conditions"), result.conditions, at),
        "children": result.children or None,
    }
    if result.restarts is not None:
        new["restarts"] = result.restarts
    for cond in new["conditions"]:
        cond["observedGeneration"] = generation
    new.update(progress_patch(old, result.progress, at))
    if result.preemption is not None:
        new["preemption"] = result.preemption
    if result.result is not None:
        new["result"] = result.result
    elif result.result_stale:
        new["result"] = None
    if result.output is not None:
        new["output"] = result.output
    elif result.result_stale:
        new["output"] = None
    if result.tracking is not None:
        new["tracking"] = result.tracking
    patch: dict[str, Any] = {key: value for key, value in new.items() if old.get(key) != value}
    for key in ("children", "progress"):  # a merge patch keeps keys it does not name: delete what is gone
        before, after = old.get(key) or {}, patch.get(key)
        if isinstance(after, dict):
            patch[key] = {**{k: None for k in before if k not in after}, **after}
    events: list[Event] = []
    transitioned = old.get("phase") != result.phase
    warning = result.phase in ("Failed", "Invalid")
    # A new run's first phase, Pending, is no news: its status says it, and an Event would be one more write for every
    # run created (a Go controller posts none either). Every later change of phase is posted, and every Warning.
    if transitioned and (old.get("phase") or result.phase != "Pending"):
        events.append(Event("Warning" if warning else "Normal", EventReason(result.phase), transition_message(result)))
    said = {(c.get("reason"), c.get("message")) for c in old.get("conditions") or []}
    for event in result.events:
        # A Warning the transition event already says (Invalid: the problems) is not posted twice.
        carried = transitioned and event.type == "Warning" and event.message == transition_message(result)
        if (event.reason, event.message) not in said and not carried:
            events.append(event)
    events += evaluation_failed_events(old.get("result"), result.result)
    return patch, events


def evaluation_failed_events(old_result: dict[str, Any] | None, new_result: dict[str, Any] | None) -> list[Event]:
    """A Warning naming the evaluation's error when a result that carries one is first written: the run
    trained and Succeeded, its evaluation after training did not."""
    error = (new_result or {}).get("evaluationError")
    if not error or (old_result or {}).get("evaluationError") == error:
        return []
    return [Event("Warning", EventReason.EVALUATION_FAILED, f"the evaluation after training failed: {error}")]


def progress_patch(old: dict[str, Any], progress: dict[str, Any] | None, at: str) -> dict[str, Any]:
    """``{"progress": …}`` when the trainer's ``progress`` differs from the status's (``updatedAt`` is when it last
    changed; a key no longer reported is removed), else nothing: a run whose numbers stand still costs no write."""
    if progress is None:
        return {}
    before = old.get("progress") or {}
    if {k: v for k, v in before.items() if k != "updatedAt"} == progress:
        return {}
    return {"progress": {**{k: None for k in before if k not in progress}, **progress, "updatedAt": at}}


def transition_message(result: Outcome) -> str:
    """Invalid/Pending: what blocks the run; otherwise what the job said."""
    by_type = {c["type"]: c for c in result.conditions}
    for blocking in (ConditionType.VALID, ConditionType.PREREQUISITES_MET, ConditionType.SPEC_APPLIED):
        if by_type.get(blocking, {}).get("status") == "False":
            blocked: str = by_type[blocking]["message"]
            return blocked
    sources = by_type.get(ConditionType.SOURCES_READY, {})
    if result.phase == "Failed" and sources.get("status") == "False" and sources.get("reason") in REASONS:
        failed: str = sources["message"]  # what failed the run: the source, not the job's words
        return failed
    training = by_type.get(ConditionType.TRAINING)
    return training["message"] if training else result.phase


def pod_stuck(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) for the first container of ``pod`` (init containers first) that the kubelet keeps waiting
    for one of STUCK_REASONS, in the kubelet's words plus what to check; None when there is none."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name")
    for entry in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = ((entry or {}).get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in STUCK_REASONS:
            said = waiting.get("message") or reason
            return reason, f"pod {name}, container {entry.get('name')}: {reason}: {said}; {STUCK_REASONS[reason]}"
    return None


def termination_message(pod: dict[str, Any] | None, container: str) -> str | None:
    """The ``state.terminated.message`` of ``container`` in ``pod``'s status (None when it has none)."""
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or []
    for entry in statuses:
        if isinstance(entry, dict) and entry.get("name") == container:
            terminated = (entry.get("state") or {}).get("terminated") or {}
            message = terminated.get("message") if isinstance(terminated, dict) else None
            return message if isinstance(message, str) else None
    return None
