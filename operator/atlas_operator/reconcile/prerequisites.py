"""What must exist before a run gets children: its backend's CRD (and what else its backend needs), its checkpoint
PVC, its reward ConfigMap."""

from __future__ import annotations

import threading
import time
from typing import Any

from atlas_operator import backends, kube
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import Kube
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run

# spec.backend → (condition reason, what is missing, how to install it) when its CRD is not served.
JOB_CRDS = {kind: backend.crd for kind, backend in backends.BACKENDS.items()}


class Prerequisites:
    """Checks of what the run needs from the cluster. A CRD, an object its backend reads, a checkpoint PVC or a reward
    ConfigMap found is trusted for a while (settings.crd_cache_s): the runs of a cluster or a team need the same ones,
    and a burst of a thousand new runs reads each once, not once per run (a new run's way reads nothing else)."""

    def __init__(self, client: Kube, settings: OperatorConfig):
        self.kube = client
        self.settings = settings
        self._crd_seen_at: dict[str, float] = {}  # job kind → when its CRD was last seen served
        self._read_seen: dict[str, tuple[float, dict[str, Any]]] = {}  # "<plural>/<name>" → when read, as read
        self._found_at: dict[tuple[str, str, str], float] = {}  # (plural, namespace, name) → when last found
        self._looking: dict[tuple[str, str, str], threading.Lock] = {}  # one look at a time for each object
        self._lock = threading.Lock()

    def missing(self, run: Run) -> tuple[EventReason, str] | None:
        """The reason and message of the first prerequisite the run lacks, or None."""
        backend = backends.for_run(run)
        if not self.crd_installed(run.backend):
            reason, what, install = backend.crd
            return reason, f"the cluster has no {what} (spec.backend {run.backend}): {install}"
        missing = backend.prerequisite_problem(run, self.settings.images, self.read_trusted)
        if missing:
            return missing
        pvc = run.spec.checkpoint.pvc
        if pvc and not self.found(kube.PVC, run.namespace, pvc):
            return EventReason.CHECKPOINT_PVC_MISSING, (
                f"spec.checkpoint.pvc: PersistentVolumeClaim '{pvc}' does not exist in namespace {run.namespace}"
            )
        if run.spec.reward.config_map_ref:
            ref = run.spec.reward.config_map_ref
            if not self.found(kube.CONFIG_MAP, run.namespace, ref.name):
                return EventReason.REWARD_CONFIG_MAP_MISSING, (
                    f"spec.reward.configMapRef: ConfigMap '{ref.name}' does not exist in namespace {run.namespace}"
                )
        return None

    def found(self, resource: kube.Resource, namespace: str, name: str) -> bool:
        """Whether the object exists; one found is trusted for a while: the runs created within that while after its
        deletion get their children, and their pods wait (Pending) until it exists again."""
        key = (resource.plural, namespace, name)
        with self._lock:
            looking = self._looking.setdefault(key, threading.Lock())
        with looking:  # the handler threads of a burst of new runs wait for the first one's look, not each its own
            if time.monotonic() - self._found_at.get(key, float("-inf")) < self.settings.crd_cache_s:
                return True
            if self.kube.exists(resource, namespace, name):
                self._found_at[key] = time.monotonic()
                return True
            self._found_at.pop(key, None)
            return False

    def crd_installed(self, kind: str) -> bool:
        """Whether the API serves the job ``kind`` (a backend's); a CRD found is trusted for a while."""
        if time.monotonic() - self._crd_seen_at.get(kind, float("-inf")) < self.settings.crd_cache_s:
            return True
        if self.kube.serves(backends.BACKENDS[kind].resource):
            self._crd_seen_at[kind] = time.monotonic()
            return True
        return False

    def crd_gone(self, kind: str) -> None:
        """The job ``kind``'s CRD was found uninstalled (a 404 on create): not trusted any more."""
        self._crd_seen_at.pop(kind, None)

    def read_trusted(self, resource: kube.Resource, name: str) -> dict[str, Any] | None:
        """A cluster-scoped object a backend needs (a ClusterTrainingRuntime), read from etcd; one found is trusted,
        as read, for a while too."""
        key = f"{resource.plural}/{name}"
        seen_at, found = self._read_seen.get(key, (float("-inf"), None))
        if time.monotonic() - seen_at >= self.settings.crd_cache_s:
            found = self.kube.get_fresh(resource, "", name)
            if found is not None:
                self._read_seen[key] = (time.monotonic(), found)
        return found
