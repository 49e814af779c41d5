"""A stand-in for ``vllm serve``, standard library only: the ``vllm`` program the real-cluster tests put first on the
process nodes' PATH (:func:`install`), where a test needs a server process it can kill (the JobSet gang restart)
rather than a model's answers. It does NOT generate: /health answers 200, /v1/models lists the served model,
/v1/chat/completions and /v1/completions answer every request with ``ANSWER`` (n choices); the weight-sync
endpoints a trainer's rollout client needs (init_communicator, update_named_param, ...) answer 404.

``vllm serve MODEL [--host H] [--port P] [--served-model-name NAME] …`` (other flags are ignored), as the operator
renders it (operator/atlas_operator/render/servers.py). A MODEL that is a path (a fetched copy, a claim's mount)
must be a model folder (its config.json), as vLLM would load it: else the stand-in exits 1 naming it; its first
line names what it serves and from where (``model MODEL``).
"""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ANSWER = "The answer is 4."


def parse(argv: list[str]) -> tuple[str, int, str]:
    """(host, port, served model) of ``serve MODEL …``."""
    if len(argv) < 2 or argv[0] != "serve":
        raise SystemExit(f"vllm stand-in: expected `vllm serve MODEL …`, got {argv}")
    options = {"--host": "0.0.0.0", "--port": "8000", "--served-model-name": argv[1]}
    for i, word in enumerate(argv[2:], start=2):
        key, _, value = word.partition("=")
        if key in options:
            options[key] = value or argv[i + 1]
    return options["--host"], int(options["--port"]), options["--served-model-name"]


def check_model(path: str) -> None:
    """A MODEL given as a path must be a model folder (what vLLM would load); exit 1 naming it otherwise."""
    if path.startswith("/") and not (Path(path) / "config.json").is_file():
        raise SystemExit(f"vllm stand-in: no model at {path} (no config.json)")


def serve(host: str, port: int, model: str, path: str | None = None) -> None:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") == "/health":
                return self.send(200, {})
            if self.path == "/v1/models":
                return self.send(200, {"object": "list", "data": [{"id": model, "object": "model"}]})
            self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            n = int(body.get("n") or 1)
            answer = {"id": "standin", "created": int(time.time()), "model": body.get("model", model)}
            if self.path == "/v1/chat/completions":
                message = {"role": "assistant", "content": ANSWER}
                choices = [{"index": i, "message": message, "finish_reason": "stop"} for i in range(n)]
                usage = {"prompt_tokens": 1, "completion_tokens": 3 * n, "total_tokens": 1 + 3 * n}
                return self.send(200, {**answer, "object": "chat.completion", "choices": choices, "usage": usage})
            if self.path == "/v1/completions":
                choices = [{"index": i, "text": ANSWER, "finish_reason": "stop"} for i in range(n)]
                return self.send(200, {**answer, "object": "text_completion", "choices": choices})
            self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})

    source = f" (model {path})" if path else ""
    print(f"vLLM stand-in (harness/vllm_standin.py): serving {model}{source} on {host}:{port}", flush=True)
    ThreadingHTTPServer((host, port), Handler).serve_forever()


def install(folder: Path) -> Path:
    """Write ``folder/vllm``, this stand-in as a program; returns the folder (to put first on a PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "vllm"
    program.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    program.chmod(0o755)
    return folder


if __name__ == "__main__":
    arguments = sys.argv[1:]
    host, port, served = parse(arguments)
    check_model(arguments[1])
    serve(host, port, served, arguments[1])
