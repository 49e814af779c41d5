"""Every example of the trainers reference (../shared/seed/trainers-reference.md), run against our package.

Each test keeps the page's code as printed; what it swaps is said next to it: model names and data
(the offline tiny model, the bundled arithmetic task), judge endpoints (a scripted OpenAI-compatible
server on 127.0.0.1, reached through the configs' ${...} address variables), and the budget knobs a
CPU needs (max_completion_length, steps). Where the page is wrong about a third-party API, the test
shows that and runs the corrected form (docs/trainers.md says the same).
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import torch
from datasets import Dataset

from atlas_core.answers import exact_match_reward, extract_answer
from atlas_core.tasks.arithmetic import make_arithmetic_dataset
from harness.env import REPO, free_port, python_env
from harness.judge_server import JudgeServer, Reply, judgment

# Budget knobs added to the printed configs so that a step takes well under a second on a CPU.
CPU_BUDGET = dict(max_completion_length=16, report_to=[], disable_tqdm=True, gradient_checkpointing=False)


@pytest.fixture
def judges(monkeypatch):
    """The judge endpoints of both shipped RIM configs, served locally (a constant, confident judge)."""
    with JudgeServer(lambda call: Reply(judgment(0.6, 0.1, rationale="clear and correct steps"))) as server:
        monkeypatch.setenv("ATLAS_JUDGE_BASE_URL", server.base_url)
        monkeypatch.setenv("ATLAS_JUDGE_SMALL_URL", server.base_url)
        monkeypatch.setenv("ATLAS_JUDGE_LARGE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        yield server


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the page writes ./output/...
    return tmp_path


@pytest.fixture
def train_data():
    return Dataset.from_list(make_arithmetic_dataset(4, seed=11))


@pytest.fixture
def eval_data():
    return Dataset.from_list(make_arithmetic_dataset(4, seed=12))


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")


def completion_length_reward(completions, **kwargs):
    """A reward the untrained tiny model gets varied values of (so that the policy moves)."""
    return [len(c[-1]["content"]) / 100 for c in completions]


# ---------------------------------------------------------------- Typical Usage


def test_standard_grpo_training(in_tmp, judges, warm_model_dir, tokenizer, train_data, eval_data):
    from atlas_core.reward.interpretation import RIMReward
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    grpo_args = GRPOConfig(
        output_dir="./output/grpo",
        model_name_or_path=str(warm_model_dir),  # for "Arc-Intelligence/ATLAS-8B-Thinking"
        learning_rate=5e-6,
        num_train_epochs=3,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        beta=0.04,  # KL penalty
        logging_steps=10,
        **CPU_BUDGET,
    )
    reward = RIMReward(config_path="reward_system/interpretation.yaml")
    trainer = GRPOTrainer(
        model=grpo_args.model_name_or_path,
        reward_funcs=reward,
        args=grpo_args,
        train_dataset=train_data,
        eval_dataset=eval_data,
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model("./output/grpo/checkpoint-final")

    assert trainer.state.global_step == 6  # 4 prompts x 3 epochs, 2 prompts (16 completions) per step
    assert (in_tmp / "output/grpo/checkpoint-final/config.json").exists()
    logged = [r for r in trainer.state.log_history if "rewards/rim/mean" in r]
    assert logged and all(0.0 <= r["rewards/rim/mean"] <= 1.0 for r in logged)
    # the four judges ran: accuracy by exact match (ground_truth), the other three on the endpoint
    assert judges.calls and {c.model for c in judges.calls} == {"gpt-4.1-mini"}
    reward.close()


def test_dual_agent_teacher_training(in_tmp, judges, tiny_model_dir, warm_model_dir, tokenizer, train_data):
    from atlas_core.reward.interpretation import RIMReward
    from atlas_core.training.algorithms.grpo_config import GRPOConfig
    from atlas_core.training.algorithms.teacher_trainers import TeacherGRPOTrainer

    teacher_args = GRPOConfig(
        output_dir="./output/teacher-grpo",
        model_name_or_path=str(tiny_model_dir),  # for "Arc-Intelligence/ATLAS-8B-Thinking"
        learning_rate=5e-6,
        num_train_epochs=3,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=8,
        beta=0.04,
        logging_steps=10,
        max_probe_tokens=8,
        student_max_tokens=12,
        **CPU_BUDGET,
    )
    reward = RIMReward(config_path="reward_system/interpretation_offline.yaml")
    trainer = TeacherGRPOTrainer(
        model=teacher_args.model_name_or_path,
        reward_funcs=reward,
        args=teacher_args,
        train_dataset=train_data.select(range(2)),
        processing_class=tokenizer,
        student_model=str(warm_model_dir),  # for "meta-llama/Llama-3.2-8B-Instruct"
    )
    trainer.train()
    trainer.save_model("./output/teacher-grpo/checkpoint-final")

    assert trainer.state.global_step == 6  # 2 prompts x 3 epochs, one prompt group of 8 per step
    assert (in_tmp / "output/teacher-grpo/checkpoint-final/model.safetensors").exists()
    summary = [r for r in trainer.state.log_history if "teaching/reward" in r]
    assert summary and all(math.isfinite(r["teaching/reward"]) for r in summary)
    # RIM (helpfulness and process on the in-cluster endpoint) scored the student's answers
    assert {c.model for c in judges.calls} == {"Qwen/Qwen3-8B"}
    reward.close()


def test_sft_warmup(in_tmp, tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig as TRLSFTConfig
    from trl import SFTTrainer as TRLSFTTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sft_dataset = Dataset.from_list(
        [
            {
                "messages": [
                    {"role": "user", "content": r["prompt"][0]["content"]},
                    {"role": "assistant", "content": f"\\boxed{{{r['ground_truth']}}}"},
                ]
            }
            for r in make_arithmetic_dataset(64, seed=5)
        ]
    )
    # As printed, with TRL's SFTTrainer: TRL 1.16 has neither `tokenizer` nor `max_seq_length` (the page is
    # wrong about TRL: they are `processing_class` and `SFTConfig.max_length`).
    training_args = TRLSFTConfig(output_dir="./output/sft", max_steps=20, bf16=False, use_cpu=True, report_to=[])
    with pytest.raises(TypeError, match="tokenizer"):
        TRLSFTTrainer(
            model=model, args=training_args, train_dataset=sft_dataset, tokenizer=tokenizer, max_seq_length=2048
        )

    # The same code with Atlas's SFTTrainer, which accepts both.
    from atlas_core.training.algorithms.sft import SFTConfig, SFTTrainer

    training_args = SFTConfig(
        output_dir="./output/sft", max_steps=20, learning_rate=3e-3, logging_steps=5, report_to=[], disable_tqdm=True
    )
    trainer = SFTTrainer(
        model=model, args=training_args, train_dataset=sft_dataset, tokenizer=tokenizer, max_seq_length=2048
    )
    trainer.train()
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0]
    assert trainer.args.max_length == 2048

    formatted = trainer.format_dataset(sft_dataset)
    assert formatted[0]["text"].startswith("<|im_start|>user\n")
    tokenized = formatted.map(lambda e: tokenizer(e["text"]), remove_columns=formatted.column_names)
    packed = trainer.pack_sequences(tokenized, seq_length=128)
    assert len(packed) < len(tokenized) and max(len(ids) for ids in packed["input_ids"]) <= 128
    assert sum(len(ids) for ids in packed["input_ids"]) == sum(len(ids) for ids in tokenized["input_ids"])


# ---------------------------------------------------------------- GRPOTrainer override hooks


def test_override_hooks(in_tmp, tiny_model_dir, train_data, eval_data):
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    calls = []

    class HookedTrainer(GRPOTrainer):
        def on_epoch_begin(self):
            """Called at the beginning of each epoch"""
            calls.append("epoch")

        def on_step_end(self, args, state, control, **kwargs):
            """Called at the end of each training step"""
            # Log custom metrics
            self.log({"rewards/mean": self.current_rewards.mean(), "kl_divergence": self.current_kl.mean()})

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            """Called after evaluation"""
            calls.append(("evaluate", dict(metrics)))

    config = GRPOConfig(
        output_dir="./output/hooks",
        model_name_or_path=str(tiny_model_dir),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=4,
        beta=0.04,
        num_train_epochs=2,
        learning_rate=1e-3,
        **CPU_BUDGET,
    )
    trainer = HookedTrainer(config=config, reward_funcs=completion_length_reward, train_dataset=train_data)
    trainer.train()
    metrics = trainer.evaluate(eval_data)

    assert calls.count("epoch") == 2
    step_logs = [r for r in trainer.state.log_history if "rewards/mean" in r]
    assert len(step_logs) == trainer.state.global_step
    assert all(isinstance(r["rewards/mean"], float) and isinstance(r["kl_divergence"], float) for r in step_logs)
    assert any(r["kl_divergence"] > 0 for r in step_logs[1:])  # after the first update the policy has moved
    assert calls[-1] == ("evaluate", metrics) and "eval_reward" in metrics


# ---------------------------------------------------------------- TeacherGRPOTrainer methods


@pytest.fixture
def teacher(in_tmp, tiny_model_dir, warm_model_dir, train_data):
    from atlas_core.training.algorithms.grpo_config import GRPOConfig
    from atlas_core.training.algorithms.teacher_trainers import TeacherGRPOTrainer

    args = GRPOConfig(
        output_dir="./output/teacher",
        model_name_or_path=str(tiny_model_dir),
        per_device_train_batch_size=4,
        num_generations=4,
        student_max_tokens=16,
        **CPU_BUDGET,
    )
    return TeacherGRPOTrainer(args=args, train_dataset=train_data, student_model=str(warm_model_dir))


def test_diagnostic_probe(teacher):
    trainer = teacher
    result = trainer.diagnostic_probe("Solve: 2x + 5 = 11")
    if result.capability_level < 0.3:
        print("Student needs significant help")
    assert 0.0 <= result.capability_level <= 1.0 and 0.0 <= result.confidence_score <= 1.0
    assert 1 <= result.probe_tokens <= 50  # the probe's default budget
    # The task is not in the training data and no scorer is set: capability is the agreement of the student's
    # answers times its answer rate, and the gaps say so.
    quality = result.response_quality
    assert set(quality) == {"answer_rate", "baseline_accuracy", "mean_answer_tokens"}
    assert result.capability_level == pytest.approx(result.confidence_score * quality["answer_rate"])
    assert result.baseline_score == quality["baseline_accuracy"] == result.capability_level
    assert 0 <= quality["mean_answer_tokens"] <= trainer.args.student_max_tokens
    assert any(gap.startswith("no reference answer") for gap in result.identified_gaps)


def test_generate_guidance(teacher):
    trainer = teacher
    diagnostic = trainer.diagnostic_probe("Solve quadratic equation")
    guidance = trainer.generate_guidance("Solve: x² - 5x + 6 = 0", diagnostic, max_tokens=150)
    print(f"Teaching guidance: {guidance}")
    assert isinstance(guidance, str) and guidance == guidance.strip()
    assert not any(t in guidance for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|pad|>"))
    assert len(trainer.processing_class(guidance, add_special_tokens=False)["input_ids"]) <= 150 * 4  # bytes re-encoded
    # the smallest budget allowed is honoured too
    short = trainer.generate_guidance("Solve: x² - 5x + 6 = 0", diagnostic, max_tokens=10)
    assert len(trainer.processing_class(short, add_special_tokens=False)["input_ids"]) <= 10 * 4


def test_compute_teaching_reward(teacher):
    trainer = teacher
    reward = trainer.compute_teaching_reward(baseline_score=0.6, enhanced_score=0.8, teaching_length=120)
    # reward ≈ 0.2 + 0.4 = 0.6 (improvement + efficiency)
    assert reward == pytest.approx(0.6)


def test_teaching_step(teacher):
    batch = {
        "prompts": [r["prompt"][0]["content"] for r in make_arithmetic_dataset(4, seed=2)],
        "ground_truth": [r["ground_truth"] for r in make_arithmetic_dataset(4, seed=2)],
    }
    rewards = teacher.teaching_step(batch)
    assert len(rewards) == 4 and all(isinstance(r, float) for r in rewards)


# ---------------------------------------------------------------- Custom Trainer Implementation


def test_custom_trainer_implementation(in_tmp, tiny_model_dir, train_data):
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    class CustomRewardTrainer(GRPOTrainer):
        """Custom trainer with modified reward computation"""

        def compute_rewards(self, completions, prompts):
            """Override reward computation"""
            rewards = []
            for completion, prompt in zip(completions, prompts, strict=True):
                # Custom reward logic
                reward = self.custom_reward_function(completion, prompt)
                rewards.append(reward)
            returned.append(rewards)  # (the test's record of what the override gave the trainer)
            return torch.tensor(rewards)

        def custom_reward_function(self, completion, prompt):
            """Implement domain-specific rewards"""
            # Example: Length penalty
            length_penalty = min(1.0, len(completion) / 500)
            # Example: Quality score
            quality = self.quality_model(completion)
            return quality * length_penalty

        # the page leaves quality_model to the user: here, "does it commit to an answer"
        def quality_model(self, completion):
            return 1.0 if extract_answer(completion[-1]["content"]) is not None else 0.5

    config = GRPOConfig(
        output_dir="./output/custom",
        model_name_or_path=str(tiny_model_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=2,
        logging_steps=1,
        **CPU_BUDGET,
    )
    returned = []
    trainer = CustomRewardTrainer(config=config, train_dataset=train_data)
    trainer.train()
    # The trainer called the override once per step and trained on exactly its rewards (one chat message per
    # completion: length penalty 1/500, times a quality of 0.5 or 1).
    assert len(returned) == 2 and all(len(r) == 8 for r in returned)
    assert all(r in (pytest.approx(0.001), pytest.approx(0.002)) for step in returned for r in step)
    logged = [r["reward"] for r in trainer.state.log_history if "reward" in r]
    assert logged == [pytest.approx(sum(step) / len(step)) for step in returned]
    assert torch.allclose(trainer.current_rewards, torch.tensor(returned[-1]))


# ---------------------------------------------------------------- Callbacks and Monitoring


def test_callbacks_early_stopping_and_tensorboard(in_tmp, tiny_model_dir, train_data, eval_data):
    from transformers import EarlyStoppingCallback
    from transformers.integrations import TensorBoardCallback, WandbCallback

    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    # The page's WandbCallback(project=..., name=...) is wrong about transformers (the callback takes no
    # arguments; the project comes from WANDB_PROJECT) and wandb is not installed here: TensorBoard instead.
    with pytest.raises((TypeError, RuntimeError)):
        WandbCallback(project="atlas-training", name="experiment-1")

    config = GRPOConfig(
        output_dir="./output/callbacks",
        model_name_or_path=str(tiny_model_dir),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=4,
        max_steps=50,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        load_best_model_at_end=True,
        metric_for_best_model="eval_reward",  # the untrained tiny model never scores: no improvement
        greater_is_better=True,
        **CPU_BUDGET,
    )
    callbacks = [
        TensorBoardCallback(),
        EarlyStoppingCallback(early_stopping_patience=3, early_stopping_threshold=0.001),
    ]
    trainer = GRPOTrainer(
        config=config,
        callbacks=callbacks,
        reward_funcs=exact_match_reward,
        train_dataset=train_data,
        eval_dataset=eval_data,
    )
    trainer.train()
    assert trainer.state.global_step == 4  # first eval sets the best, three without improvement stop it
    assert list((in_tmp / "output/callbacks").rglob("events.out.tfevents.*"))  # TensorBoard wrote its events


def test_compute_metrics_with_evaluation(in_tmp, warm_model_dir, train_data, eval_data):
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    def accuracy_score(labels, predictions):
        return sum(extract_answer(p) == str(y) for y, p in zip(labels, predictions, strict=True)) / len(labels)

    def perplexity(predictions):
        return float(len(set(predictions)))  # stand-ins for the page's undefined helpers

    def diversity_score(predictions):
        return len(set(predictions)) / len(predictions)

    def safety_check(predictions):
        return 1.0

    def compute_metrics(eval_predictions):
        """Custom metrics computation"""
        predictions, labels = eval_predictions
        return {
            "accuracy": accuracy_score(labels, predictions),
            "perplexity": perplexity(predictions),
            "diversity": diversity_score(predictions),
            "safety_rate": safety_check(predictions),
        }

    config = GRPOConfig(
        output_dir="./output/metrics",
        model_name_or_path=str(warm_model_dir),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        num_generations=4,
        max_steps=1,
        max_completion_length=24,
        report_to=[],
        disable_tqdm=True,
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        config=config,
        compute_metrics=compute_metrics,
        reward_funcs=exact_match_reward,
        train_dataset=train_data,
        eval_dataset=eval_data,
    )
    trainer.train()
    metrics = trainer.evaluate()
    assert {"eval_accuracy", "eval_perplexity", "eval_diversity", "eval_safety_rate", "eval_reward"} <= set(metrics)
    # accuracy over the generated completions agrees with the exact-match reward of the same completions
    assert metrics["eval_accuracy"] == pytest.approx(metrics["eval_reward"])


# ---------------------------------------------------------------- Distributed Training


def test_multi_gpu_setup_with_an_accelerator(in_tmp, tiny_model_dir, train_data):
    from transformers import AutoModelForCausalLM

    from accelerate import Accelerator
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    config = GRPOConfig(
        output_dir="./output/accel", per_device_train_batch_size=8, num_generations=4, max_steps=2, **CPU_BUDGET
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    accelerator = Accelerator()
    trainer = GRPOTrainer(
        config=config, model=model, accelerator=accelerator, reward_funcs=exact_match_reward, train_dataset=train_data
    )
    # Trainer automatically handles distributed setup
    trainer.train()
    assert trainer.state.global_step == 2
    assert trainer.accelerator.num_processes == accelerator.num_processes


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["deepspeed_zero3", "deepspeed_zero3_cpu_offloading"])
def test_deepspeed_launch_commands(tmp_path, atlas_cache, warm_model_dir, preset):
    """`accelerate launch --config_file accelerate/<preset>.yaml -m atlas_core.cli.train recipe@_global_=teacher_rcl`
    on CPU: two processes, models and data swapped, a few steps. The AtlasTeacher's launch: teacher GRPO under
    ZeRO-3, each rank with its own frozen local student (tests/training/test_distributed.py runs the pods' other
    launches)."""
    out = tmp_path / "run"
    command = [
        "accelerate", "launch", "--config_file", f"accelerate/{preset}.yaml",
        "--mixed_precision", "no", "--num_processes", "2", "--main_process_port", str(free_port()),
        "-m", "atlas_core.cli.train", "recipe@_global_=teacher_rcl",
        f"model={warm_model_dir}", f"student={warm_model_dir}", "dataset.source=builtin://arithmetic",
        f"output_dir={out}", "trainer.max_steps=2", "trainer.bf16=false", "trainer.gradient_checkpointing=false",
        "trainer.max_completion_length=16", "trainer.student_max_tokens=16", "trainer.metrics_port=0",
        "trainer.logging_steps=1", "trainer.save_strategy=no",
    ]  # fmt: skip  # a command line: each flag beside its value
    env = python_env(PATH=f"{REPO / '.venv' / 'bin'}:{python_env()['PATH']}")
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    output = proc.stdout + proc.stderr
    assert "done: rank 0/2 at global step 2" in output and "done: rank 1/2 at global step 2" in output
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "teaching/reward" in r] == [1, 2]


# ---------------------------------------------------------------- Troubleshooting


def _has_flash_attention() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


TROUBLESHOOTING = {
    # CUDA OOM during training
    "reduce batch size": {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 32},
    "gradient checkpointing": {"gradient_checkpointing": True},
    "mixed precision (bf16 on CPU)": {"bf16": True},
    "mixed precision (fp16)": {"fp16": True},
    # Training is slower than expected
    "flash attention": {"attn_implementation": "flash_attention_2"},
    "sdpa attention (the CPU's counterpart)": {"attn_implementation": "sdpa"},
    "data loading": {"dataloader_num_workers": 4, "dataloader_pin_memory": True},
    # Loss spikes or NaN values
    "learning rate": {"learning_rate": 1e-6},
    "KL penalty": {"beta": 0.1},
    "gradient clipping": {"max_grad_norm": 0.5},
}


def loop_recorder():
    """A callback recording what the training loop itself did: micro-batches per optimizer step, and what each
    optimizer step saw (learning rate, gradient norm after clipping, the model and the DataLoader in use)."""
    from transformers import TrainerCallback

    class LoopRecorder(TrainerCallback):
        def __init__(self):
            self.substeps, self.steps, self.seen = 0, 0, []

        def on_substep_end(self, args, state, control, **kwargs):
            self.substeps += 1

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1

        def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            grads = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
            loader = kwargs["train_dataloader"]
            self.seen.append(
                {
                    "lr": optimizer.param_groups[0]["lr"],
                    "grad_norm": torch.stack(grads).norm().item() if grads else 0.0,
                    "checkpointing": model.is_gradient_checkpointing,
                    "num_workers": loader.num_workers,
                    "pin_memory": loader.pin_memory,
                }
            )

    return LoopRecorder()


TROUBLESHOOTING_CASES = list(TROUBLESHOOTING)


@pytest.mark.parametrize("name", TROUBLESHOOTING_CASES)
def test_troubleshooting_settings(in_tmp, tiny_model_dir, train_data, name):
    """Each setting, set after construction as the page does, changes what the training loop does."""
    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    if name == "flash attention" and not _has_flash_attention():
        pytest.skip("flash_attention_2 needs a CUDA GPU and the flash-attn package")
    if name == "mixed precision (fp16)" and not torch.cuda.is_available():
        pytest.skip("fp16 mixed precision needs a CUDA GPU (CPU autocast is bf16; see the bf16 case)")

    config = GRPOConfig(
        output_dir="./output/t",
        model_name_or_path=str(tiny_model_dir),
        per_device_train_batch_size=8,
        num_generations=8,
        max_steps=1,
        beta=0.04,
        logging_steps=1,
        **CPU_BUDGET,
    )
    for key, value in TROUBLESHOOTING[name].items():  # set after construction, as the page does
        setattr(config, key, value)
    recorder = loop_recorder()
    # a reward with varied values, so that the policy gets a gradient to clip
    trainer = GRPOTrainer(
        config=config, reward_funcs=completion_length_reward, train_dataset=train_data, callbacks=[recorder]
    )
    trainer.train()
    assert trainer.state.global_step == 1 and recorder.steps == 1
    (seen,) = recorder.seen
    (logged,) = [r for r in trainer.state.log_history if "grad_norm" in r]
    if name == "reduce batch size":
        assert trainer.args.generation_batch_size == 32  # re-derived from the new settings
        assert recorder.substeps == 31  # 32 micro-batches of one completion, then one optimizer step
    else:
        assert recorder.substeps == 0
    if name == "gradient checkpointing":
        assert seen["checkpointing"] is True
    else:
        assert seen["checkpointing"] is False
    if name == "mixed precision (bf16 on CPU)":
        assert trainer.accelerator.mixed_precision == "bf16"
    if name == "mixed precision (fp16)":
        assert trainer.accelerator.mixed_precision == "fp16"
    if name == "flash attention":
        assert trainer.model.config._attn_implementation == "flash_attention_2"
    if name == "sdpa attention (the CPU's counterpart)":
        assert trainer.model.config._attn_implementation == "sdpa"
    if name == "data loading":
        assert (seen["num_workers"], seen["pin_memory"]) == (4, True)
    else:
        assert seen["num_workers"] == 0
    # the optimizer steps with the configured learning rate (linear schedule, no warm-up: step 1 at full lr)
    assert seen["lr"] == pytest.approx(1e-6 if name == "learning rate" else config.learning_rate)
    if name == "KL penalty":
        assert trainer.beta == 0.1 and trainer.ref_model is not None and "kl" in logged
    max_norm = 0.5 if name == "gradient clipping" else 1.0
    assert logged["grad_norm"] > 0.0
    if name == "gradient clipping":
        assert logged["grad_norm"] > max_norm  # (the pre-clip norm: there was something to clip)
    assert seen["grad_norm"] == pytest.approx(min(logged["grad_norm"], max_norm), rel=1e-3)  # clipped to max_norm


def test_torch_compile(in_tmp, tiny_model_dir, train_data):
    from transformers import AutoModelForCausalLM

    from atlas_core.training.algorithms.grpo import GRPOTrainer
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # Enable compilation (PyTorch 2.0+)
    model = torch.compile(model)
    config = GRPOConfig(
        output_dir="./output/c", per_device_train_batch_size=8, num_generations=4, max_steps=1, **CPU_BUDGET
    )
    trainer = GRPOTrainer(
        config=config,
        model=model,
        reward_funcs=exact_match_reward,
        train_dataset=train_data,
        processing_class=_tokenizer(tiny_model_dir),
    )
    trainer.train()
    assert trainer.state.global_step == 1


def _tokenizer(path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, padding_side="left")
