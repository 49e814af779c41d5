"""What every rendered object carries: its name, namespace and labels, the selectors of a run's pods, and which
servers a run has."""

from __future__ import annotations

from typing import Any

from atlas_contract.names import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
    QUEUE_NAME_LABEL,
)
from atlas_operator.spec import AtlasTeacherSpec, Run, StudentSpec


def has_student_server(run: Run) -> bool:
    return isinstance(run.spec, AtlasTeacherSpec) and bool(run.spec.student and run.spec.student.rollout.replicas)


def student(run: Run) -> StudentSpec:
    """A teacher run's student, for what renders the student's server (a teacher run has one: parse_run requires
    it)."""
    assert isinstance(run.spec, AtlasTeacherSpec) and run.spec.student is not None, "only a teacher run has a student"
    return run.spec.student


def labels(run: Run, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "atlas",
        LABEL_INSTANCE: run.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def with_queue_label(run: Run, pod_labels: dict[str, str]) -> dict[str, str]:
    """Pods of a queued run that run beside its job (the server Deployments): Kueue admits each pod on its own (not
    with the job's gang)."""
    if run.spec.queue_name:
        pod_labels[QUEUE_NAME_LABEL] = run.spec.queue_name
    return pod_labels


def pod_selector(run: Run, component: str) -> dict[str, str]:
    return {LABEL_INSTANCE: run.name, LABEL_COMPONENT: component}


def child_metadata(run: Run, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": run.namespace, "labels": labels(run, component)}
