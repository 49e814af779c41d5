"""Where the builtin models are built (``$ATLAS_CACHE_DIR``), and how: once, atomically."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from atlas_contract.cache import cache_root


def default_cache_dir() -> Path:
    """``$ATLAS_CACHE_DIR``, else ``~/.cache/atlas`` (atlas_contract/cache.py)."""
    return cache_root()


def build_once(target: Path, write: Callable[[Path], None]) -> Path:
    """``target``, a saved model folder, made by ``write(staging)`` unless it is there already. Written under a
    temporary name and renamed into place, so concurrent callers (several ranks of one run) never see a half-written
    model; a caller that loses the race keeps the winner's identical copy."""
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        write(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
