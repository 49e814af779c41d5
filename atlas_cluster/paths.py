"""Where the local Kubernetes keeps its files: binaries per machine, one folder per cluster."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CLUSTER = "atlas"


def cache_root() -> Path:
    """``$ATLAS_CACHE_DIR``, else ``~/.cache/atlas`` (the same root as the builtin models')."""
    return Path(os.environ.get("ATLAS_CACHE_DIR") or Path.home() / ".cache" / "atlas")


def kube_root() -> Path:
    return cache_root() / "kube"


def cluster_dir(name: str = DEFAULT_CLUSTER) -> Path:
    """A named cluster's folder: kubeconfigs, certificates, etcd's data, logs, and its processes' pid file."""
    return kube_root() / "clusters" / name
