"""RIMReward: several LLM judges, sampled at several temperatures, escalated when unsure.

Per response and judge:

1. tier 1 — the small model judges once per temperature, all concurrently (bounded by
   ``max_concurrency`` across the whole batch);
2. escalation — when the tier-1 scores' standard deviation exceeds ``variance_threshold``, any
   uncertainty exceeds ``uncertainty_threshold``, or no tier-1 sample could be read, the large
   model sees every tier-1 judgment and decides; otherwise the least uncertain sample wins;
3. the accuracy judge needs no model when the sample has a ``ground_truth`` (exact match).

Judge scores are then made consistent (:func:`apply_consistency`) and combined by weighted mean.
Faults — timeouts, HTTP 5xx, 429 (honouring Retry-After), refused connections, unreadable output —
are retried ``retries`` times under the :class:`~atlas_core.openai_calls.RetryPolicy` shared with
the endpoint student (other 4xx are not retried), then the sample is dropped; a judge with nothing
valid scores ``fallback_score`` and the error is recorded. Nothing raises into the training loop
and no NaN leaves this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import statistics
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atlas_core.aio import BackgroundLoop
from atlas_core.answers import completion_text
from atlas_core.openai_calls import OpenAICallError, RetryPolicy, call_with_retries
from atlas_core.reward.backends import ChatBackend, JudgeCallError, make_backend
from atlas_core.reward.config import ModelEndpoint, RIMConfig, load_rim_config, parse_rim_config
from atlas_core.reward.judges import (
    Judgment,
    JudgmentParseError,
    escalation_messages,
    judge_messages,
    parse_judgment,
    verifiable_accuracy,
)
from atlas_core.telemetry import metrics

logger = logging.getLogger(__name__)

#: Reward-function keyword arguments TRL adds that are not dataset columns.
_TRL_KWARGS = {"completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}


@dataclass
class JudgeResult:
    """One judge's verdict on one response."""

    judge: str
    score: float
    rationale: str
    escalated: bool = False
    samples: list[Judgment] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failed: bool = False


@dataclass
class RIMEvaluation:
    """What ``RIMReward.evaluate`` returns for one response."""

    score: float
    rationale: str
    judge_scores: dict[str, float]
    judge_explanations: dict[str, str]
    escalated: bool
    errors: list[str]
    escalated_judges: list[str] = field(default_factory=list)
    judges: dict[str, JudgeResult] = field(default_factory=dict)


def apply_consistency(scores: Mapping[str, float]) -> dict[str, float]:
    """The cross-judge rules, applied where the judges involved are active, then clamped to [0, 1].

    * process ≤ accuracy + 0.1 — sound-looking reasoning to a wrong answer is not sound;
    * helpfulness ≤ 0.5 when process < 0.5 — help built on bad reasoning is limited;
    * helpfulness ≤ diagnostic + 0.1 — help that ignores the learner's gaps is limited.
    """
    out = {k: float(v) for k, v in scores.items()}
    if "process" in out and "accuracy" in out:
        out["process"] = min(out["process"], out["accuracy"] + 0.1)
    if "helpfulness" in out and "process" in out and out["process"] < 0.5:
        out["helpfulness"] = min(out["helpfulness"], 0.5)
    if "helpfulness" in out and "diagnostic" in out:
        out["helpfulness"] = min(out["helpfulness"], out["diagnostic"] + 0.1)
    return {k: min(1.0, max(0.0, v)) for k, v in out.items()}


def combine(scores: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Weighted mean of the (consistent) judge scores; weights default to 1."""
    total = sum(weights.get(j, 1.0) for j in scores)
    if total <= 0:
        return 0.0
    return sum(s * weights.get(j, 1.0) for j, s in scores.items()) / total


class RIMReward:
    """Reward from multiple judges; a TRL reward function and an evaluator.

    Args:
        config_path: a YAML file, or the name of one in ``reward_system/`` (``interpretation``,
            ``interpretation_offline``).
        config: instead of a file, a mapping with the same keys (or a parsed ``RIMConfig``).
        backends: optional ``{"small": ChatBackend, "large": ChatBackend}`` replacing the ones the
            config describes (for other transports).

    ``rim(prompts=…, completions=…, **columns)`` returns one float in [0, 1] per completion; in a
    GRPO trainer it also logs ``rim_rewards`` and ``rim_explanations`` per completion and the mean
    score of each judge (``rim/<judge>``).
    """

    def __init__(
        self,
        config_path: str | None = None,
        *,
        config: RIMConfig | Mapping[str, Any] | None = None,
        backends: Mapping[str, ChatBackend] | None = None,
    ):
        if (config_path is None) == (config is None):
            raise ValueError("config_path: pass either config_path or config")
        if config is None:
            assert config_path is not None  # one of the two, checked above
            self.config = load_rim_config(config_path)
        elif isinstance(config, RIMConfig):
            self.config = config
        else:
            self.config = parse_rim_config(dict(config))
        self.__name__ = "rim"  # TRL names reward columns after __name__: rewards/rim/mean
        for tier, endpoint in (("small_model", self.config.small_model), ("large_model", self.config.large_model)):
            if endpoint.backend == "openai" and endpoint.api_key_env and not endpoint.api_key():
                logger.warning(
                    "%s.api_key_env: $%s is not set; the endpoint will likely refuse every call and each judge "
                    "will score fallback_score",
                    tier,
                    endpoint.api_key_env,
                )
        self._backends = dict(backends or {})
        self._retry_policy: RetryPolicy = self.config.retry_policy()
        self._loop: BackgroundLoop | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ public API

    def __call__(self, prompts: list, completions: list, **kwargs: Any) -> list[float]:
        columns = {
            k: v for k, v in kwargs.items() if k not in _TRL_KWARGS and isinstance(v, list) and len(v) == len(prompts)
        }
        contexts = [{k: v[i] for k, v in columns.items()} for i in range(len(prompts))]
        evaluations = self.evaluate_batch(
            [_prompt_text(p) for p in prompts], [completion_text(c) for c in completions], contexts
        )
        scores = [e.score for e in evaluations]
        if callable(kwargs.get("log_extra")):
            kwargs["log_extra"]("rim_rewards", scores)
            kwargs["log_extra"]("rim_explanations", [e.rationale for e in evaluations])
        if callable(kwargs.get("log_metric")):
            for judge in self.config.judges:
                kwargs["log_metric"](f"rim/{judge}", statistics.mean(e.judge_scores[judge] for e in evaluations))
            kwargs["log_metric"]("rim/escalation_rate", statistics.mean(float(e.escalated) for e in evaluations))
        return scores

    def evaluate(self, prompt: str, response: str, **context: Any) -> RIMEvaluation:
        """Evaluate one response; ``context`` holds extra fields such as ``ground_truth``."""
        return self.evaluate_batch([prompt], [response], [context])[0]

    def evaluate_batch(
        self, prompts: list[str], responses: list[str], contexts: list[dict[str, Any]] | None = None
    ) -> list[RIMEvaluation]:
        contexts = contexts or [{} for _ in prompts]
        if not (len(prompts) == len(responses) == len(contexts)):
            raise ValueError("prompts, responses and contexts must have the same length")
        evaluations = self._runner().run(self._evaluate_all(prompts, responses, contexts))
        for judge in self.config.judges:
            metrics.rim_judge_score.labels(judge=judge).set(
                statistics.mean(e.judge_scores[judge] for e in evaluations) if evaluations else 0.0
            )
        return evaluations

    def close(self) -> None:
        """Close HTTP clients and stop the private event loop."""
        with self._lock:
            if self._loop is None:
                return
            self._loop.run(self._aclose())
            self._loop.stop()
            self._loop = None
            self._semaphore = None  # bound to the stopped loop

    # ------------------------------------------------------------------ internals

    def _runner(self) -> BackgroundLoop:
        with self._lock:
            if self._loop is None:
                self._loop = BackgroundLoop("rim-reward")
            return self._loop

    def _backend(self, tier: str) -> ChatBackend:
        if tier not in self._backends:
            endpoint: ModelEndpoint = self.config.small_model if tier == "small" else self.config.large_model
            self._backends[tier] = make_backend(endpoint, self.config.timeout_s, self.config.max_tokens)
        return self._backends[tier]

    async def _aclose(self) -> None:
        for backend in self._backends.values():
            await backend.aclose()

    async def _evaluate_all(self, prompts, responses, contexts) -> list[RIMEvaluation]:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.config.max_concurrency)
        return list(
            await asyncio.gather(
                *(self._evaluate_one(p, r, c) for p, r, c in zip(prompts, responses, contexts, strict=True))
            )
        )

    async def _evaluate_one(self, prompt: str, response: str, context: dict[str, Any]) -> RIMEvaluation:
        results = await asyncio.gather(*(self._judge(j, prompt, response, context) for j in self.config.judges))
        by_judge = {r.judge: r for r in results}
        consistent = apply_consistency({r.judge: r.score for r in results})
        score = combine(consistent, self.config.weights)
        if not math.isfinite(score):
            score = self.config.fallback_score
        errors = [f"{r.judge}: {e}" for r in results for e in r.errors]
        explanations = {r.judge: self._redact(r.rationale) for r in results}
        rationale = " | ".join(f"{j} {consistent[j]:.2f}: {explanations[j]}" for j in self.config.judges)
        return RIMEvaluation(
            score=min(1.0, max(0.0, score)),
            rationale=rationale,
            judge_scores=consistent,
            judge_explanations=explanations,
            escalated=any(r.escalated for r in results),
            errors=[self._redact(e) for e in errors],
            escalated_judges=[r.judge for r in results if r.escalated],
            judges=by_judge,
        )

    async def _judge(self, judge: str, prompt: str, response: str, context: dict[str, Any]) -> JudgeResult:
        try:
            return await self._judge_unguarded(judge, prompt, response, context)
        except Exception as exc:  # noqa: BLE001 - whatever happens, a judge yields a score
            error = self._redact(f"{type(exc).__name__}: {exc}")
            return JudgeResult(judge, self.config.fallback_score, "judge failed", errors=[error], failed=True)

    async def _judge_unguarded(self, judge: str, prompt: str, response: str, context: dict[str, Any]) -> JudgeResult:
        if judge == "accuracy" and context.get("ground_truth") not in (None, ""):
            verdict = verifiable_accuracy(response, context["ground_truth"])
            return JudgeResult(judge, verdict.score, verdict.rationale, samples=[verdict])

        messages = judge_messages(judge, prompt, response, context)
        outcomes = await asyncio.gather(
            *(self._call("small", messages, t) for t in self.config.temperatures), return_exceptions=True
        )
        samples = [o for o in outcomes if isinstance(o, Judgment)]
        errors = [str(o) for o in outcomes if isinstance(o, Exception)]
        scores = [s.score for s in samples]
        escalate = (
            not samples
            or statistics.pstdev(scores) > self.config.variance_threshold
            or any(s.uncertainty > self.config.uncertainty_threshold for s in samples)
        )
        if not escalate:
            best = min(samples, key=lambda s: s.uncertainty)
            return JudgeResult(judge, best.score, best.rationale, samples=samples, errors=errors)

        metrics.rim_escalations.inc()
        settle = escalation_messages(judge, prompt, response, context, samples, failures=len(errors))
        try:
            verdict = await self._call("large", settle, min(self.config.temperatures))
        except _SampleFailed as exc:
            errors.append(f"escalation: {exc}")
            if samples:  # the large model is unavailable: keep the best tier-1 judgment
                best = min(samples, key=lambda s: s.uncertainty)
                return JudgeResult(judge, best.score, best.rationale, True, samples, errors)
            return JudgeResult(
                judge, self.config.fallback_score, "no judgment could be obtained", True, samples, errors, failed=True
            )
        return JudgeResult(judge, verdict.score, verdict.rationale, True, [*samples, verdict], errors)

    async def _call(self, tier: str, messages: list[dict[str, str]], temperature: float) -> Judgment:
        """One judgment, retried under the shared :class:`RetryPolicy` (``retries + 1`` attempts in all);
        raises _SampleFailed when all attempts fail."""
        backend = self._backend(tier)
        semaphore = self._semaphore
        assert semaphore is not None  # made by _evaluate_all, which every judgment runs under

        async def attempt() -> Judgment:
            try:
                async with semaphore:  # held for the request only, not while waiting to retry
                    text = await backend.complete(messages, temperature)
                judged = parse_judgment(text, temperature=temperature, tier=tier)
            except OpenAICallError:
                raise
            except JudgmentParseError as exc:  # the model answered, unreadably: ask again at once
                raise JudgeCallError(f"unreadable judgment ({exc})", retryable=True, retry_after=0.0) from None
            except Exception as exc:  # noqa: BLE001 - a judge must never take training down
                raise JudgeCallError(f"{type(exc).__name__}: {exc}", retryable=True, retry_after=0.0) from None
            # redacted before it is stored, shown to the large model or returned
            return dataclasses.replace(judged, rationale=self._redact(judged.rationale))

        metrics.rim_judge_calls.inc()  # the denominator of the judge error ratio (atlas_rim_judge_errors_total)
        try:
            return await call_with_retries(attempt, self._retry_policy)
        except OpenAICallError as exc:
            metrics.rim_judge_errors.inc()
            raise _SampleFailed(self._redact(f"{tier} model at T={temperature:g}: {exc}")) from None

    def _redact(self, text: str) -> str:
        """API keys never appear in rationales or errors, even if a server echoes them back."""
        for endpoint in (self.config.small_model, self.config.large_model):
            key = endpoint.api_key() if endpoint.api_key_env else ""
            if key and len(key) >= 4:
                text = text.replace(key, "[redacted]")
        return text


class _SampleFailed(Exception):
    """A judge sample that failed after every retry (its message is the last error)."""


def _prompt_text(prompt: Any) -> str:
    """A prompt string, or the conversation of a chat prompt as plain text."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in prompt)
    return str(prompt)
