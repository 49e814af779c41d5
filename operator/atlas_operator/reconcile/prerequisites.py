"""What must exist before a run gets children: its backend's CRD, its checkpoint PVC, its reward ConfigMap."""

from __future__ import annotations

import threading
import time

from atlas_operator import kube
from atlas_operator.config import OperatorConfig
from atlas_operator.kube import Kube
from atlas_operator.run_status import EventReason
from atlas_operator.spec import Run

# spec.backend → (condition reason, what is missing, how to install it) when its CRD is not served.
JOB_CRDS = {
    "PyTorchJob": (
        EventReason.PYTORCHJOB_CRD_MISSING,
        "kubeflow.org/v1 PyTorchJob CRD",
        "install the Kubeflow Training Operator v1 (kubectl apply --server-side -k "
        '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")',
    ),
    "JobSet": (
        EventReason.JOBSET_CRD_MISSING,
        "jobset.x-k8s.io/v1alpha2 JobSet CRD",
        "install JobSet v0.12.0 or later (kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml), "
        "or set spec.backend: PyTorchJob",
    ),
    "TrainJob": (
        EventReason.TRAINJOB_CRD_MISSING,
        "trainer.kubeflow.org/v1alpha1 TrainJob CRD",
        "install Kubeflow Trainer v2.3.0 or later (kubectl apply --server-side -k "
        '"github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"), or set another spec.backend',
    ),
}


class Prerequisites:
    """Checks of what the run needs from the cluster. A CRD, a ClusterTrainingRuntime, a checkpoint PVC or a reward
    ConfigMap found is trusted for a while (settings.crd_cache_s): the runs of a cluster or a team need the same ones,
    and a burst of a thousand new runs reads each once, not once per run (a new run's way reads nothing else)."""

    def __init__(self, client: Kube, settings: OperatorConfig):
        self.kube = client
        self.settings = settings
        self._crd_seen_at: dict[str, float] = {}  # job kind → when its CRD was last seen served
        self._runtime_seen: dict[str, tuple[float, dict]] = {}  # ClusterTrainingRuntime → when read, as read
        self._found_at: dict[tuple[str, str, str], float] = {}  # (plural, namespace, name) → when last found
        self._looking: dict[tuple[str, str, str], threading.Lock] = {}  # one look at a time for each object
        self._lock = threading.Lock()

    def missing(self, run: Run) -> tuple[EventReason, str] | None:
        """The reason and message of the first prerequisite the run lacks, or None."""
        if not self.crd_installed(run.backend):
            reason, what, install = JOB_CRDS[run.backend]
            return reason, f"the cluster has no {what} (spec.backend {run.backend}): {install}"
        if run.backend == "TrainJob":
            missing = self.runtime_problem(run)
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
        """Whether the API serves the job ``kind`` (PyTorchJob, JobSet); a CRD found is trusted for a while."""
        if time.monotonic() - self._crd_seen_at.get(kind, float("-inf")) < self.settings.crd_cache_s:
            return True
        if self.kube.serves(kube.JOBS[kind]):
            self._crd_seen_at[kind] = time.monotonic()
            return True
        return False

    def crd_gone(self, kind: str) -> None:
        """The job ``kind``'s CRD was found uninstalled (a 404 on create): not trusted any more."""
        self._crd_seen_at.pop(kind, None)

    def runtime_problem(self, run: Run) -> tuple[EventReason, str] | None:
        """What keeps a TrainJob run off its ClusterTrainingRuntime: the runtime missing, or a spec.maxRestarts the
        runtime does not have (a TrainJob cannot set its JobSet's failurePolicy: the runtime's applies)."""
        name = self.settings.images.trainjob_runtime
        seen_at, runtime = self._runtime_seen.get(name, (float("-inf"), None))
        if time.monotonic() - seen_at >= self.settings.crd_cache_s:  # a runtime found is trusted for a while too
            runtime = self.kube.get_fresh(kube.CLUSTER_TRAINING_RUNTIME, "", name)
            if runtime is not None:
                self._runtime_seen[name] = (time.monotonic(), runtime)
        if runtime is None:
            return EventReason.TRAINING_RUNTIME_MISSING, (
                f"the cluster has no ClusterTrainingRuntime {name} (spec.backend TrainJob): install it with the chart "
                "(value trainJob.runtime.enabled: true), or point the operator at yours (ATLAS_TRAINJOB_RUNTIME)"
            )
        policy = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("failurePolicy") or {}
        restarts = int(policy.get("maxRestarts") or 0)
        if run.spec.max_restarts != restarts:
            return EventReason.MAX_RESTARTS_NOT_THE_RUNTIMES, (
                f"spec.maxRestarts: {run.spec.max_restarts}, but on backend TrainJob whole-gang restarts are the "
                f"ClusterTrainingRuntime {name}'s (template.spec.failurePolicy.maxRestarts: {restarts}; chart value "
                f"trainJob.runtime.maxRestarts): set spec.maxRestarts: {restarts}, or use another backend"
            )
        return None
