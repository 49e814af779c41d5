"""What a backend is: the one thing that differs between the workloads that can run a run's trainer (spec.backend).

A backend renders its job from the backend-neutral pieces (atlas_operator/render/), turns its job's state into the
run's phase, restarts and result, and says what it needs from the cluster (its CRD, anything else) and which API
resources it creates or reads (the operator's watch list and RBAC). Everything else in the operator asks the registry
(atlas_operator/backends/__init__.py) instead of naming a kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from atlas_operator.config import Images
from atlas_operator.kube import Kube, Resource
from atlas_operator.render.trainer import TrainerShape
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run

#: (phase, reason, message) of the job that runs the trainer.
JobState = tuple[str, str, str]
#: A cluster-scoped or namespaced object read through the prerequisites' cache: (resource, name) → object or None.
CachedRead = Callable[[Resource, str], "dict[str, Any] | None"]


class CrdRequirement(NamedTuple):
    """The condition reason, what is missing and how to install it, when the backend's job CRD is not served."""

    reason: EventReason
    what: str
    install: str


class Backend(Protocol):
    """One backend of spec.backend (read-only: a backend is a module's constant)."""

    @property
    def kind(self) -> str:
        """spec.backend's value, and its job's kind."""
        ...

    @property
    def resource(self) -> Resource:
        """The job's API resource (created, patched, deleted, watched)."""
        ...

    @property
    def child_key(self) -> str:
        """The job's key in status.children."""
        ...

    @property
    def watched(self) -> tuple[Resource, ...]:
        """What the operator watches for a run on this backend, the job first (objects that carry the run's labels)."""
        ...

    @property
    def reads(self) -> tuple[Resource, ...]:
        """What it only reads, never watches (a prerequisite)."""
        ...

    @property
    def crd(self) -> CrdRequirement: ...

    @property
    def servers_in_job(self) -> bool:
        """The vLLM servers run as pods of the job (reached at their stable hostnames), not as Deployments beside it."""
        ...

    @property
    def trainer(self) -> TrainerShape:
        """What the job's controller asks of the trainer's pod."""
        ...

    @property
    def rank0_labels(self) -> Mapping[str, str]:
        """The labels of the trainer's rank-0 pod only (the metrics Service's selector)."""
        ...

    def render_job(self, run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
        """The run's job; ``config`` is the run's ConfigMap (its checksum goes into the trainer's pod template)."""
        ...

    def checkpoint_warning(self, run: Run) -> str | None:
        """Why the run's restarts cannot resume on this backend, or None."""
        ...

    def prerequisite_problem(self, run: Run, images: Images, read: CachedRead) -> tuple[EventReason, str] | None:
        """What else (beside its CRD) the run lacks on this backend, or None."""
        ...

    def state(self, job: dict[str, Any], gang: dict[str, Any] | None) -> JobState:
        """The job's (phase, reason, message); ``gang``: the object :meth:`read_gang` read for it."""
        ...

    def job_ran(self, job: dict[str, Any]) -> bool:
        """Whether the job's own status shows that its pods ran before (a job suspended again after admission)."""
        ...

    def read_gang(self, client: Kube, namespace: str, job: dict[str, Any]) -> dict[str, Any] | None:
        """An object the job's controller made of it whose state is the run's too, or None."""
        ...

    def restarting_gang(self, job: dict[str, Any], gang: dict[str, Any] | None) -> dict[str, Any] | None:
        """The JobSet that restarts the run's whole gang (its restarts are the run's), or None."""
        ...

    def watchdog_restarts(self, gang: dict[str, Any], run_status: dict[str, Any] | None) -> int:
        """Of the gang's restarts since ``run_status`` showed them, those that followed a step-watchdog exit."""
        ...

    def servers_waiting(self, job: dict[str, Any]) -> list[str]:
        """The job's servers not Ready yet (``servers_in_job``), as ``<name> <ready>/<replicas> ready``."""
        ...

    def generated_files(self, dump: Callable[[dict[str, Any]], str]) -> dict[str, str]:
        """Files of the repository generated from the backend (python -m atlas_operator.generate): repository-relative
        path → content; ``dump`` writes a document as every generated YAML file is written."""
        ...

    def rank0_pod(self, client: Kube, run: Run, job: dict[str, Any]) -> dict[str, Any] | None:
        """The trainer's rank-0 pod of ``job`` (its result is in its termination message), or None."""
        ...

    def run_name_of(self, obj: dict[str, Any]) -> str | None:
        """The run's name for a watched object a run does not control (its job's controller made it), else None."""
        ...

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        """The job's ``spec`` patch that sets its suspend flag."""
        ...


class JobBackend:
    """What most backends share, for a backend class to override: no gang, no other prerequisite, servers beside
    the job, ``spec.suspend``."""

    reads: tuple[Resource, ...] = ()
    servers_in_job = False

    def prerequisite_problem(self, run: Run, images: Images, read: CachedRead) -> tuple[EventReason, str] | None:
        return None

    def job_ran(self, job: dict[str, Any]) -> bool:
        return False

    def read_gang(self, client: Kube, namespace: str, job: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def restarting_gang(self, job: dict[str, Any], gang: dict[str, Any] | None) -> dict[str, Any] | None:
        return None

    def watchdog_restarts(self, gang: dict[str, Any], run_status: dict[str, Any] | None) -> int:
        return 0

    def servers_waiting(self, job: dict[str, Any]) -> list[str]:
        return []

    def run_name_of(self, obj: dict[str, Any]) -> str | None:
        return None

    def generated_files(self, dump: Callable[[dict[str, Any]], str]) -> dict[str, str]:
        return {}

    def suspend_patch(self, suspend: bool) -> dict[str, Any]:
        return {"suspend": suspend}
