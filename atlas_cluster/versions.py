"""The one file that pins the real Kubernetes this project is proven on: the control plane built from the upstream
Go modules, the modules whose CRDs a local cluster installs, the S3-compatible server it can run, and kube-score (the
tests' judge of the manifests).

Change a version here and nowhere else: the build (atlas_cluster/build.py) keys its cache folder on these, so a new
pin builds anew beside the old one, and the backends' CRDs are read from the modules at these versions.
"""

from __future__ import annotations

from dataclasses import dataclass

# Control plane.
KUBERNETES = "v1.36.3"  # k8s.io/kubernetes: kube-apiserver, kube-controller-manager
ETCD = "v3.6.14"  # go.etcd.io/etcd/server/v3
GO_MINIMUM = (1, 26)  # what k8s.io/kubernetes v1.36's go.mod asks for

# The backends whose CRDs `atlas cluster up` installs, and whose controllers it runs when asked
# (`--controllers`, atlas_cluster/controllers.py).
JOBSET = "v0.12.0"  # sigs.k8s.io/jobset
TRAINER = "v2.3.0"  # github.com/kubeflow/trainer/v2
TRAINING_OPERATOR = "v1.9.4"  # github.com/kubeflow/training-operator (PyTorchJob)
KUEUE = "v0.19.2"  # sigs.k8s.io/kueue

# The S3-compatible server of `atlas cluster up --s3` and of the tests' fixture (atlas_cluster/s3.py): Versity's S3
# Gateway on its POSIX backend (a bucket is a top-level folder of its data folder), built from its module.
VERSITYGW = "v1.8.0"  # github.com/versity/versitygw (go 1.25)
VERSITYGW_MODULE = "github.com/versity/versitygw"
VERSITYGW_PACKAGE = "github.com/versity/versitygw/cmd/versitygw"

# The outside judge of the manifests the project writes (tests/training/test_kube_score.py): kube-score over
# `helm template` of the chart and `atlas render` of every example, built from its module like the S3 server.
KUBE_SCORE = "v1.20.0"  # github.com/zegl/kube-score
KUBE_SCORE_MODULE = "github.com/zegl/kube-score"
KUBE_SCORE_PACKAGE = "github.com/zegl/kube-score/cmd/kube-score"


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


@dataclass(frozen=True)
class Controller:
    """A backend's upstream controller, built from its module (``package``, the main package, into ``binary``) and
    installed as its module's kustomize tree would install it: ``rbac`` and ``webhooks`` are files of that tree (a
    ``kustomization.yaml`` stands for its ``resources``), put in ``namespace`` with ``name_prefix`` on every name,
    as the tree's default overlay does, and with the patches and replacements of the ``kustomization.yaml`` beside
    the webhook manifests. ``crds``: CRD files only this controller needs; the CRDs of the kinds the
    operator makes (PyTorchJob, JobSet, TrainJob) stay in BACKEND_CRDS and are installed on every cluster."""

    name: str
    module: str
    version: str
    package: str
    binary: str
    namespace: str
    name_prefix: str
    rbac: tuple[str, ...]
    webhooks: tuple[str, ...]
    crds: tuple[str, ...] = ()


CONTROLLERS: dict[str, Controller] = {
    c.name: c
    for c in (
        Controller(
            "jobset",
            "sigs.k8s.io/jobset",
            JOBSET,
            "sigs.k8s.io/jobset",  # the module root is its main package
            "jobset-controller-manager",
            "jobset-system",
            "jobset-",
            ("config/components/rbac/kustomization.yaml",),
            ("config/components/webhook/manifests.yaml",),
        ),
        Controller(
            "kueue",
            "sigs.k8s.io/kueue",
            KUEUE,
            "sigs.k8s.io/kueue/cmd/kueue",
            "kueue",
            "kueue-system",
            "kueue-",
            ("config/components/rbac/kustomization.yaml",),
            ("config/components/webhook/manifests.yaml",),
            crds=("config/components/crd/kustomization.yaml",),
        ),
        Controller(
            "trainer",
            "github.com/kubeflow/trainer/v2",
            TRAINER,
            "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
            "trainer-controller-manager",
            "kubeflow-system",
            "",
            ("manifests/base/rbac/kustomization.yaml",),
            ("manifests/base/webhook/manifests.yaml",),
        ),
        Controller(
            "training-operator",
            "github.com/kubeflow/training-operator",
            TRAINING_OPERATOR,
            "github.com/kubeflow/training-operator/cmd/training-operator.v1",
            "training-operator",
            "kubeflow",
            "",
            (
                "manifests/base/rbac/service-account.yaml",
                "manifests/base/rbac/role.yaml",
                "manifests/base/rbac/cluster-role-binding.yaml",
            ),
            ("manifests/base/webhook/manifests.yaml",),
        ),
    )
}


def control_plane_key() -> str:
    """The cache folder's name: every version its binaries are built from."""
    return f"kubernetes-{KUBERNETES}_etcd-{ETCD}"


def s3_server_key() -> str:
    """The S3 server's cache folder's name: a new pin builds anew beside the old one."""
    return f"versitygw-{VERSITYGW}"


def kube_score_key() -> str:
    """kube-score's cache folder's name: a new pin builds anew beside the old one."""
    return f"kube-score-{KUBE_SCORE}"


def controller_key(controller: Controller) -> str:
    """A controller's cache folder's name: one per controller and version, so a new pin of one rebuilds that one."""
    return f"{controller.name}-{controller.version}"
