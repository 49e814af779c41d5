"""The repository, the Python running the tests, free ports and the environment of a subprocess running our code."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_env(**extra: str) -> dict[str, str]:
    """Environment for a subprocess running our code offline."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env
