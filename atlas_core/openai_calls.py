"""One retry policy for calls to OpenAI-compatible endpoints: the RIM judges and the endpoint student.

Both make each HTTP request with :func:`one_request` (the ``openai`` client's own retries are off:
``max_retries=0``; a hard per-request deadline; ``openai`` errors become :class:`OpenAICallError`
with a message that holds no server text and no key) and retry with :func:`call_with_retries` under
a :class:`RetryPolicy`. So a judge and a student facing the same faults make the same requests and
wait the same way.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# Replaced in tests to record the waits instead of sleeping.
retry_wait = asyncio.sleep


class OpenAICallError(Exception):
    """A failed call to an OpenAI-compatible endpoint.

    Args:
        message: what failed (``HTTP 503``, ``timeout after 30 s``, ``connection failed: ConnectError``);
            built from status codes and exception type names only, never from the server's text, so
            it cannot carry an API key.
        retryable: whether another attempt may succeed (see :class:`RetryPolicy`).
        retry_after: seconds to wait before the next attempt instead of the policy's backoff: the
            server's ``Retry-After``, or 0 to retry at once.
        status: the HTTP status, when there was a response.

    ``attempts`` is set by :func:`call_with_retries`: how many attempts were made in all.
    """

    def __init__(self, message: str, retryable: bool, retry_after: float | None = None, *, status: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.status = status
        self.attempts = 1


@dataclass(frozen=True)
class RetryPolicy:
    """How calls to OpenAI-compatible endpoints are retried (RIM judges and the endpoint student alike).

    Which failures are retried: timeouts, connection errors (refused, reset, DNS), HTTP 429 and
    every 5xx — the server's trouble, which may pass — and a response without choices. Other 4xx
    (400, 401, 403, 404, 422 …) are not: the same request fails the same way again.

    Waits: before retry ``k`` (0-based) ``min(base_delay_s * 2**k, max_delay_s)``, shortened by a
    random part of up to ``jitter`` (so clients failing together do not retry together). A
    ``Retry-After`` (or ``retry-after-ms``) on a 429/5xx is honoured exactly instead, up to
    ``max_retry_after_s``.

    Total time is bounded: at most ``attempts`` requests, each cut at the caller's timeout, and
    ``attempts - 1`` waits of at most ``max(max_delay_s, max_retry_after_s)`` each.

    Attributes:
        attempts: requests in all, the first included (1 = never retry).
        base_delay_s: the first backoff wait, doubled before each further retry.
        max_delay_s: the longest backoff wait.
        jitter: in [0, 1]; each backoff wait is multiplied by ``1 - jitter * random()``.
        max_retry_after_s: the longest server-requested wait honoured (longer ones are cut to it).
    """

    attempts: int = 3
    base_delay_s: float = 1.0
    max_delay_s: float = 8.0
    jitter: float = 0.25
    max_retry_after_s: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts: expected a whole number >= 1, got {self.attempts!r}")
        for name in ("base_delay_s", "max_delay_s", "max_retry_after_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
        if not isinstance(self.jitter, (int, float)) or not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter: expected a number in [0, 1], got {self.jitter!r}")

    @staticmethod
    def retryable_status(status: int) -> bool:
        """429 and 5xx are retried; every other 4xx is not."""
        return status == 429 or status >= 500

    def delay_s(self, retry: int, retry_after: float | None = None, rand: Callable[[], float] = random.random) -> float:
        """The wait before retry ``retry`` (0 = the first retry)."""
        if retry_after is not None:
            return min(max(0.0, retry_after), self.max_retry_after_s)
        backoff = min(self.base_delay_s * 2.0 ** min(retry, 64), self.max_delay_s)
        return backoff * (1.0 - self.jitter * rand())


async def call_with_retries(attempt: Callable[[], Awaitable[T]], policy: RetryPolicy) -> T:
    """``await attempt()`` until it succeeds, for at most ``policy.attempts`` attempts.

    A retryable :class:`OpenAICallError` is retried after :meth:`RetryPolicy.delay_s`; a
    non-retryable one, or the last one, is raised with ``attempts`` set. Any other exception
    propagates at once. ``attempt`` should make one request (:func:`one_request`), so that a
    concurrency limit it takes is not held while waiting.
    """
    for n in range(policy.attempts):
        try:
            return await attempt()
        except OpenAICallError as exc:
            exc.attempts = n + 1
            if not exc.retryable or n + 1 >= policy.attempts:
                raise
            await retry_wait(policy.delay_s(n, exc.retry_after))
    raise AssertionError("unreachable: RetryPolicy.attempts >= 1")


async def one_request(
    request: Callable[[], Awaitable[T]], timeout_s: float, error: type[OpenAICallError] = OpenAICallError
) -> T:
    """One request to an OpenAI-compatible endpoint, ended after ``timeout_s`` whatever the server does.

    ``openai`` exceptions become ``error`` (an :class:`OpenAICallError` type), marked retryable by
    the :class:`RetryPolicy` rules. The client should be made with ``max_retries=0``
    (:func:`make_client`): retries belong to :func:`call_with_retries`.
    """
    import openai

    try:
        async with asyncio.timeout(timeout_s):
            return await request()
    except (TimeoutError, openai.APITimeoutError):
        raise error(f"timeout after {timeout_s:g} s", retryable=True) from None
    except openai.APIConnectionError as exc:
        raise error(f"connection failed: {type(exc.__cause__ or exc).__name__}", retryable=True) from None
    except openai.APIStatusError as exc:
        status = exc.status_code
        retryable = RetryPolicy.retryable_status(status)
        retry_after = retry_after_s(exc.response.headers) if retryable else None
        message = "HTTP 429 rate limited" if status == 429 else f"HTTP {status}"
        raise error(message, retryable=retryable, retry_after=retry_after, status=status) from None
    except openai.APIResponseValidationError:
        raise error("invalid response", retryable=True) from None
    except openai.OpenAIError as exc:
        raise error(f"client error: {type(exc).__name__}", retryable=False) from None


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a response asks to wait: ``retry-after-ms``, ``Retry-After`` in seconds or as an HTTP date."""
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(0.0, seconds)
    value = headers.get("retry-after")
    if value:
        try:
            when = email.utils.parsedate_tz(value)
            if when is not None:
                return max(0.0, email.utils.mktime_tz(when) - time.time())
        except (TypeError, ValueError, OverflowError):
            return None
    return None


def make_client(base_url: str, api_key: str, timeout_s: float):
    """An ``openai.AsyncOpenAI`` with the client's own retries off (:func:`call_with_retries` retries)."""
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=0)
