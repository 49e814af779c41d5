"""TeacherGRPOTrainer: the teaching protocol on tiny teacher and student models, and its API contract."""

from __future__ import annotations

import math
import re

import pytest
import torch
from datasets import Dataset

from atlas_core.tasks.arithmetic import make_arithmetic_dataset
from atlas_core.teaching import prompts
from atlas_core.teaching.student import EndpointStudent
from atlas_core.telemetry.metrics import TRAINER_REGISTRY
from atlas_core.training.algorithms.grpo_config import GRPOConfig
from atlas_core.training.algorithms.teacher_trainers import DiagnosticResult, TeacherGRPOTrainer
from harness.judge_server import JudgeServer, Reply
from tests.support.training import tiny_grpo_args


def teacher_args(tmp_path, model_dir, **overrides) -> GRPOConfig:
    teacher = dict(
        output_dir=str(tmp_path / "teacher"),
        per_device_train_batch_size=4,
        max_steps=2,
        max_probe_tokens=8,
        student_max_tokens=12,
        student_samples=2,
    )
    return tiny_grpo_args(tmp_path, model_dir, **{**teacher, **overrides})


def arithmetic(n=32) -> Dataset:
    return Dataset.from_list(make_arithmetic_dataset(n, seed=3))


@pytest.fixture(scope="module")
def trainer(tmp_path_factory, tiny_model_dir, warm_model_dir):
    tmp = tmp_path_factory.mktemp("teacher-api")
    return TeacherGRPOTrainer(
        args=teacher_args(tmp, tiny_model_dir), train_dataset=arithmetic(), student_model=str(warm_model_dir)
    )


# ---------------------------------------------------------------- reward formula


@pytest.mark.parametrize(
    ("baseline", "enhanced", "length", "expected"),
    [
        (0.6, 0.8, 120, 0.6),  # the design's examples
        (0.5, 0.5, 10, 0.0),
        (0.8, 0.6, 50, -2.2),
        (0.0, 1.0, 0, 2.0),  # full improvement, no words: maximal efficiency bonus
        (0.0, 1.0, 200, 1.0),  # at the horizon the bonus is gone
        (0.0, 1.0, 500, 1.0),  # and never negative
        (0.2, 0.3, 100, 0.6),
        (1.0, 0.0, 0, -3.0),  # full degradation
        (0.7, 0.7, 0, 0.0),  # no change, however short
    ],
)
def test_teaching_reward_formula(trainer, baseline, enhanced, length, expected):
    assert trainer.compute_teaching_reward(baseline, enhanced, length) == pytest.approx(expected)


def test_horizon_and_penalty_are_config_fields(tmp_path, tiny_model_dir, warm_model_dir):
    args = teacher_args(tmp_path, tiny_model_dir, efficiency_horizon=100, degradation_penalty=1.0)
    other = TeacherGRPOTrainer(args=args, train_dataset=arithmetic(), student_model=str(warm_model_dir))
    assert other.compute_teaching_reward(0.6, 0.8, 50) == pytest.approx(0.7)
    assert other.compute_teaching_reward(0.8, 0.6, 50) == pytest.approx(-1.2)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda t: t.compute_teaching_reward(1.2, 0.5, 10), ValueError, "baseline_score"),
        (lambda t: t.compute_teaching_reward(0.5, -0.1, 10), ValueError, "enhanced_score"),
        (lambda t: t.compute_teaching_reward(0.5, float("nan"), 10), ValueError, "enhanced_score"),
        (lambda t: t.compute_teaching_reward(0.5, 0.6, -1), ValueError, "teaching_length"),
        (lambda t: t.compute_teaching_reward("0.5", 0.6, 1), TypeError, "baseline_score"),
        (lambda t: t.compute_teaching_reward(0.5, None, 1), TypeError, "enhanced_score"),
        (lambda t: t.compute_teaching_reward(0.5, 0.6, 1.5), TypeError, "teaching_length"),
        (lambda t: t.diagnostic_probe(""), ValueError, "task"),
        (lambda t: t.diagnostic_probe("   "), ValueError, "task"),
        (lambda t: t.diagnostic_probe("2 + 2?", max_tokens=0), ValueError, "max_tokens"),
        (lambda t: t.diagnostic_probe(42), TypeError, "task"),
        (lambda t: t.diagnostic_probe("2 + 2?", max_tokens="5"), TypeError, "max_tokens"),
        (lambda t: t.generate_guidance("2 + 2?", None), ValueError, "diagnostic"),
        (lambda t: t.generate_guidance("2 + 2?", DiagnosticResult(0.5, 0.5), max_tokens=9), ValueError, "max_tokens"),
        (lambda t: t.generate_guidance(["2 + 2?"], DiagnosticResult(0.5, 0.5)), TypeError, "task"),
        (lambda t: t.generate_guidance("2 + 2?", {"capability_level": 0.5}), TypeError, "diagnostic"),
    ],
)
def test_validation(trainer, call, error, message):
    with pytest.raises(error, match=message):
        call(trainer)


def test_constructor_requires_student_and_a_way_to_score(tmp_path, tiny_model_dir, warm_model_dir):
    with pytest.raises(ValueError, match="student_model"):
        TeacherGRPOTrainer(args=teacher_args(tmp_path, tiny_model_dir), train_dataset=arithmetic())
    no_truth = Dataset.from_list([{"prompt": "Explain gravity."}] * 8)
    with pytest.raises(ValueError, match="reward_funcs"):
        TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir), train_dataset=no_truth, student_model=str(warm_model_dir)
        )


class BrokenStudent:
    name = "broken"

    def generate(self, *args, **kwargs):
        raise RuntimeError("student 'broken' failed to generate: out of memory")


def test_model_failures_are_runtime_errors(tmp_path, tiny_model_dir, warm_model_dir):
    t = TeacherGRPOTrainer(
        args=teacher_args(tmp_path, tiny_model_dir), train_dataset=arithmetic(), student_model=str(warm_model_dir)
    )
    t.student = BrokenStudent()
    with pytest.raises(RuntimeError, match="student"):
        t.diagnostic_probe("What is 2 + 2?")


# ---------------------------------------------------------------- protocol pieces


@pytest.mark.parametrize(
    ("capability", "template"),
    [(0.0, "walkthrough"), (0.29, "walkthrough"), (0.3, "hints"), (0.7, "hints"), (0.71, "minimal"), (1.0, "minimal")],
)
def test_templates_switch_with_capability(capability, template):
    assert prompts.template_for(capability) == template
    system = prompts.teacher_messages("What is 2 + 2?", "I add.", capability)[0]["content"]
    assert system.startswith(prompts.TEACHER_TEMPLATES[template])
    assert "without stating the final answer" in system


def test_guidance_extraction_and_withheld_answer():
    assert prompts.extract_guidance("<thinking>hm</thinking><teaching>Count up.</teaching>") == "Count up."
    assert prompts.extract_guidance("<thinking>x</thinking>plain words") == "plain words"
    assert prompts.extract_guidance("<teaching>cut off") == "cut off"
    assert prompts.withhold_answer("3 + 4 is 7, not 17 or 7.5", "7") == "3 + 4 is [withheld], not 17 or 7.5"
    # a real teacher writes the answer in words too
    said = "So the sum is Twenty-One, or twenty one; not twenty or twenty-two."
    assert prompts.withhold_answer(said, "21") == "So the sum is [withheld], or [withheld]; not twenty or twenty-two."
    assert prompts.withhold_answer("six, sixteen and 16", "16") == "six, [withheld] and [withheld]"
    assert prompts.withhold_answer("minus five is -5", "-5") == "[withheld] is [withheld]"


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ("0", "zero"),
        ("13", "thirteen"),
        ("40", "forty"),
        ("-21", "minus twenty one"),
        ("105", "one hundred five"),
        ("2,000", "two thousand"),
        ("12345", "twelve thousand three hundred forty five"),
        ("7.5", None),
        ("Paris", None),
    ],
)
def test_number_words(answer, words):
    assert prompts.number_words(answer) == words


def test_diagnostic_probe_measures_capability_from_student_answers(tmp_path, tiny_model_dir):
    def script(call):
        text = call.messages[-1]["content"]
        if prompts.PROBE_INSTRUCTION in text:
            return Reply("I would add the two numbers.")
        return Reply(["\\boxed{7}", "\\boxed{8}"])  # one right, one wrong, per baseline request

    with JudgeServer(script, served_model="student-llm") as server:
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir), train_dataset=arithmetic(), student_model=server.base_url
        )
        result = t.diagnostic_probe("What is 3 + 4?", max_tokens=20, ground_truth="7")
    assert {c.model for c in server.calls} == {"student-llm"}  # the served name, read from /v1/models
    assert result.capability_level == 0.5 and result.baseline_score == 0.5
    assert result.confidence_score == 0.0  # the two answers disagree
    assert result.identified_gaps == ["answered 8 where 7 was expected"]
    assert result.probe_response == "I would add the two numbers." and result.probe_tokens == 3
    assert result.response_quality["answer_rate"] == 1.0
    probe_call = next(c for c in server.calls if prompts.PROBE_INSTRUCTION in c.messages[-1]["content"])
    assert probe_call.max_tokens == 20 and probe_call.n == 1


def test_a_student_endpoint_still_loading_is_waited_for_before_training(tmp_path, tiny_model_dir):
    """A student server that answers 503 while it loads (vLLM) is polled until it serves a model: the trainer is
    built only then, so no step trains on unscorable batches."""
    with JudgeServer(lambda call: Reply("\\boxed{7}"), models_unavailable=2) as server:
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir), train_dataset=arithmetic(), student_model=server.base_url
        )
        assert server.models_requests == 3 and not server.calls  # two refusals, then served; nothing asked yet
        assert t.diagnostic_probe("What is 3 + 4?", max_tokens=8, ground_truth="7").baseline_score == 1.0


def test_a_student_endpoint_that_never_serves_ends_a_local_run_naming_it(tmp_path, tiny_model_dir):
    """Without the watchdog (a local run) the wait is ``server_timeout_seconds``, then an error naming the URL."""
    with JudgeServer(lambda call: Reply("x"), models_unavailable=10**6) as server:
        args = teacher_args(tmp_path, tiny_model_dir, server_timeout_seconds=1.5)
        with pytest.raises(RuntimeError, match=rf"{re.escape(server.base_url)}/models did not answer for 1.5 s"):
            TeacherGRPOTrainer(args=args, train_dataset=arithmetic(), student_model=server.base_url)
        assert server.models_requests >= 2


def test_greedy_samples_from_a_student_endpoint_are_one_request_each_as_vllm_requires():
    """vLLM answers 400 to ``n`` > 1 at temperature 0 ("n must be 1 when using greedy sampling"): K greedy samples
    are one request of n=1 per conversation, its answer repeated (greedy decoding gives every sample that answer);
    sampled ones ask for n=K."""

    def script(call):
        if call.temperature == 0 and call.n > 1:
            return Reply(status=400)  # as vLLM 0.32
        return Reply([f"\\boxed{{{call.index}}}"] * call.n)

    questions = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "And 1 + 1?"}]]
    with JudgeServer(script) as server:
        student = EndpointStudent(server.base_url)
        greedy = student.generate(questions, 8, num_samples=3, temperature=0)
        sampled = student.generate(questions[:1], 8, num_samples=3, temperature=0.7)
    assert sorted(c.n for c in server.calls) == [1, 1, 3]
    assert [len(group) for group in greedy] == [3, 3] and all(len(set(group)) == 1 for group in greedy)
    assert greedy[0][0] != greedy[1][0] and len(sampled[0]) == 3


def test_endpoint_student_teaching_step(tmp_path, tiny_model_dir):
    def script(call):
        text = call.messages[-1]["content"]
        if prompts.GUIDANCE_INTRO in text:
            return Reply("\\boxed{7}")  # guided: right
        if prompts.PROBE_INSTRUCTION in text:
            return Reply("add")
        return Reply("\\boxed{1}")  # unguided: wrong

    with JudgeServer(script) as server:
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir, student_samples=1, max_guidance_tokens=20),
            train_dataset=arithmetic(),
            student_model=server.base_url,
        )
        tasks = ["What is 3 + 4?", "What is 5 + 2?", "What is 1 + 6?"]
        rewards = t.teaching_step({"prompts": tasks, "ground_truth": ["7", "7", "7"]})
    assert len(rewards) == 3 and all(isinstance(r, float) and math.isfinite(r) for r in rewards)
    # Three tasks: three probes, three baseline answers and three guided answers (one sample each).
    contents = [c.messages[-1]["content"] for c in server.calls]
    assert len(contents) == 9 and all(c.n == 1 for c in server.calls)
    assert sum(prompts.PROBE_INSTRUCTION in c for c in contents) == 3
    guided = [c for c in contents if prompts.GUIDANCE_INTRO in c]
    assert sorted(c.split("\n\n")[0] for c in guided) == sorted(tasks)  # every task got the teacher's guidance
    # ... and the student, guided, gets it right: d = 1 plus an efficiency bonus > 0 (the guidance is at most
    # max_guidance_tokens, far below the 200-token horizon).
    assert all(1.0 < r <= 2.0 for r in rewards), rewards
    for content in guided:  # the reference answer never reaches the student through the guidance
        assert not re.search(r"(?<![\w.])7(?![\w]|\.\d)", content.split(prompts.GUIDANCE_INTRO)[1])


def test_teaching_step_local_student_one_float_per_prompt(trainer):
    rewards = trainer.teaching_step(
        {
            "prompts": [f"What is {i} + 2? Put the final answer in \\boxed{{}}." for i in range(5)],
            "ground_truth": [str(i + 2) for i in range(5)],
        }
    )
    assert len(rewards) == 5 and all(isinstance(r, float) and math.isfinite(r) for r in rewards)
    assert all(-3.0 <= r <= 2.0 for r in rewards)


def test_student_is_loaded_frozen(trainer):
    model = trainer.student.model
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())


# ---------------------------------------------------------------- training


class RecordingTeacher(TeacherGRPOTrainer):
    """Records the token ids every policy log-prob computation sees (the user's hook, not ours)."""

    seen_inputs: list[torch.Tensor] = []

    def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
        type(self).seen_inputs.append(input_ids.detach().cpu())
        return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)


def test_train_logs_teaching_metrics_and_keeps_the_student_frozen(
    tmp_path, tiny_model_dir, warm_model_dir, fresh_trainer_metrics
):
    from harness.env import free_port

    RecordingTeacher.seen_inputs.clear()
    port = free_port()
    args = teacher_args(
        tmp_path, tiny_model_dir, metrics_port=port, metrics_host="127.0.0.1", metrics_run="teach", metrics_kind="T"
    )
    t = RecordingTeacher(args=args, train_dataset=arithmetic(), student_model=str(warm_model_dir))
    before = {k: v.clone() for k, v in t.student.model.state_dict().items()}
    t.train()

    logs = [r for r in t.state.log_history if "teaching/reward" in r]
    assert len(logs) == 2
    for key in (
        "teaching/reward",
        "teaching/student_accuracy",
        "teaching/baseline_accuracy",
        "teaching/accuracy_delta",
        "teaching/improvement_rate",
        "teaching/degradation_rate",
        "teaching/guidance_tokens_mean",
        "teaching/guidance_tokens_std",
    ):
        assert all(math.isfinite(r[key]) for r in logs), key
    assert logs[-1]["reward"] == pytest.approx(logs[-1]["teaching/reward"], abs=1e-5)
    labels = {"namespace": "local", "run": "teach", "kind": "T"}
    assert TRAINER_REGISTRY.get_sample_value("atlas_teaching_reward", labels) == pytest.approx(
        logs[-1]["teaching/reward"]
    )
    assert TRAINER_REGISTRY.get_sample_value("atlas_teaching_guidance_tokens_mean", labels) == pytest.approx(
        logs[-1]["teaching/guidance_tokens_mean"]
    )

    # The frozen student is bit-identical after training.
    after = t.student.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)

    # GRPO's log-probs were computed on the teacher prompt that produced the guidance.
    tokenizer = t.processing_class
    texts = [
        tokenizer.decode(ids, skip_special_tokens=False) for batch in RecordingTeacher.seen_inputs for ids in batch
    ]
    assert texts and all("Measured student capability" in text for text in texts)
    assert all("The student's approach:" in text and "Task:\nWhat is" in text for text in texts)
    assert all(any(t_.split(".")[0] in text for t_ in prompts.TEACHER_TEMPLATES.values()) for text in texts)


def test_capability_from_the_rim_diagnostic_judge(tmp_path, tiny_model_dir):
    """With a RIM diagnostic judge among the scorers, capability is that judge's reading of the probe."""
    from atlas_core.reward.interpretation import RIMReward
    from harness.judge_server import judgment

    def script(call):
        if call.model == "judge":
            return Reply(judgment(0.85, 0.05, rationale="knows the method, slips on carries"))
        if prompts.PROBE_INSTRUCTION in call.messages[-1]["content"]:
            return Reply("Add ones, then tens.")
        return Reply("\\boxed{7}")

    with JudgeServer(script, served_model="student") as server:
        endpoint = {"model": "judge", "base_url": server.base_url, "api_key_env": None}
        rim = RIMReward(config={"judges": ["accuracy", "diagnostic"], "small_model": endpoint, "large_model": endpoint})
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir),
            reward_funcs=rim,
            train_dataset=arithmetic(),
            student_model=server.base_url,
        )
        result = t.diagnostic_probe("What is 3 + 4?", ground_truth="7")
        rim.close()
    assert result.capability_level == pytest.approx(0.85)
    assert "knows the method, slips on carries" in result.identified_gaps
    # the baseline answers are scored by RIM: mean of accuracy 1.0 (verifiable) and diagnostic 0.85
    assert result.baseline_score == pytest.approx(0.925)
    assert prompts.template_for(result.capability_level) == "minimal"


def test_endpoint_that_ignores_n_still_gives_every_sample(tmp_path, tiny_model_dir):
    from atlas_core.teaching.student import EndpointStudent

    with JudgeServer(lambda call: Reply(["\\boxed{7}"])) as server:  # always one choice, whatever n says
        student = EndpointStudent(server.base_url)
        answers = student.generate([[{"role": "user", "content": "What is 3 + 4?"}]], 8, num_samples=3)
    assert [a.text for a in answers[0]] == ["\\boxed{7}"] * 3
    assert [c.n for c in server.calls] == [3, 2, 1]


def test_student_failure_during_training_does_not_stop_it(tmp_path, tiny_model_dir, warm_model_dir):
    t = TeacherGRPOTrainer(
        args=teacher_args(tmp_path, tiny_model_dir, max_steps=2),
        train_dataset=arithmetic(),
        student_model=str(warm_model_dir),
    )
    t.student = BrokenStudent()
    t.train()  # every batch is unscorable: no reward, no update, no crash
    assert t.state.global_step == 2
    logs = [r for r in t.state.log_history if "teaching/unscored_batches" in r]
    assert logs and all(r["teaching/unscored_batches"] == 1.0 for r in logs)


def test_guidance_is_cut_to_max_guidance_tokens(tmp_path, tiny_model_dir):
    """spec.teaching.maxGuidanceTokens bounds what the student reads during training, whatever the teacher
    wrote (its completion may be longer: max_completion_length also holds its thinking)."""
    with JudgeServer(lambda call: Reply("\\boxed{7}")) as server:
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir, student_samples=1, max_guidance_tokens=12),
            train_dataset=arithmetic(),
            student_model=server.base_url,
        )
        long = "<teaching>" + " ".join(f"step{i} add the units then the tens" for i in range(20)) + "</teaching>"
        rewards = t.compute_rewards([long], ["What is 3 + 4?"], ground_truth=["7"])
    guided = [c.messages[-1]["content"] for c in server.calls if prompts.GUIDANCE_INTRO in c.messages[-1]["content"]]
    assert len(guided) == 1 and len(rewards) == 1
    shown = guided[0].split(prompts.GUIDANCE_INTRO)[1].strip()
    assert 0 < len(t.processing_class(shown, add_special_tokens=False)["input_ids"]) <= 12
    assert "step19" not in shown and shown.startswith("step0")


@pytest.mark.parametrize(
    ("reply", "scored"),
    [
        (Reply(raw="<html>502 from a proxy</html>"), False),
        (Reply(message_content=[{"type": "image_url", "image_url": {"url": "x"}}]), False),
        (Reply(message_content=[{"type": "text", "text": "\\boxed{7}"}]), True),  # content parts: text is read
    ],
    ids=["non-json-body", "non-text-content", "text-parts"],
)
def test_student_endpoint_answering_garbage_gives_an_unscored_batch(tmp_path, tiny_model_dir, reply, scored):
    """A student server that answers 200 with something that is not a chat answer: the batch is unscored
    (NaN rewards: TRL gives it no advantage), training goes on, and the retries stay bounded."""
    with JudgeServer(lambda call: reply) as server:
        t = TeacherGRPOTrainer(
            args=teacher_args(tmp_path, tiny_model_dir, student_samples=1),
            train_dataset=arithmetic(),
            student_model=server.base_url,
        )
        rewards = t.compute_rewards(["<teaching>add</teaching>"], ["What is 3 + 4?"], ground_truth=["7"])
    assert len(rewards) == 1 and math.isnan(float(rewards[0])) is not scored
    assert 1 <= len(server.calls) <= 3 * t.student.retry_policy.attempts
