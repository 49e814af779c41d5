"""The vLLM stand-in the JobSet executor runs in place of ``vllm serve`` (it cannot run vLLM here)."""

from __future__ import annotations

from pathlib import Path

# The vLLM stand-in (run with ``python -c VLLM_STANDIN <port> <served model>``): standard library only, so
# it starts in a blink. /health and /health/ answer 200; /v1/models lists the served model;
# /v1/chat/completions and /v1/completions answer every request with VLLM_STANDIN_ANSWER (n choices). It does
# NOT generate, and has none of the weight-sync endpoints a trainer's rollout client needs
# (init_communicator, update_named_param, ...): those answer 404.
VLLM_STANDIN_ANSWER = "The answer is 4."
VLLM_STANDIN = r"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, MODEL, ANSWER = int(sys.argv[1]), sys.argv[2], sys.argv[3]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, code, body):
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
            return self.send(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        n = int(body.get("n") or 1)
        answer = {"id": "standin", "created": int(time.time()), "model": body.get("model", MODEL)}
        if self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": ANSWER}
            choices = [{"index": i, "message": message, "finish_reason": "stop"} for i in range(n)]
            usage = {"prompt_tokens": 1, "completion_tokens": 3 * n, "total_tokens": 1 + 3 * n}
            return self.send(200, {**answer, "object": "chat.completion", "choices": choices, "usage": usage})
        if self.path == "/v1/completions":
            choices = [{"index": i, "text": ANSWER, "finish_reason": "stop"} for i in range(n)]
            return self.send(200, {**answer, "object": "text_completion", "choices": choices})
        self.send(404, {"error": {"message": "not served by the vLLM stand-in"}})


print(f"vLLM stand-in (tests/support/vllm_standin.py): serving {MODEL} on 127.0.0.1:{PORT}", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""


def vllm_served(argv: list[str]) -> str | None:
    """The model of a ``vllm serve MODEL …`` command (its --served-model-name when set), else None."""
    words = [Path(w).name for w in argv[:2]]
    if words != ["vllm", "serve"] or len(argv) < 3:
        return None
    names = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--served-model-name"]
    names += [a.split("=", 1)[1] for a in argv if a.startswith("--served-model-name=")]
    return names[0] if names else argv[2]
