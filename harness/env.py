"""The repository, the Python running the tests, free ports, the environment of a subprocess running our code and
such a subprocess run to its end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from atlas_cluster.controlplane import free_port  # noqa: F401  (one source: re-exported for the tests)

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess running our code offline."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """A command running our code offline in ``cwd``, its output captured."""
    return subprocess.run(args, cwd=cwd, env=python_env(), capture_output=True, text=True, timeout=timeout)
