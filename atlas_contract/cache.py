"""The one cache root of every builder here: the builtin models (atlas_core/models/cache.py) and the local
Kubernetes' binaries and clusters (atlas_cluster/paths.py)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$ATLAS_CACHE_DIR``, else ``~/.cache/atlas``."""
    return Path(os.environ.get("ATLAS_CACHE_DIR") or Path.home() / ".cache" / "atlas")
