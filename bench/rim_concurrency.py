"""RIM judge concurrency against a local endpoint that answers after 200 ms.

16 samples x 2 judges x 3 temperatures = 96 judge calls, evaluated once with
``max_concurrency: 1`` (sequential) and once with the default (16), side by side in one run.
Prints both wall times and the ratio (target < 0.35x sequential).

    .venv/bin/python -m bench.rim_concurrency [--delay 0.2] [--samples 16] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import time

from atlas_core.reward.interpretation import RIMReward
from harness.judge_server import JudgeServer, Reply, judgment


def timed_batch(base_url: str, samples: int, concurrency: int) -> tuple[float, list[float]]:
    endpoint = {"model": "judge", "base_url": base_url, "api_key_env": None}
    rim = RIMReward(
        config={
            "judges": ["helpfulness", "process"],
            "small_model": endpoint,
            "large_model": endpoint,
            "temperatures": [0.2, 0.5, 0.8],
            "max_concurrency": concurrency,
            "timeout_s": 30,
            "retries": 0,
        }
    )
    try:
        prompts = [f"What is {i} + {i}?" for i in range(samples)]
        completions = [f"\\boxed{{{2 * i}}}" for i in range(samples)]
        rim(prompts=prompts[:1], completions=completions[:1])  # warm the client (connection pool, imports)
        started = time.perf_counter()
        scores = rim(prompts=prompts, completions=completions)
        return time.perf_counter() - started, scores
    finally:
        rim.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.2, help="seconds the endpoint takes per call")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=16)
    opts = parser.parse_args()

    # Agreeing judgments: no escalation, so every run makes exactly samples x 2 x 3 calls.
    with JudgeServer(lambda call: Reply(judgment(0.7, 0.1), delay_s=opts.delay)) as server:
        sequential, seq_scores = timed_batch(server.base_url, opts.samples, 1)
        concurrent, con_scores = timed_batch(server.base_url, opts.samples, opts.concurrency)
        calls = len(server.calls)
    assert seq_scores == con_scores == [0.7] * opts.samples
    per_run = opts.samples * 2 * 3
    print(f"{per_run} judge calls per run ({opts.samples} samples x 2 judges x 3 temperatures), {opts.delay:g} s each")
    print(f"(server saw {calls} calls incl. 2 x 6 warm-up)")
    print(f"sequential (max_concurrency=1):  {sequential:6.2f} s")
    print(f"concurrent (max_concurrency={opts.concurrency}): {concurrent:6.2f} s")
    print(f"ratio concurrent/sequential: {concurrent / sequential:.3f}  (target < 0.35)")


if __name__ == "__main__":
    main()
