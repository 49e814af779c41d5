"""The repository, the Python running the tests, free ports and the environment of a subprocess running our code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from atlas_cluster.controlplane import free_port  # noqa: F401  (one source: re-exported for the tests)

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess running our code offline."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env
