"""The real CPU vLLM for the tests (make vllm: tools/vllm_cpu.py): found once, at import — before
tests/conftest.py's ``atlas_cache`` moves ATLAS_CACHE_DIR to a temporary folder, where no vLLM is installed.

Without it a test skips saying ``make vllm``; with ``ATLAS_REQUIRE_VLLM=1`` (set by .ci/run) it fails instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atlas_contract.vllm import PYTHON_SETTING, cpu_python

CPU_VLLM_PYTHON = cpu_python()
REQUIRE = os.environ.get("ATLAS_REQUIRE_VLLM") == "1"


def require_cpu_vllm(monkeypatch: pytest.MonkeyPatch | None = None) -> Path:
    """The CPU vLLM's python (named by ``$ATLAS_VLLM_PYTHON`` for the code under test, through ``monkeypatch``
    when given), else a skip (a failure under ATLAS_REQUIRE_VLLM=1) saying how to install it."""
    if CPU_VLLM_PYTHON is None:
        message = "the CPU vLLM is not installed: make vllm"
        if REQUIRE:
            pytest.fail(message + " (ATLAS_REQUIRE_VLLM=1)", pytrace=False)
        pytest.skip(message)
    if monkeypatch is not None:
        monkeypatch.setenv(PYTHON_SETTING, str(CPU_VLLM_PYTHON))
    return CPU_VLLM_PYTHON
