"""RIMReward against a real OpenAI-compatible server on 127.0.0.1 with scripted judgments."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client import REGISTRY

from atlas_core.reward.config import RIMConfigError, load_rim_config, parse_rim_config
from atlas_core.reward.interpretation import RIMReward, apply_consistency, combine
from atlas_core.telemetry.metrics import TRAINER_REGISTRY
from harness.judge_server import JudgeServer, Reply, judgment

SMALL, LARGE = "judge-small", "judge-large"


def config(base_url: str, **overrides):
    values = {
        "judges": ["helpfulness", "process"],
        "small_model": {"model": SMALL, "base_url": base_url, "api_key_env": None},
        "large_model": {"model": LARGE, "base_url": base_url, "api_key_env": None},
        "temperatures": [0.2, 0.5, 0.8],
        "variance_threshold": 0.15,
        "uncertainty_threshold": 0.3,
        "max_concurrency": 16,
        "timeout_s": 2.0,
        "retries": 2,
        "backoff_s": 0.01,
        "max_tokens": 64,
        "fallback_score": 0.0,
    }
    values.update(overrides)
    return values


def counter(name: str, **labels) -> float:
    return TRAINER_REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def rim_factory():
    made = []

    def make(**kwargs):
        rim = RIMReward(**kwargs)
        made.append(rim)
        return rim

    yield make
    for rim in made:
        rim.close()


# ---------------------------------------------------------------- configuration


def test_shipped_configs_load():
    hosted = load_rim_config("interpretation")
    assert hosted.judges == ("accuracy", "helpfulness", "process", "diagnostic")
    assert hosted.temperatures == (0.2, 0.5, 0.8) and hosted.variance_threshold == 0.15
    assert hosted.uncertainty_threshold == 0.3 and hosted.fallback_score == 0.0
    assert hosted.small_model.api_key_env == "OPENAI_API_KEY"
    offline = load_rim_config("reward_system/interpretation_offline.yaml")
    assert offline.judges == ("helpfulness", "process")
    assert offline.small_model.base_url.startswith("http://") and offline.small_model.api_key_env is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"judges": ["accuracy", "wit"]}, "judges[1]: unknown judge 'wit'"),
        ({"small_model": {"base_url": "http://x/v1"}}, "small_model.model: required"),
        ({"large_model": None}, "large_model: required"),
        ({"variance_threshold": 1.5}, "variance_threshold: expected a value in [0.0, 1.0], got 1.5"),
        ({"uncertainty_threshold": -0.1}, "uncertainty_threshold: expected a value in [0.0, 1.0]"),
        ({"fallback_score": "low"}, "fallback_score: expected a number"),
        ({"retries": 1.5}, "retries: expected a whole number"),
        ({"weights": {"accuracy": 1.0}}, "weights.accuracy: not one of the configured judges"),
        ({"temperature": [0.1]}, "temperature: unknown key"),
        ({"judges": [{"name": "process"}]}, "judges[0]: unknown judge"),
        ({"weights": {"process": float("nan")}}, "weights.process: expected a finite number"),
    ],
)
def test_bad_config_names_the_key(change, message):
    with pytest.raises(RIMConfigError) as info:
        parse_rim_config(config("http://127.0.0.1:9/v1", **change))
    assert message in str(info.value)


def test_environment_references_in_config(monkeypatch):
    monkeypatch.setenv("JUDGE_URL", "http://judge.ns.svc:8000/v1")
    cfg = parse_rim_config(config("${JUDGE_URL}", large_model={"model": "l", "base_url": "${NOPE:-http://d/v1}"}))
    assert cfg.small_model.base_url == "http://judge.ns.svc:8000/v1"
    assert cfg.large_model.base_url == "http://d/v1"


# ---------------------------------------------------------------- judge protocol


def test_agreement_takes_the_least_uncertain_sample(rim_factory):
    by_temperature = {0.2: (0.70, 0.20), 0.5: (0.75, 0.05), 0.8: (0.80, 0.10)}

    def script(call):
        score, uncertainty = by_temperature[call.temperature]
        return Reply(judgment(score, uncertainty, rationale=f"T={call.temperature}"))

    with JudgeServer(script) as server:
        rim = rim_factory(config=config(server.base_url))
        result = rim.evaluate("What is 2 + 2?", "4, because 2 + 2 = 4.")
    assert len(server.calls_to(SMALL)) == 6 and server.calls_to(LARGE) == []
    assert sorted(c.temperature for c in server.calls) == [0.2, 0.2, 0.5, 0.5, 0.8, 0.8]
    assert result.judge_scores == {"helpfulness": 0.75, "process": 0.75}
    assert result.judge_explanations["process"] == "T=0.5"
    assert result.score == pytest.approx(0.75) and not result.escalated and result.errors == []


@pytest.mark.parametrize(
    ("tier1", "reason"),
    [
        ([(0.1, 0.1), (0.5, 0.1), (0.9, 0.1)], "variance"),
        ([(0.8, 0.1), (0.8, 0.6), (0.8, 0.1)], "uncertainty"),
    ],
)
def test_disagreement_escalates_once_per_judge(rim_factory, tier1, reason):
    def script(call):
        if call.model == LARGE:
            return Reply(judgment(0.4, 0.05, rationale="settled by the large judge"))
        score, uncertainty = tier1[[0.2, 0.5, 0.8].index(call.temperature)]
        return Reply(judgment(score, uncertainty))

    before = counter("atlas_rim_escalations_total")
    with JudgeServer(script) as server:
        rim = rim_factory(config=config(server.base_url))
        result = rim.evaluate("Explain 12 * 3.", "12 * 3 = 36")
    large_calls = server.calls_to(LARGE)
    assert len(large_calls) == 2  # exactly one per escalated judge
    # the large model is shown every tier-1 judgment
    assert all(c.messages[-1]["content"].count('"score"') >= 3 for c in large_calls)
    assert result.escalated and sorted(result.escalated_judges) == ["helpfulness", "process"]
    assert result.judge_scores == {"helpfulness": 0.4, "process": 0.4}
    assert result.judge_explanations["helpfulness"] == "settled by the large judge"
    assert counter("atlas_rim_escalations_total") == before + 2


def test_tolerant_reading_of_malformed_and_partial_json(rim_factory):
    outputs = {
        0.2: 'Sure! ```json\n{"score": 0.6, "uncertainty": 0.1, "rationale": "ok",}\n```',  # fence + comma
        0.5: (
            'Verdict: {"principles": [{"name": "a", "weight": 2}], "score": 0.62, '
            '"uncertainty": 0.05, "rationale": "cut'
        ),
        0.8: "I think the score is 0.61 overall.",  # no JSON at all: dropped after retries
    }

    with JudgeServer(lambda call: Reply(outputs[call.temperature])) as server:
        rim = rim_factory(config=config(server.base_url, judges=["process"], retries=1))
        result = rim.evaluate("task", "response")
    process = result.judges["process"]
    assert sorted(s.score for s in process.samples) == [0.6, 0.62]
    partial = next(s for s in process.samples if s.score == 0.62)
    assert partial.rationale == "cut" and partial.principles[0]["weight"] == 1.0  # renormalised
    assert len([c for c in server.calls if c.temperature == 0.8]) == 2  # one retry of the unreadable one
    assert any("unreadable judgment" in e for e in result.errors)
    assert result.score == pytest.approx(0.62)


def test_server_errors_are_retried_then_dropped(rim_factory):
    attempts = {}

    def script(call):
        attempts[call.temperature] = attempts.get(call.temperature, 0) + 1
        if call.temperature == 0.2 and attempts[0.2] == 1:
            return Reply(status=500)  # transient: the retry succeeds
        if call.temperature == 0.8:
            return Reply(status=503)  # never recovers: dropped after retries
        return Reply(judgment(0.7, 0.1))

    before, calls_before = counter("atlas_rim_judge_errors_total"), counter("atlas_rim_judge_calls_total")
    with JudgeServer(script) as server:
        rim = rim_factory(config=config(server.base_url, judges=["helpfulness"], retries=2))
        result = rim.evaluate("task", "response")
    assert attempts == {0.2: 2, 0.5: 1, 0.8: 3}
    # Three judgments asked (one per temperature; retries are not calls): the error ratio's denominator.
    assert counter("atlas_rim_judge_calls_total") == calls_before + 3
    assert result.score == 0.7 and not result.escalated
    assert result.errors == ["helpfulness: small model at T=0.8: HTTP 503"]
    assert counter("atlas_rim_judge_errors_total") == before + 1


def test_rate_limit_backs_off_and_recovers(rim_factory):
    seen = []

    def script(call):
        seen.append(time.monotonic())
        if len(seen) == 1:
            return Reply(status=429, headers={"Retry-After": "0.3"})
        return Reply(judgment(0.9, 0.0))

    with JudgeServer(script) as server:
        rim = rim_factory(config=config(server.base_url, judges=["process"], temperatures=[0.2]))
        result = rim.evaluate("task", "response")
    assert len(seen) == 2 and seen[1] - seen[0] >= 0.3  # honoured Retry-After
    assert result.score == 0.9 and result.errors == []


def test_timeouts_and_total_failure_fall_back(rim_factory):
    with JudgeServer(lambda call: Reply(judgment(0.9), delay_s=1.0)) as server:
        rim = rim_factory(config=config(server.base_url, timeout_s=0.2, retries=1, fallback_score=0.25))
        result = rim.evaluate("task", "response")
    # 2 judges x 3 temperatures x 2 attempts, then one escalation per judge (2 attempts each)
    assert len(server.calls_to(SMALL)) == 12 and len(server.calls_to(LARGE)) == 4
    assert result.judge_scores == {"helpfulness": 0.25, "process": 0.25}
    assert result.score == 0.25 and not math.isnan(result.score)
    assert any("timeout after 0.2 s" in e for e in result.errors)
    assert result.judges["process"].failed


def test_refused_connection_never_raises(rim_factory):
    from harness.env import free_port

    rim = rim_factory(config=config(f"http://127.0.0.1:{free_port()}/v1", retries=1))
    scores = rim(prompts=["a", "b"], completions=["x", "y"])
    assert scores == [0.0, 0.0]
    result = rim.evaluate("a", "x")
    assert result.errors and all("connection failed" in e for e in result.errors)


def test_concurrency_is_bounded(rim_factory):
    with JudgeServer(lambda call: Reply(judgment(0.5, 0.1), delay_s=0.1)) as server:
        rim = rim_factory(config=config(server.base_url, max_concurrency=4))
        scores = rim(prompts=[f"p{i}" for i in range(8)], completions=[f"c{i}" for i in range(8)])
    assert len(server.calls) == 48 and scores == [0.5] * 8
    assert server.max_in_flight == 4


def test_api_key_is_sent_but_never_shown(rim_factory, monkeypatch, caplog):
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("JUDGE_API_KEY", secret)

    def script(call):  # a misbehaving server that echoes the credentials into its rationale
        return Reply(judgment(0.8, 0.1, rationale=f"auth was {call.headers.get('Authorization')}"))

    endpoint = {"model": SMALL, "api_key_env": "JUDGE_API_KEY"}
    with JudgeServer(script) as server:
        cfg = config(
            server.base_url,
            small_model={**endpoint, "base_url": server.base_url},
            large_model={**endpoint, "base_url": server.base_url},
        )
        rim = rim_factory(config=cfg)
        result = rim.evaluate("task", "response")
    assert server.calls[0].headers["Authorization"] == f"Bearer {secret}"
    assert secret not in result.rationale and all(secret not in e for e in result.judge_explanations.values())
    assert all(secret not in s.rationale for r in result.judges.values() for s in r.samples)
    assert all(secret not in r.rationale for r in result.judges.values())
    assert "[redacted]" in result.rationale
    assert secret not in repr(rim.config) and secret not in caplog.text


def test_verifiable_accuracy_needs_no_model(rim_factory):
    with JudgeServer(lambda call: Reply(judgment(0.9, 0.0))) as server:
        rim = rim_factory(config=config(server.base_url, judges=["accuracy", "process"]))
        right = rim.evaluate("What is 3 + 4?", "3 + 4 = 7. \\boxed{7}", ground_truth="7")
        wrong = rim.evaluate("What is 3 + 4?", "\\boxed{8}", ground_truth="7")
    assert all("accuracy" not in c.messages[0]["content"] for c in server.calls)  # only the process judge called
    assert right.judge_scores == {"accuracy": 1.0, "process": 0.9}
    # process <= accuracy + 0.1 when the answer is wrong
    assert wrong.judge_scores == {"accuracy": 0.0, "process": pytest.approx(0.1)}
    assert wrong.score == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({"accuracy": 0.2, "process": 0.9}, {"accuracy": 0.2, "process": 0.3}),
        ({"accuracy": 0.9, "process": 0.8}, {"accuracy": 0.9, "process": 0.8}),
        ({"process": 0.4, "helpfulness": 0.9}, {"process": 0.4, "helpfulness": 0.5}),
        ({"process": 0.5, "helpfulness": 0.9}, {"process": 0.5, "helpfulness": 0.9}),
        ({"helpfulness": 0.9, "diagnostic": 0.3}, {"helpfulness": 0.4, "diagnostic": 0.3}),
        (
            {"accuracy": 0.1, "process": 0.9, "helpfulness": 0.9, "diagnostic": 0.9},
            {"accuracy": 0.1, "process": 0.2, "helpfulness": 0.5, "diagnostic": 0.9},
        ),
        ({"helpfulness": 0.9}, {"helpfulness": 0.9}),  # rules need both judges active
        ({"accuracy": 1.0, "process": 1.0}, {"accuracy": 1.0, "process": 1.0}),
    ],
)
def test_consistency_rules(scores, expected):
    assert apply_consistency(scores) == pytest.approx(expected)


def test_weighted_mean():
    assert combine({"accuracy": 1.0, "process": 0.0}, {}) == 0.5
    assert combine({"accuracy": 1.0, "process": 0.0}, {"accuracy": 3.0}) == 0.75


# ---------------------------------------------------------------- as a TRL reward function


def test_reward_function_call_logs_per_sample_info(rim_factory, fresh_trainer_metrics):
    logged, metrics_logged = {}, {}
    with JudgeServer(lambda call: Reply(judgment(0.6, 0.1, rationale="solid"))) as server:
        rim = rim_factory(config=config(server.base_url, judges=["accuracy", "helpfulness"]))
        scores = rim(
            prompts=[[{"role": "user", "content": "What is 1 + 1?"}]] * 2,
            completions=[[{"role": "assistant", "content": "\\boxed{2}"}], [{"role": "assistant", "content": "3"}]],
            ground_truth=["2", "2"],
            completion_ids=[[1], [2]],
            log_extra=lambda name, values: logged.__setitem__(name, values),
            log_metric=lambda name, value: metrics_logged.__setitem__(name, value),
        )
    assert scores == [pytest.approx(0.8), pytest.approx(0.3)]
    assert logged["rim_rewards"] == scores
    assert "accuracy 1.00" in logged["rim_explanations"][0] and "solid" in logged["rim_explanations"][0]
    assert metrics_logged["rim/accuracy"] == 0.5 and metrics_logged["rim/helpfulness"] == pytest.approx(0.6)
    assert TRAINER_REGISTRY.get_sample_value("atlas_rim_judge_score", {"judge": "helpfulness"}) == pytest.approx(0.6)
    # the trainer registry only: nothing of ours in prometheus_client's process-wide default registry
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("atlas_")]


def test_grpo_trainer_with_rim_logs_rim_columns(tmp_path, tiny_model_dir, rim_factory):
    import pandas as pd
    from datasets import Dataset

    from atlas_core.tasks.arithmetic import make_arithmetic_dataset
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    with JudgeServer(lambda call: Reply(judgment(0.5, 0.1))) as server:
        rim = rim_factory(config=config(server.base_url, judges=["accuracy", "process"]))
        args = GRPOConfig(
            output_dir=str(tmp_path),
            model_name_or_path=str(tiny_model_dir),
            per_device_train_batch_size=4,
            num_generations=4,
            max_completion_length=8,
            max_steps=2,
            logging_steps=1,
            log_completions=True,
            report_to=[],
            save_strategy="no",
            gradient_checkpointing=False,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(reward_funcs=rim, args=args, train_dataset=Dataset.from_list(make_arithmetic_dataset(16)))
        trainer.train()
    assert len(server.calls) == 2 * 4 * 3  # steps x completions x temperatures (accuracy is verifiable)
    table = pd.read_parquet(tmp_path / "completions" / "completions_00002.parquet")
    assert {"rim_rewards", "rim_explanations", "rim"} <= set(table.columns)
    assert table["rim_rewards"].tolist() == pytest.approx(table["rim"].tolist())
    assert table["rim_explanations"].str.contains("process 0.").all()
    last = trainer.state.log_history[-2]
    assert "rim/process" in last and "rewards/rim/mean" in last


def test_offline_transformers_backend_does_not_crash(tiny_model_dir, rim_factory):
    local = {"model": str(tiny_model_dir), "backend": "transformers"}
    rim = rim_factory(
        config=config(None, small_model=local, large_model=local, judges=["process"], retries=0, max_tokens=8)
    )
    result = rim.evaluate("What is 2 + 2?", "4")
    # a tiny random model writes no valid judgment: errors recorded, fallback score, no exception
    assert result.score == 0.0 and result.judges["process"].failed
    assert any("unreadable judgment" in e for e in result.errors)


def test_rim_from_the_run_configuration(tmp_path, atlas_cache, capfd):
    """`reward.config=<file>` switches the reward to RIM with no code change (CLI, as pods run it)."""
    import json
    import subprocess

    import yaml

    from harness.env import PYTHON, python_env

    with JudgeServer(lambda call: Reply(judgment(0.5, 0.1))) as server:
        rim_file = tmp_path / "judges.yaml"
        rim_file.write_text(yaml.safe_dump(config(server.base_url, judges=["accuracy", "process"])))
        out = tmp_path / "run"
        proc = subprocess.run(
            [
                PYTHON,
                "-m",
                "atlas_core.cli.train",
                "recipe=tiny_grpo",
                "reward.funcs=[]",
                f"reward.config={rim_file}",
                f"output_dir={out}",
                "trainer.max_steps=1",
                "trainer.metrics_port=0",
                "trainer.save_strategy=no",
            ],
            env=python_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert len(server.calls) == 8 * 3  # one generation batch x 3 temperatures of the process judge
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert "rewards/rim/mean" in record and "rim/process" in record

    # A RIM config that does not exist: refused before any training (the command's main(), in this process).
    from atlas_core.cli.train import main

    assert main(["recipe=tiny_grpo", "reward.config=nope", f"output_dir={out}"]) == 2
    assert "error: reward.config: config_path: no RIM config 'nope'" in capfd.readouterr().err


def test_a_key_put_in_api_key_env_is_never_echoed(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123456")
    with pytest.raises(RIMConfigError) as info:
        parse_rim_config(
            config(
                "http://127.0.0.1:9/v1",
                small_model={"model": "m", "base_url": "http://x/v1", "api_key_env": "${OPENAI_API_KEY}"},
            )
        )
    assert "small_model.api_key_env: expected the name of an environment variable" in str(info.value)
    assert "sk-secret" not in str(info.value)
