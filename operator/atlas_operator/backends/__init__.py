"""The backends a run's trainer can run on (spec.backend), one module each behind one protocol
(``protocol.Backend``): ``pytorchjob`` (Kubeflow Training Operator), ``jobset`` (JobSet) and ``trainjob`` (Kubeflow
Trainer v2). The rest of the operator asks this registry for the run's backend (:func:`for_run`), a job's
(:func:`by_kind`, :func:`of_job`) or the one a run's status names (:func:`job_child`), and never names a kind.

A fourth backend: one module here (a class of the protocol, registered in ``BACKENDS``), its tests, and what the API
and the cluster name (docs/architecture.md, "Backends"): its value in spec.backend's enum (atlas_operator/spec.py)
and CEL rules (atlas_operator/cel_rules.py), its status.children key and CRD-missing reason
(atlas_operator/run_status.py), its API resource (atlas_operator/kube.py) and its RBAC
(charts/atlas-operator/files/rbac-rules.yaml).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from atlas_operator.backends.jobset import JOBSET
from atlas_operator.backends.protocol import Backend, CrdRequirement, JobState
from atlas_operator.backends.pytorchjob import PYTORCHJOB
from atlas_operator.backends.trainjob import TRAINJOB
from atlas_operator.kube import Resource
from atlas_operator.spec import Run

#: spec.backend → its backend; the first is the one a job of no known kind is read as.
BACKENDS: dict[str, Backend] = {backend.kind: backend for backend in (PYTORCHJOB, JOBSET, TRAINJOB)}

__all__ = [
    "BACKENDS",
    "Backend",
    "CrdRequirement",
    "JobState",
    "by_kind",
    "checkpoint_warning",
    "for_run",
    "job_child",
    "of_job",
    "registered",
    "watched_resources",
]


def for_run(run: Run) -> Backend:
    """The run's backend (spec.backend, or the operator's default)."""
    return BACKENDS[run.backend]


def by_kind(kind: str | None) -> Backend | None:
    """The backend whose job is of ``kind``, or None."""
    return BACKENDS.get(kind) if kind else None


def of_job(job: dict[str, Any] | None) -> Backend:
    """The backend of ``job`` (by its kind); the first backend's for None or a kind none has."""
    return by_kind((job or {}).get("kind")) or next(iter(BACKENDS.values()))


def job_child(children: dict[str, Any]) -> tuple[Backend, str] | None:
    """The backend a run's job was made on and the job's name, from its status.children; None before it has one."""
    for backend in BACKENDS.values():
        name = children.get(backend.child_key)
        if name:
            return backend, name
    return None


def job_child_keys() -> frozenset[str]:
    """The status.children keys of every backend's job."""
    return frozenset(backend.child_key for backend in BACKENDS.values())


def watched_resources() -> tuple[Resource, ...]:
    """What the backends ask the operator to watch, each once, in the backends' order."""
    seen: dict[str, Resource] = {}
    for backend in BACKENDS.values():
        for resource in backend.watched:
            seen.setdefault(resource.plural, resource)
    return tuple(seen.values())


def checkpoint_warning(run: Run) -> str | None:
    """Why the run's restarts cannot resume (no spec.checkpoint.pvc), or None."""
    return for_run(run).checkpoint_warning(run)


@contextmanager
def registered(backend: Backend) -> Iterator[Backend]:
    """``backend`` in the registry while the block runs (a backend under test)."""
    BACKENDS[backend.kind] = backend
    try:
        yield backend
    finally:
        del BACKENDS[backend.kind]
