"""The one cache root of every builder here: the builtin models (atlas_core/models/cache.py) and the local
Kubernetes' binaries and clusters (atlas_cluster/paths.py), helm and kubectl (atlas_cluster/helm_kubectl.py)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_root() -> Path:
    """``~/.cache/atlas``: the root when ``$ATLAS_CACHE_DIR`` is not set."""
    return Path.home() / ".cache" / "atlas"


def cache_root() -> Path:
    """``$ATLAS_CACHE_DIR``, else ``~/.cache/atlas``."""
    return Path(os.environ.get("ATLAS_CACHE_DIR") or default_cache_root())
