"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for RIM tests and benchmarks.

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


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


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
    def __init__(self, script: Callable[[Call], Reply]):
        self.script = script
        self.calls: list[Call] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        with self._lock:
            call = Call(
                model=body["model"],
                temperature=float(body.get("temperature", 1.0)),
                messages=body["messages"],
                headers=dict(request.headers),
                index=len(self.calls),
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
        if reply.status != 200:
            body = json.dumps({"error": {"message": "scripted failure"}})
            return web.Response(status=reply.status, text=body, headers=reply.headers, content_type="application/json")
        return web.json_response(
            {
                "id": f"chatcmpl-{call.index}",
                "object": "chat.completion",
                "created": 0,
                "model": call.model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
            headers=reply.headers,
        )

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
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
