"""The frozen student the teacher is trained to help: a local model or an OpenAI-compatible endpoint.

Both answer a batch of conversations, several samples each, in one call: a local model decodes the whole
(left-padded) batch at once, its finished rows leaving it (``LocalStudent.decoding``), an endpoint with
concurrent requests (retried
like the RIM judges', :mod:`atlas_core.openai_calls`). Failures raise ``RuntimeError`` naming the student.
"""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from atlas_core.activity import waiting_for
from atlas_core.openai_calls import OpenAICallError, RetryPolicy, call_with_retries, make_client, one_request


@dataclass(frozen=True)
class StudentAnswer:
    text: str
    tokens: int


class Student(Protocol):
    name: str

    def generate(
        self, conversations: list[list[dict[str, str]]], max_new_tokens: int, num_samples: int, temperature: float
    ) -> list[list[StudentAnswer]]: ...


def is_endpoint(student_model: Any) -> bool:
    return isinstance(student_model, str) and student_model.startswith(("http://", "https://"))


@contextmanager
def _outside_zero3_init():
    """Load with whole weights even when the trainer runs DeepSpeed ZeRO-3.

    Under ZeRO-3, transformers partitions every model created by ``from_pretrained`` across the
    ranks; the frozen student is never trained, so each rank keeps it whole instead (its own
    ``generate`` would otherwise fail on empty parameter shards).
    """
    from transformers.integrations import deepspeed as hf_deepspeed

    # transformers' private handle on the active ZeRO-3 config (no public getter in 5.x): fail loudly if it moves.
    if not hasattr(hf_deepspeed, "_hf_deepspeed_config_weak_ref"):
        raise ImportError(
            "atlas_core.teaching.student: transformers.integrations.deepspeed no longer has "
            "_hf_deepspeed_config_weak_ref (tested with transformers 5.24.0, constraints.txt); port _outside_zero3_init"
        )
    active = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = active() if active is not None else None
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if config is not None:
            hf_deepspeed.set_hf_deepspeed_config(config)


class LocalStudent:
    """A model loaded frozen: no gradients, eval mode; on ``device`` or, with ``offload``, on CPU."""

    #: How a batch of conversations is decoded (bench/real_speed.py compares them, side by side):
    #: ``"shrinking"`` (the default) — one left-padded batch whose finished rows leave it, so that a step
    #: computes mostly the rows still writing (the KV cache is cut to them, and each step writes in place);
    #: ``"padded"`` — one ``model.generate`` over the batch, which computes every row until the longest one ends;
    #: ``"continuous"`` — transformers' continuous batching (``model.generate_batch``, paged attention), slower on
    #: CPU. Greedy decoding gives the same tokens on each.
    decoding: str = "shrinking"
    DECODINGS = ("shrinking", "padded", "continuous")
    #: The most rows a shrinking batch decodes at once; a call with more waits its turn, a waiting row joining as
    #: a row finishes. bench/real_speed.py (2 CPU cores, 96 problems in one batch): 128, every row at once, took
    #: 162 s where 64 rows at once, the rest joining, took 193 s: a step's cost per row still falls past 64 rows,
    #: and a row that joins late is padded to the batch's length and prefilled in a smaller group.
    max_active_rows: int = 128

    def __init__(self, model: Any, tokenizer=None, device=None, offload: bool = False, role: str = "student"):
        import torch
        from transformers import AutoTokenizer, PreTrainedModel

        from atlas_core.models.loading import load_causal_lm, load_tokenizer
        from atlas_core.models.tiny import resolve_model_path

        if isinstance(model, str):
            path = resolve_model_path(model)
            try:
                with _outside_zero3_init():
                    model = load_causal_lm(path, dtype="auto")  # whole weights, or a LoRA adapter merged
                tokenizer = tokenizer or load_tokenizer(path)
            except OSError as exc:
                raise ValueError(f"{role}_model: cannot load {path!r}: {' '.join(str(exc).split())[:200]}") from None
        elif not isinstance(model, PreTrainedModel):
            raise TypeError(f"{role}_model: expected a path, a hub id, a URL or a model, got {type(model).__name__}")
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(model.name_or_path)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.requires_grad_(False)
        model.eval()
        self.device = torch.device("cpu") if offload or device is None else torch.device(device)
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.name = getattr(model, "name_or_path", role)
        self.role = role

    def generate(self, conversations, max_new_tokens, num_samples=1, temperature=0.7):
        import torch

        texts = [
            self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations
        ]
        if self.decoding not in self.DECODINGS:
            raise ValueError(f"decoding: expected one of {', '.join(self.DECODINGS)}, got {self.decoding!r}")
        if self.decoding == "continuous":
            return self._generate_continuous(texts, max_new_tokens, num_samples, temperature)
        batch = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        greedy = temperature <= 0
        sampling = {"do_sample": False} if greedy else {"do_sample": True, "temperature": temperature}
        try:
            with torch.no_grad():
                if self.decoding == "shrinking":
                    return self._grouped(
                        self._decode_shrinking(batch, max_new_tokens, num_samples, temperature), num_samples
                    )
                output = self.model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=1 if greedy else num_samples,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **sampling,
                )
            if greedy and num_samples > 1:  # greedy decoding gives one answer: each sample is that answer
                output = output.repeat_interleave(num_samples, dim=0)
        except Exception as exc:  # noqa: BLE001 - reported as the documented RuntimeError
            raise RuntimeError(f"{self.role} {self.name!r} failed to generate: {type(exc).__name__}: {exc}") from exc
        new = output[:, batch["input_ids"].shape[1] :]
        return self._grouped([row.tolist() for row in new], num_samples)

    def _grouped(self, rows: list[list[int]], num_samples: int) -> list[list[StudentAnswer]]:
        """Generated token rows (``num_samples`` per conversation, in order) as answers without their padding,
        grouped by conversation."""
        answers = []
        for row in rows:
            tokens = [t for t in row if t != self.tokenizer.pad_token_id]
            answers.append(StudentAnswer(self.tokenizer.decode(tokens, skip_special_tokens=True), len(tokens)))
        return [answers[i : i + num_samples] for i in range(0, len(answers), num_samples)]

    def _decode_shrinking(self, batch, max_new_tokens: int, num_samples: int, temperature: float) -> list[list[int]]:
        """Decode a left-padded batch step by step, at most ``max_active_rows`` rows at a time: rows that wrote
        their end-of-sequence token (or their last allowed one) leave the batch and the KV cache in groups, and
        waiting rows are prefilled and join it (:mod:`atlas_core.teaching.kv_rows`), so a step computes mostly rows
        still writing and the batch stays full while rows wait; a step writes in place in the cache. Positions and
        masks as ``generate`` builds them; sampling with its default top-k."""
        import torch

        from atlas_core.teaching import kv_rows

        greedy = temperature <= 0
        repeats = 1 if greedy else num_samples
        if max_new_tokens <= 0:
            return [[] for _ in range(batch["input_ids"].shape[0] * num_samples)]
        # Every row's prompt without its padding: rows are prefilled as they join, the tokens all of them start
        # with (kv_rows.Prefix) once.
        prompts = [ids[mask.bool()] for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
        prompts = [prompt for prompt in prompts for _ in range(repeats)]
        config = self.model.generation_config
        ends = {self.tokenizer.eos_token_id, *_as_list(config.eos_token_id)} - {None}
        end_ids = torch.tensor(sorted(ends), device=self.device)
        top_k = config.top_k or 0
        rows: list[list[int]] = [[] for _ in prompts]
        waiting = list(range(len(prompts)))
        running: kv_rows.Rows | None = None  # the rows decoding now, their cache, mask and next-token logits
        joinable = kv_rows.joinable(self.model)
        # a cache whose rows cannot join (kv_rows.joinable) decodes every row from the start, shrinking only
        cap = max(1, self.max_active_rows) if joinable else len(waiting)
        shared = kv_rows.shared_prefix_length(prompts) if joinable and len(prompts) > 1 else 0
        prefix = kv_rows.Prefix.of(self.model, prompts[0][:shared]) if shared else None
        pad = self.tokenizer.pad_token_id
        # per running row: still writing (a finished row stays until enough of them leave together); none yet
        alive = torch.ones(0, dtype=torch.bool, device=self.device)
        idle = 0  # steps computed for finished rows since rows last left
        while waiting or running is not None:
            free = cap - (int(alive.sum()) if running is not None else 0)
            # Admit waiting rows in groups (a prefill of one row costs about what one of a quarter batch does).
            if waiting and (running is None or free >= max(1, min(cap // 4, len(waiting)))):
                if running is not None and not alive.all():  # the finished rows leave first, making the room
                    running, idle = running.select(alive.nonzero().squeeze(1)), 0
                admitted, waiting = waiting[:free], waiting[free:]
                joined = kv_rows.prefill(
                    self.model, [prompts[row] for row in admitted], admitted, joinable, pad, prefix, max_new_tokens
                )
                running = joined if running is None else running.join(joined)
                alive = torch.ones(running.size, dtype=torch.bool, device=self.device)
            assert running is not None  # admitted above when nothing was running (the loop runs while rows wait)
            logits = running.logits
            if greedy:
                tokens = logits.argmax(dim=-1)
            else:
                scaled = logits.float() / temperature
                if 0 < top_k < scaled.shape[-1]:
                    floor = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
                    scaled = scaled.masked_fill(scaled < floor, float("-inf"))
                tokens = torch.multinomial(torch.softmax(scaled, dim=-1), 1).squeeze(1)
            for row, token, writes in zip(running.ids, tokens.tolist(), alive.tolist(), strict=True):
                if writes:
                    rows[row].append(token)
            lengths = torch.tensor([len(rows[row]) for row in running.ids], device=self.device)
            alive = alive & ~torch.isin(tokens, end_ids) & (lengths < max_new_tokens)
            if not alive.any():
                running = None
                continue
            # Finished rows leave the batch and the cache together: a step of a finished row costs little, a leaving
            # copies the whole cache; they leave once their idle steps add up to an eighth of the batch.
            idle += int((~alive).sum())
            if idle * 8 >= running.size:
                running, tokens = running.select(alive.nonzero().squeeze(1)), tokens[alive]
                alive, idle = alive[alive], 0
            running.step(self.model, tokens)
        if greedy and num_samples > 1:  # greedy decoding gives one answer: each sample is that answer
            rows = [row for row in rows for _ in range(num_samples)]
        return rows

    def _generate_continuous(self, texts, max_new_tokens, num_samples, temperature):
        import torch
        from transformers import GenerationConfig

        greedy = temperature <= 0
        prompts = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        requests = [ids for ids in prompts for _ in range(1 if greedy else num_samples)]
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=temperature if not greedy else None,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        with torch.no_grad():
            results = self.model.generate_batch(requests, generation_config=config, warmup=False)
        outputs = list(results.values())  # in the order of the requests
        if len(outputs) != len(requests) or any(getattr(o, "error", None) for o in outputs):
            raise RuntimeError(f"{self.role} {self.name!r} failed to generate: continuous batching lost requests")
        rows = [list(output.generated_tokens) for output in outputs]
        if greedy:  # one request per conversation: each sample is its answer
            rows = [row for row in rows for _ in range(num_samples)]
        return self._grouped(rows, num_samples)


def _as_list(value: Any) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


class EndpointStudent:
    """A student served by vLLM (``vllm serve``, the run's ``<name>-student`` Service) or any
    OpenAI-compatible API. The served model name is read from ``/v1/models`` when not given.

    Every request is cut at ``timeout_s`` and retried under ``retry`` — the same
    :class:`~atlas_core.openai_calls.RetryPolicy` and helper the RIM judges use — so a failing
    endpoint ends in ``RuntimeError`` after at most ``retry.attempts`` requests per call.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout_s: float = 120.0,
        max_concurrency: int = 32,
        retry: RetryPolicy | None = None,
        role: str = "student",
    ):
        from atlas_core.aio import BackgroundLoop

        self.base_url = base_url.rstrip("/")
        if not self.base_url.endswith("/v1"):
            self.base_url += "/v1"
        self.model = model
        self.name = self.base_url
        self.role = role
        self.retry_policy = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._max_concurrency = max_concurrency
        self._loop = BackgroundLoop("atlas-student")
        self._client = None

    async def _request(self, request, semaphore: asyncio.Semaphore | None = None):
        """``request()`` under the shared retry policy; the semaphore is held per attempt, not while waiting."""

        async def attempt():
            if semaphore is None:
                return await one_request(request, self._timeout_s)
            async with semaphore:
                return await one_request(request, self._timeout_s)

        return await call_with_retries(attempt, self.retry_policy)

    async def _served_model(self, client) -> str:
        if self.model is None:
            models = await self._request(client.models.list)
            if not models.data:
                raise RuntimeError(f"{self.role} endpoint {self.base_url} serves no model")
            self.model = models.data[0].id
        return self.model

    async def _generate(self, conversations, max_new_tokens, num_samples, temperature):
        if self._client is None:
            self._client = make_client(self.base_url, "EMPTY", self._timeout_s)
        client = self._client
        model = await self._served_model(client)
        semaphore = asyncio.Semaphore(self._max_concurrency)

        # Greedy decoding gives every sample the same answer, and vLLM refuses n > 1 with it ("n must be 1 when using
        # greedy sampling"): ask for one and repeat it.
        greedy = temperature <= 0
        asked = 1 if greedy else num_samples

        async def one(messages):
            answers: list[StudentAnswer] = []
            # A server that ignores `n` returns fewer choices: ask again for the rest (bounded).
            for _ in range(asked):
                wanted = asked - len(answers)
                response = await self._request(
                    lambda wanted=wanted: client.chat.completions.create(
                        model=model,
                        messages=messages,
                        max_tokens=max_new_tokens,
                        temperature=temperature,
                        n=wanted,
                    ),
                    semaphore,
                )
                choices = response.choices or []
                per_choice = (response.usage.completion_tokens // max(1, len(choices))) if response.usage else 0
                answers += [StudentAnswer(_answer_text(c.message.content), per_choice) for c in choices]
                if len(answers) >= asked:
                    return answers[:1] * num_samples if greedy else answers[:num_samples]
            raise RuntimeError(f"{self.role} endpoint {self.base_url} returned no answer")

        tasks = [asyncio.ensure_future(one(c)) for c in conversations]
        try:
            return list(await asyncio.gather(*tasks))
        finally:  # one conversation failed: stop the others' requests and retries
            for task in tasks:
                task.cancel()

    def generate(self, conversations, max_new_tokens, num_samples=1, temperature=0.7):
        try:
            with waiting_for(f"the {self.role} at {self.base_url}"):
                return self._loop.run(self._generate(conversations, max_new_tokens, num_samples, temperature))
        except OpenAICallError as exc:
            tries = f"{exc.attempts} attempt{'s' if exc.attempts != 1 else ''}"
            raise RuntimeError(f"{self.role} endpoint {self.base_url} failed after {tries}: {exc}") from None
        except RuntimeError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported as the documented RuntimeError, without server text
            raise RuntimeError(f"{self.role} endpoint {self.base_url} failed: {type(exc).__name__}") from None


def load_student(student_model: Any, device=None, offload: bool = False, role: str = "student") -> Student:
    """A URL → EndpointStudent; a path, hub id or model → LocalStudent (frozen). ``role`` names the model in
    errors (a frozen teacher under evaluation is loaded the same way)."""
    if student_model is None:
        raise ValueError(f"{role}_model: required (a path, a hub id, an OpenAI-compatible URL or a model)")
    if is_endpoint(student_model):
        return EndpointStudent(student_model, role=role)
    return LocalStudent(student_model, device=device, offload=offload, role=role)


def _answer_text(content: Any) -> str:
    """A choice's message content as text: a string, or the text parts of a list of content parts (some
    servers answer that way); anything else is a malformed answer, reported as the student failing."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p.get("text") if isinstance(p, dict) else getattr(p, "text", None) for p in content]
        texts = [p for p in parts if isinstance(p, str)]
        if len(texts) == len(parts):
            return "".join(texts)
    raise RuntimeError(f"student endpoint answered a malformed message content ({type(content).__name__})")
