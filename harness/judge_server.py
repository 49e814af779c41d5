"""A scripted OpenAI-compatible server on 127.0.0.1 (judges, students), for tests and benchmarks.

It is a real HTTP server (aiohttp, in its own thread): the ``openai`` client talks to it exactly
as to vLLM. A test gives it a ``script(call) -> Reply`` deciding each answer, and reads back what
was called (model, temperature, messages, headers) and how many calls overlapped.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Call:
    model: str
    temperature: float
    messages: list[dict[str, str]]
    headers: dict[str, str]
    index: int
    n: int = 1
    max_tokens: int | None = None


@dataclass
class Reply:
    content: str | list[str] = ""  # a list gives one choice per item (requests with n > 1)
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw: str | None = None  # sent as the body instead of a chat completion (a broken server)
    message_content: Any = None  # the choices' message content as given (e.g. a list of parts), when set


def judgment(score: float, uncertainty: float = 0.1, rationale: str = "fine") -> str:
    return json.dumps(
        {
            "principles": [
                {"name": "correctness", "weight": 0.6, "description": "right answer"},
                {"name": "clarity", "weight": 0.4, "description": "clear steps"},
            ],
            "score": score,
            "rationale": rationale,
            "uncertainty": uncertainty,
        }
    )


class JudgeServer:
    def __init__(
        self,
        script: Callable[[Call], Reply],
        served_model: str = "served-model",
        port: int = 0,
        host: str = "127.0.0.1",
        models_unavailable: int = 0,
    ):
        self.script = script
        self.models_unavailable = models_unavailable  # the first N GET /v1/models answer 503: a server still loading
        self.models_requests = 0
        self.host = host  # e.g. the process nodes' bridge address, where their pods reach the host
        self.served_model = served_model
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.port = port  # 0: any free port; a given one lets a test bring "the same server" back

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            call = Call(
                model=body["model"],
                temperature=float(body.get("temperature", 1.0)),
                messages=body["messages"],
                headers=dict(request.headers),
                index=len(self.calls),
                n=int(body.get("n") or 1),
                max_tokens=body.get("max_tokens"),
            )
            self.calls.append(call)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = self.script(call)
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
        finally:
            with self._lock:
                self.in_flight -= 1
        if reply.raw is not None:
            return web.Response(
                status=reply.status, text=reply.raw, headers=reply.headers, content_type="application/json"
            )
        if reply.status != 200:
            body = json.dumps({"error": {"message": "scripted failure"}})
            return web.Response(status=reply.status, text=body, headers=reply.headers, content_type="application/json")
        contents = reply.content if isinstance(reply.content, list) else [reply.content] * call.n
        return web.json_response(
            {
                "id": f"chatcmpl-{call.index}",
                "object": "chat.completion",
                "created": 0,
                "model": call.model,
                "choices": [
                    {
                        "index": i,
                        "message": {
                            "role": "assistant",
                            "content": text if reply.message_content is None else reply.message_content,
                        },
                        "finish_reason": "stop",
                    }
                    for i, text in enumerate(contents)
                ],
                "usage": {
                    "prompt_tokens": 1,
                    "completion_tokens": 3 * len(contents),
                    "total_tokens": 1 + 3 * len(contents),
                },
            },
            headers=reply.headers,
        )

    async def _models(self, request: web.Request) -> web.Response:
        with self._lock:
            self.models_requests += 1
            loading = self.models_requests <= self.models_unavailable
        if loading:
            return web.json_response({"error": {"message": "loading"}}, status=503)
        return web.json_response({"object": "list", "data": [{"id": self.served_model, "object": "model"}]})

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        # Closing does not wait for replies still held back (a stalled reply's delay): the test is over.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, self.host, self.port)
        self._loop.run_until_complete(site.start())
        self.port = self._runner.addresses[0][1]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> JudgeServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "judge server did not start"
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def calls_to(self, model: str) -> list[Call]:
        return [c for c in self.calls if c.model == model]
