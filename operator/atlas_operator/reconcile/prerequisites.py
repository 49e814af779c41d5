"""What must exist before a run gets children: its backend's CRD, its checkpoint PVC, its reward ConfigMap."""

from __future__ import annotations

import time

from atlas_operator import kube
from atlas_operator.spec import Run

# spec.backend → (condition reason, what is missing, how to install it) when its CRD is not served.
JOB_CRDS = {
    "PyTorchJob": (
        "PyTorchJobCRDMissing",
        "kubeflow.org/v1 PyTorchJob CRD",
        "install the Kubeflow Training Operator v1 (kubectl apply --server-side -k "
        '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")',
    ),
    "JobSet": (
        "JobSetCRDMissing",
        "jobset.x-k8s.io/v1alpha2 JobSet CRD",
        "install JobSet v0.12.0 or later (kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml), "
        "or set spec.backend: PyTorchJob",
    ),
}


class Prerequisites:
    """Checks of what the run needs from the cluster (the CRD found is trusted for a while)."""

    def missing_prerequisites(self, run: Run) -> tuple[str, str] | None:
        if not self.crd_installed(run.backend):
            reason, what, install = JOB_CRDS[run.backend]
            return reason, f"the cluster has no {what} (spec.backend {run.backend}): {install}"
        pvc = run.spec.checkpoint.pvc
        if pvc and not self.kube.exists(kube.PVC, run.namespace, pvc):
            return "CheckpointPVCMissing", (
                f"spec.checkpoint.pvc: PersistentVolumeClaim '{pvc}' does not exist in namespace {run.namespace}"
            )
        if run.spec.reward.config_map_ref:
            ref = run.spec.reward.config_map_ref
            if not self.kube.exists(kube.CONFIG_MAP, run.namespace, ref.name):
                return "RewardConfigMapMissing", (
                    f"spec.reward.configMapRef: ConfigMap '{ref.name}' does not exist in namespace {run.namespace}"
                )
        return None

    def crd_installed(self, kind: str) -> bool:
        """Whether the API serves the job ``kind`` (PyTorchJob, JobSet); a CRD found is trusted for a while."""
        if time.monotonic() - self._crd_seen_at.get(kind, float("-inf")) < self.settings.crd_cache_s:
            return True
        if self.kube.serves(kube.JOBS[kind]):
            self._crd_seen_at[kind] = time.monotonic()
            return True
        return False
