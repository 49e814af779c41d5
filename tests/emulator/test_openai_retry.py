"""One retry policy for OpenAI-compatible calls: the RIM judges and the endpoint student, both against a
real HTTP server on 127.0.0.1. Requests are counted on the server; waits are recorded (the helper's sleep is
replaced), never timed."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import pytest
from aiohttp import web

from atlas_core import openai_calls
from atlas_core.openai_calls import OpenAICallError, RetryPolicy, call_with_retries
from atlas_core.reward.interpretation import RIMReward
from atlas_core.teaching.student import EndpointStudent, StudentAnswer
from harness.judge_server import JudgeServer, Reply, judgment

JUDGE, LARGE, STUDENT = "judge", "judge-large", "student"
QUESTION = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture
def waits(monkeypatch):
    """The waits call_with_retries asks for, in order (it does not actually sleep)."""
    recorded: list[float] = []

    async def record(seconds: float) -> None:
        recorded.append(seconds)
        await asyncio.sleep(0)

    monkeypatch.setattr(openai_calls, "retry_wait", record)
    return recorded


def scripted(status: int, times: int | None, headers: dict[str, str] | None = None):
    """Each model's first ``times`` requests (all when None) fail with ``status``; then it answers."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def script(call):
        with lock:
            seen[call.model] += 1
            failing = times is None or seen[call.model] <= times
        if failing:
            return Reply(status=status, headers=dict(headers or {}))
        return Reply("\\boxed{7}" if call.model == STUDENT else judgment(0.9, 0.1))

    return script


def rim_config(base_url: str, retries: int = 2, backoff_s: float = 0.5, timeout_s: float = 5.0, **endpoint):
    return {
        "judges": ["process"],
        "small_model": {"model": JUDGE, "base_url": base_url, "api_key_env": None, **endpoint},
        "large_model": {"model": LARGE, "base_url": base_url, "api_key_env": None, **endpoint},
        "temperatures": [0.2],
        "retries": retries,
        "backoff_s": backoff_s,
        "timeout_s": timeout_s,
        "max_tokens": 16,
    }


def judge_once(base_url: str, **config):
    rim = RIMReward(config=rim_config(base_url, **config))
    try:
        return rim, rim.evaluate("What is 3 + 4?", "7")
    finally:
        rim.close()


def ask_student(base_url: str, policy: RetryPolicy, timeout_s: float = 5.0):
    return EndpointStudent(base_url, retry=policy, timeout_s=timeout_s).generate([QUESTION], 8, num_samples=1)


# ---------------------------------------------------------------- judge and student behave the same


def test_judge_and_student_retry_503_the_same_way_then_succeed(waits):
    with JudgeServer(scripted(503, times=2), served_model=STUDENT) as server:
        rim, result = judge_once(server.base_url, retries=2, backoff_s=0.5)
        policy = rim.config.retry_policy()
        judge_waits = list(waits)
        waits.clear()
        answers = ask_student(server.base_url, policy)
    assert policy == RetryPolicy(attempts=3, base_delay_s=0.5, max_delay_s=8.0, jitter=0.25)
    # both: two 503s, then the third request succeeds
    assert len(server.calls_to(JUDGE)) == 3 and len(server.calls_to(STUDENT)) == 3
    assert server.calls_to(LARGE) == []
    assert result.score == 0.9 and result.errors == []
    assert answers == [[StudentAnswer("\\boxed{7}", 3)]]
    # the same exponential backoff with jitter: 0.5 s then 1 s, each shortened by at most 25 %
    for recorded in (judge_waits, waits):
        assert len(recorded) == 2
        assert 0.375 <= recorded[0] <= 0.5 and 0.75 <= recorded[1] <= 1.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"Retry-After": "3600"}, 60.0),  # capped at max_retry_after_s
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # a date already past: at once
    ],
)
def test_429_retry_after_is_honoured_by_both(waits, headers, expected):
    with JudgeServer(scripted(429, times=1, headers=headers), served_model=STUDENT) as server:
        rim, result = judge_once(server.base_url, backoff_s=0.5)
        judge_waits = list(waits)
        waits.clear()
        answers = ask_student(server.base_url, rim.config.retry_policy())
    assert judge_waits == [expected] and waits == [expected]  # the server's wait, not the 0.5 s backoff
    assert len(server.calls_to(JUDGE)) == 2 and len(server.calls_to(STUDENT)) == 2
    assert result.score == 0.9 and answers[0][0].text == "\\boxed{7}"


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_4xx_is_not_retried(waits, status):
    with JudgeServer(scripted(status, times=None), served_model=STUDENT) as server:
        rim, result = judge_once(server.base_url, retries=3)
        with pytest.raises(RuntimeError) as info:
            ask_student(server.base_url, rim.config.retry_policy())
    # one request each: the small judge, the escalation to the large one (no tier-1 sample), the student
    assert len(server.calls_to(JUDGE)) == 1 and len(server.calls_to(LARGE)) == 1
    assert len(server.calls_to(STUDENT)) == 1
    assert waits == []
    assert result.errors == [
        f"process: small model at T=0.2: HTTP {status}",
        f"process: escalation: large model at T=0.2: HTTP {status}",
    ]
    assert str(info.value) == f"student endpoint {server.base_url} failed after 1 attempt: HTTP {status}"


@pytest.mark.parametrize("retries", [0, 1, 4])
def test_attempts_are_bounded_and_end_in_a_clear_error(waits, retries):
    attempts = retries + 1
    with JudgeServer(scripted(503, times=None), served_model=STUDENT) as server:
        rim, result = judge_once(server.base_url, retries=retries, backoff_s=0.01)
        with pytest.raises(RuntimeError) as info:
            ask_student(server.base_url, rim.config.retry_policy())
    assert len(server.calls_to(JUDGE)) == attempts and len(server.calls_to(LARGE)) == attempts
    assert len(server.calls_to(STUDENT)) == attempts
    assert len(waits) == 3 * retries  # small judge, large judge, student
    assert result.score == 0.0 and result.judges["process"].failed
    assert "process: small model at T=0.2: HTTP 503" in result.errors
    plural = "s" if attempts > 1 else ""
    assert str(info.value) == f"student endpoint {server.base_url} failed after {attempts} attempt{plural}: HTTP 503"


def test_timeouts_are_retried_and_bounded(waits):
    with JudgeServer(lambda call: Reply("late", delay_s=1.0), served_model=STUDENT) as server:
        rim, result = judge_once(server.base_url, retries=1, backoff_s=0.01, timeout_s=0.2)
        with pytest.raises(RuntimeError, match=r"failed after 2 attempts: timeout after 0.2 s"):
            ask_student(server.base_url, rim.config.retry_policy(), timeout_s=0.2)
    assert len(server.calls_to(JUDGE)) == 2 and len(server.calls_to(LARGE)) == 2
    assert len(server.calls_to(STUDENT)) == 2
    assert "process: small model at T=0.2: timeout after 0.2 s" in result.errors


def test_a_trickling_server_is_cut_at_the_timeout(waits):
    """Bytes every 50 ms never trip the client's per-read timeout; the per-request deadline ends it anyway."""
    requests: list[str] = []
    stop = asyncio.Event()

    async def trickle(request: web.Request) -> web.StreamResponse:
        requests.append(request.path)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for _ in range(200):  # 10 s of whitespace before a JSON body that never comes
            if stop.is_set():
                break
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", trickle)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        student = EndpointStudent(base_url, model=STUDENT, timeout_s=0.3, retry=RetryPolicy(attempts=2))
        with pytest.raises(RuntimeError, match=r"failed after 2 attempts: timeout after 0.3 s"):
            student.generate([QUESTION], 8)
    finally:
        loop.call_soon_threadsafe(stop.set)
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert requests == ["/v1/chat/completions"] * 2


def test_refused_connection_is_retried_then_reported(waits):
    from harness.env import free_port

    base_url = f"http://127.0.0.1:{free_port()}/v1"
    rim, result = judge_once(base_url, retries=1, backoff_s=0.01)
    with pytest.raises(RuntimeError, match=r"failed after 2 attempts: connection failed"):
        ask_student(base_url, rim.config.retry_policy())
    assert all("connection failed" in e for e in result.errors) and len(result.errors) == 2
    assert len(waits) == 3  # one retry each: small judge, large judge, student


def test_api_key_never_in_errors_even_when_the_server_echoes_it(monkeypatch, waits):
    secret = "sk-retry-0123456789abcdef"
    monkeypatch.setenv("JUDGE_API_KEY", secret)

    def script(call):  # a 503 whose body and headers repeat the credentials
        auth = call.headers.get("Authorization", "")
        return Reply(status=503, headers={"X-Echo": auth})

    with JudgeServer(script) as server:
        _, result = judge_once(server.base_url, retries=1, backoff_s=0.01, api_key_env="JUDGE_API_KEY")
    assert server.calls[0].headers["Authorization"] == f"Bearer {secret}"
    assert len(server.calls) == 4 and result.errors
    assert all(secret not in e for e in result.errors) and secret not in result.rationale


# ---------------------------------------------------------------- the policy and the helper


def test_policy_waits():
    policy = RetryPolicy(attempts=6, base_delay_s=1.0, max_delay_s=8.0, jitter=0.25)
    assert [policy.delay_s(k, rand=lambda: 0.0) for k in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert [policy.delay_s(k, rand=lambda: 1.0) for k in range(3)] == [0.75, 1.5, 3.0]
    assert policy.delay_s(0, retry_after=12.5) == 12.5 and policy.delay_s(0, retry_after=600) == 60.0
    assert policy.delay_s(3, retry_after=-1) == 0.0
    assert [s for s in (400, 401, 404, 408, 409, 422, 429, 500, 502, 503, 504) if RetryPolicy.retryable_status(s)] == [
        429,
        500,
        502,
        503,
        504,
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"base_delay_s": -1}, "base_delay_s"),
        ({"max_delay_s": float("inf")}, "max_delay_s"),
        ({"jitter": 1.5}, "jitter"),
    ],
)
def test_policy_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


def test_rim_backoff_above_the_default_cap_is_kept(tmp_path):
    rim = RIMReward(config=rim_config("http://127.0.0.1:9/v1", retries=0, backoff_s=20.0))
    assert rim.config.retry_policy() == RetryPolicy(attempts=1, base_delay_s=20.0, max_delay_s=20.0)


async def test_helper_retries_only_retryable_call_errors(waits):
    calls = Counter()

    async def flaky(kind: str):
        calls[kind] += 1
        if kind == "retryable":
            raise OpenAICallError("HTTP 503", retryable=True, status=503)
        if kind == "final":
            raise OpenAICallError("HTTP 400", retryable=False, status=400)
        raise KeyError("a bug, not a call failure")

    policy = RetryPolicy(attempts=4, base_delay_s=0.0)
    with pytest.raises(OpenAICallError) as info:
        await call_with_retries(lambda: flaky("retryable"), policy)
    assert info.value.attempts == 4
    with pytest.raises(OpenAICallError) as info:
        await call_with_retries(lambda: flaky("final"), policy)
    assert info.value.attempts == 1
    with pytest.raises(KeyError):
        await call_with_retries(lambda: flaky("bug"), policy)
    assert calls == {"retryable": 4, "final": 1, "bug": 1}
    assert waits == [0.0, 0.0, 0.0]
