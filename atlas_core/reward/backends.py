"""Judge model backends: OpenAI-compatible endpoints (the ``openai`` client) and local transformers.

Both turn chat messages into text. Failures become :class:`JudgeCallError`, marked retryable or not,
so that the retry policy lives in one place (``RIMReward``), not in each backend.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from atlas_core.reward.config import ModelEndpoint


class JudgeCallError(Exception):
    """A judge call that failed; ``retryable`` for timeouts, 429, 5xx and refused connections."""

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


class ChatBackend(Protocol):
    async def complete(self, messages: list[dict[str, str]], temperature: float) -> str: ...

    async def aclose(self) -> None: ...


class OpenAIChatBackend:
    """Chat completions on any OpenAI-compatible server (vLLM ``/v1``, hosted APIs).

    The client's own retries are off (``max_retries=0``): RIMReward retries with its own budget
    and backoff, and counts what failed.
    """

    def __init__(self, endpoint: ModelEndpoint, timeout_s: float, max_tokens: int):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self._client = None

    def _get_client(self):
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                base_url=self.endpoint.base_url,
                api_key=self.endpoint.api_key() or "MISSING",
                timeout=self.timeout_s,
                max_retries=0,
            )
        return self._client

    async def complete(self, messages: list[dict[str, str]], temperature: float) -> str:
        import openai

        try:
            response = await self._get_client().chat.completions.create(
                model=self.endpoint.model,
                messages=messages,
                temperature=temperature,
                max_tokens=self.max_tokens,
            )
        except openai.APITimeoutError:
            raise JudgeCallError(f"timeout after {self.timeout_s:g} s", retryable=True) from None
        except openai.APIConnectionError as exc:
            raise JudgeCallError(f"connection failed: {type(exc.__cause__ or exc).__name__}", retryable=True) from None
        except openai.RateLimitError as exc:
            raise JudgeCallError("HTTP 429 rate limited", retryable=True, retry_after=_retry_after(exc)) from None
        except openai.APIStatusError as exc:
            status = exc.status_code
            # 5xx are the server's trouble and may pass; other 4xx (401, 404, 400) will not.
            raise JudgeCallError(f"HTTP {status}", retryable=status >= 500) from None
        if not response.choices:
            raise JudgeCallError("response without choices", retryable=True)
        return response.choices[0].message.content or ""

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def _retry_after(exc) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return min(float(value), 60.0) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


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
