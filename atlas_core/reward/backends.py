"""Judge model backends: OpenAI-compatible endpoints (the ``openai`` client) and local transformers.

Both turn chat messages into text, one attempt per call. Failures become :class:`JudgeCallError`,
marked retryable or not; ``RIMReward`` retries them with the policy shared with the endpoint student
(:mod:`atlas_core.openai_calls`), not each backend on its own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from atlas_core.openai_calls import OpenAICallError, make_client, one_request
from atlas_core.reward.config import ModelEndpoint


class JudgeCallError(OpenAICallError):
    """A judge call that failed; ``retryable`` as :class:`~atlas_core.openai_calls.RetryPolicy` says
    (timeouts, refused connections, 429, 5xx), ``retry_after`` a server-requested wait."""


class ChatBackend(Protocol):
    async def complete(self, messages: list[dict[str, str]], temperature: float) -> str: ...

    async def aclose(self) -> None: ...


class OpenAIChatBackend:
    """Chat completions on any OpenAI-compatible server (vLLM ``/v1``, hosted APIs).

    One request per call, cut at ``timeout_s`` (:func:`~atlas_core.openai_calls.one_request`); the
    client's own retries are off: RIMReward retries with :func:`~atlas_core.openai_calls.call_with_retries`
    and counts what failed.
    """

    def __init__(self, endpoint: ModelEndpoint, timeout_s: float, max_tokens: int):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self._client = None

    def _get_client(self):
        if self._client is None:
            self._client = make_client(self.endpoint.base_url, self.endpoint.api_key() or "MISSING", self.timeout_s)
        return self._client

    async def complete(self, messages: list[dict[str, str]], temperature: float) -> str:
        client = self._get_client()
        response = await one_request(
            lambda: client.chat.completions.create(
                model=self.endpoint.model, messages=messages, temperature=temperature, max_tokens=self.max_tokens
            ),
            self.timeout_s,
            error=JudgeCallError,
        )
        if not response.choices:
            raise JudgeCallError("response without choices", retryable=True)
        return response.choices[0].message.content or ""

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


class TransformersChatBackend:
    """A local model (path or ``builtin://tiny-llama``) answering judge prompts, for offline use.

    Generation runs in a worker thread, one call at a time (the model is shared and not
    thread-safe); a tiny model will not write valid JSON — RIMReward then records parse errors.
    """

    def __init__(self, endpoint: ModelEndpoint, max_tokens: int):
        self.endpoint = endpoint
        self.max_tokens = max_tokens
        self._model = None
        self._tokenizer = None
        self._lock = threading.Lock()

    def _load(self):
        if self._model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from atlas_core.models.tiny import resolve_model_path

            path = resolve_model_path(self.endpoint.model)
            self._tokenizer = AutoTokenizer.from_pretrained(path)
            self._model = AutoModelForCausalLM.from_pretrained(path).eval()
        return self._model, self._tokenizer

    def _generate(self, messages: list[dict[str, str]], temperature: float) -> str:
        import torch

        with self._lock:
            try:
                model, tokenizer = self._load()
            except OSError as exc:
                raise JudgeCallError(f"cannot load local judge model: {type(exc).__name__}", retryable=False) from None
            inputs = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            limit = getattr(model.config, "max_position_embeddings", 2048) - self.max_tokens
            inputs = {k: v[:, -max(1, limit) :] for k, v in inputs.items()}
            sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
            with torch.no_grad():
                output = model.generate(
                    **inputs, max_new_tokens=self.max_tokens, pad_token_id=tokenizer.pad_token_id, **sampling
                )
            return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    async def complete(self, messages: list[dict[str, str]], temperature: float) -> str:
        return await asyncio.to_thread(self._generate, messages, temperature)

    async def aclose(self) -> None:
        return None


def make_backend(endpoint: ModelEndpoint, timeout_s: float, max_tokens: int) -> ChatBackend:
    if endpoint.backend == "transformers":
        return TransformersChatBackend(endpoint, max_tokens)
    return OpenAIChatBackend(endpoint, timeout_s, max_tokens)
