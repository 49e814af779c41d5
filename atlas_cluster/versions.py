"""The one file that pins the real Kubernetes this project is proven on: the control plane built from the upstream
Go modules, and the modules whose CRDs a local cluster installs.

Change a version here and nowhere else: the build (atlas_cluster/build.py) keys its cache folder on these, so a new
pin builds anew beside the old one, and the backends' CRDs are read from the modules at these versions.
"""

from __future__ import annotations

from dataclasses import dataclass

# Control plane.
KUBERNETES = "v1.36.3"  # k8s.io/kubernetes: kube-apiserver, kube-controller-manager
ETCD = "v3.6.14"  # go.etcd.io/etcd/server/v3
GO_MINIMUM = (1, 26)  # what k8s.io/kubernetes v1.36's go.mod asks for

# The backends whose CRDs `atlas cluster up` installs (their controllers are not run by the control plane).
JOBSET = "v0.12.0"  # sigs.k8s.io/jobset
TRAINER = "v2.3.0"  # github.com/kubeflow/trainer/v2
TRAINING_OPERATOR = "v1.9.4"  # github.com/kubeflow/training-operator (PyTorchJob)


@dataclass(frozen=True)
class CrdModule:
    """A Go module whose tree holds a backend's CRDs, and the files to install from it."""

    name: str
    module: str
    version: str
    files: tuple[str, ...]


BACKEND_CRDS: tuple[CrdModule, ...] = (
    CrdModule(
        "training-operator",
        "github.com/kubeflow/training-operator",
        TRAINING_OPERATOR,
        ("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",),
    ),
    CrdModule("jobset", "sigs.k8s.io/jobset", JOBSET, ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",)),
    CrdModule(
        "trainer",
        "github.com/kubeflow/trainer/v2",
        TRAINER,
        (
            "manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml",
            "manifests/base/crds/trainer.kubeflow.org_trainingruntimes.yaml",
            "manifests/base/crds/trainer.kubeflow.org_clustertrainingruntimes.yaml",
        ),
    ),
)


def control_plane_key() -> str:
    """The cache folder's name: every version its binaries are built from."""
    return f"kubernetes-{KUBERNETES}_etcd-{ETCD}"
