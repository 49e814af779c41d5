"""Where the local Kubernetes keeps its files: binaries per machine, one folder per cluster."""

from __future__ import annotations

from pathlib import Path

from atlas_contract.cache import cache_root  # the builtin models' root too

DEFAULT_CLUSTER = "atlas"


def kube_root() -> Path:
    return cache_root() / "kube"


def cluster_dir(name: str = DEFAULT_CLUSTER) -> Path:
    """A named cluster's folder: kubeconfigs, certificates, etcd's data, logs, and its processes' pid file."""
    return kube_root() / "clusters" / name
