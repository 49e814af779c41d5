"""Start a real CPU vLLM server (atlas_core/vllm_cpu.py's ``serve``), ask it twice alone and 32 times at once, print
its start-up time, RSS and tokens/s, stop it.

    python -m tools.vllm_server [MODEL]   # default: builtin://smollm2-135m-instruct
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from atlas_contract.checks import SMOLLM2_MODEL_URI
from atlas_core.vllm_cpu import serve

CONCURRENT = 32


def post(url: str, body: dict, timeout: float = 300.0) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def main(argv: list[str]) -> int:
    """Start a server (on the builtin SmolLM2 unless a model is named), ask it, print the figures, stop it."""
    model_dir = argv[0] if argv else SMOLLM2_MODEL_URI
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
        began = time.monotonic()
        with ThreadPoolExecutor(CONCURRENT) as pool:  # the student's way: concurrent requests
            answers = list(pool.map(lambda _: post(f"{server.base_url}/completions", body), range(CONCURRENT)))
        took = time.monotonic() - began
        tokens = sum(a["usage"]["completion_tokens"] for a in answers)
        rate = f"{tokens} tokens in {took:.2f} s: {tokens / took:.1f} tokens/s"
        print(f"vllm-server: {CONCURRENT} concurrent requests: {rate}")
        print(f"vllm-server: RSS {server.rss_bytes() / 2**30:.2f} GiB after the requests")
    print("vllm-server: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
