"""LoRA runs on the tiny model, in one process: an adapter trained (the base frozen), saved in every checkpoint,
applied exactly once on a resume (weights compared with the checkpoint's), a finished rerun a no-op; bad settings
refused before any weight is loaded. (DeepSpeed's ZeRO stages: tests/training/test_distributed.py; the cluster:
tests/kube/test_lora.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from atlas_contract.errors import InvalidFields
from atlas_contract.run_config import RunConfig
from atlas_core.models.tiny import TINY_MODEL_URI, resolve_model_path
from atlas_core.training.load_config import load_run_config, parse_run_config
from atlas_core.training.lora import ResumedAdapterCheck, adapter_fingerprint
from atlas_core.training.runner import build_trainer, run_training


def lora_run(out: Path, max_steps: int, *overrides: str, **lora) -> RunConfig:
    """The tiny GRPO recipe with a LoRA adapter (``lora`` its settings beyond r 4, alpha 8, dropout 0)."""
    settings = {"r": 4, "alpha": 8, "dropout": 0.0, **lora}
    return parse_run_config(
        load_run_config(
            [
                "recipe=tiny_grpo",
                f"output_dir={out}",
                "dataset.num_samples=64",
                f"trainer.max_steps={max_steps}",
                "trainer.save_steps=2",
                "trainer.per_device_train_batch_size=4",
                "trainer.max_completion_length=8",
                "trainer.learning_rate=3e-3",
                # The tiny model's answers may all score 0 (no gradient): AdamW's decay still moves the adapter every
                # step, so a checkpoint's adapter always differs from a fresh one.
                "trainer.weight_decay=0.1",
                "trainer.metrics_port=0",
                *[f"trainer.lora.{key}={json.dumps(value)}" for key, value in settings.items()],
                *overrides,
            ]
        )
    )


class AdapterAtStart:
    """The policy's adapter tensors and LoRA module names as training begins (after a resume has loaded)."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.lora_modules: list[str] = []

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.tensors = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        self.lora_modules = [n for n, _ in model.named_modules() if n.endswith(".lora_A")]

    def __getattr__(self, name):  # every other TrainerCallback event: nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def saved_name(parameter: str) -> str:
    """A parameter's key in adapter_model.safetensors (PEFT drops the adapter's name)."""
    return parameter.replace(".default.", ".")


def test_a_lora_run_trains_the_adapter_only_and_resumes_it_exactly_once(tmp_path, atlas_cache, capsys):
    out = tmp_path / "run"
    first = AdapterAtStart()
    finished = run_training(lora_run(out, 2), callbacks=[first], quiet=True)
    assert finished.global_step == 2
    checkpoint = out / "checkpoint-2"
    # The checkpoint and the final model hold the adapter, not the model's weights.
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    assert not (out / "model.safetensors").exists()
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["base_model_name_or_path"] == TINY_MODEL_URI  # the run's reference
    saved = load_file(checkpoint / "adapter_model.safetensors")
    assert set(saved) == {saved_name(n) for n in first.tensors}
    moved = [n for n in first.tensors if not torch.equal(first.tensors[n], saved[saved_name(n)])]
    assert moved, "no adapter weight changed in 2 steps"
    # The base stayed frozen: the tiny model's own weights are what they were.
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_MODEL_URI)).state_dict()
    trainer_base = {
        n.replace("base_model.model.", "").replace(".base_layer", ""): p
        for n, p in build_trainer(lora_run(tmp_path / "fresh", 1)).model.state_dict().items()
        if "lora_" not in n
    }
    assert trainer_base.keys() == base.keys() and all(torch.equal(trainer_base[k], base[k]) for k in base)

    # Resume to step 4: at the first step, the adapter is checkpoint-2's, applied once (the same LoRA modules, no
    # adapter wrapped in another).
    resumed = AdapterAtStart()
    again = run_training(lora_run(out, 4), callbacks=[resumed], quiet=True)
    assert again.global_step == 4 and again.resumed_from.endswith("checkpoint-2")
    said = f"resume: the LoRA adapter of checkpoint-2 applied once: {len(saved)} tensors, sha256 "
    assert said + adapter_fingerprint(saved) in capsys.readouterr().out  # the trainer's own check at the first step
    assert resumed.lora_modules == first.lora_modules
    assert set(resumed.tensors) == set(first.tensors)
    assert all(torch.equal(resumed.tensors[n], saved[saved_name(n)]) for n in resumed.tensors)
    final = load_file(out / "adapter_model.safetensors")
    assert set(final) == set(saved) and any(not torch.equal(final[k], saved[k]) for k in saved)

    # A rerun of the finished run trains nothing and keeps the adapter.
    before = (out / "adapter_model.safetensors").read_bytes()
    rerun = run_training(lora_run(out, 4), quiet=True)
    assert rerun.already_finished and (out / "adapter_model.safetensors").read_bytes() == before


def test_a_lora_run_does_not_resume_a_full_runs_checkpoint(tmp_path, atlas_cache):
    out = tmp_path / "run"
    run_training(lora_run(out, 2, "trainer.lora=null"), quiet=True)
    # A full run's checkpoint holds no adapter: every rank stops with the reason (atlas_core/training/resume.py).
    with pytest.raises(InvalidFields, match=r"trainer\.lora: None in checkpoint-2, \{'r': 4, 'alpha': 8\.0"):
        run_training(lora_run(out, 4), quiet=True)


def test_target_modules_matching_no_module_fail_before_loading_naming_the_candidates(tmp_path, atlas_cache):
    with pytest.raises(InvalidFields) as refused:
        build_trainer(lora_run(tmp_path / "run", 1, target_modules=["q_proj", "c_attn"]))
    (problem,) = refused.value.problems
    assert "lora.target_modules: 'c_attn' matches no module" in problem
    candidates = "down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"
    assert f"its candidates: {candidates}; or 'all-linear'" in problem
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"r": 0}, "lora.r: expected a number >= 1, got 0"),
        ({"alpha": 0}, "lora.alpha: expected a number > 0, got 0"),
        ({"dropout": 1.0}, "lora.dropout: expected a number < 1, got 1.0"),
        ({"target_modules": []}, "lora.target_modules: expected 'all-linear' or a list of 1 to 64 module names"),
        ({"rank": 8}, "lora.rank: unknown setting (expected one of: r, alpha, dropout, target_modules)"),
    ],
)
def test_bad_lora_settings_are_refused_with_the_field_and_value(settings, expected, tmp_path):
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    with pytest.raises(ValueError, match="lora") as refused:
        GRPOConfig(output_dir=str(tmp_path), lora=settings)
    assert expected in str(refused.value)


def test_a_quantised_checkpoint_says_at_start_that_its_adapter_cannot_be_merged(tmp_path, atlas_cache):
    """A checkpoint whose config declares a quantisation: output.merge and vLLM's weight sync (which merges the
    adapter every step) are refused before any weight is loaded."""
    model = tmp_path / "quantised"
    shutil.copytree(resolve_model_path(TINY_MODEL_URI), model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (model / "config.json").write_text(json.dumps(config))
    run = lora_run(tmp_path / "run", 1, f"model={model}").to_dict()
    merged = RunConfig.from_dict({**run, "output": {"uri": "pvc://models/t", "merge": True}})
    with pytest.raises(InvalidFields) as refused:
        build_trainer(merged)
    assert refused.value.problems == [
        "output.merge: the model is quantised (bitsandbytes): a LoRA adapter cannot be merged into it exactly; "
        "export the adapter alone (merge false) or train on an unquantised checkpoint"
    ]
    synced = RunConfig.from_dict({**run, "trainer": {**run["trainer"], "use_vllm": True}})
    with pytest.raises(InvalidFields, match=r"lora: the model is quantised \(bitsandbytes\); vLLM's weight sync"):
        build_trainer(synced)


def test_a_resume_whose_adapter_is_not_the_checkpoints_stops_naming_it(tmp_path, atlas_cache):
    """The trainer's own check at the first resumed step: an adapter that differs from the checkpoint's (a fresh one,
    as a resume that failed to load it would leave) stops the run, naming the checkpoint."""
    out = tmp_path / "run"
    run_training(lora_run(out, 2), quiet=True)
    trainer = build_trainer(lora_run(tmp_path / "fresh", 4))  # a fresh adapter, never trained
    check = ResumedAdapterCheck(str(out / "checkpoint-2"))
    refusal = "resume: checkpoint-2's LoRA adapter not applied once: the policy's adapter"
    with pytest.raises(RuntimeError, match=refusal):
        check.on_train_begin(trainer.args, trainer.state, trainer.control, model=trainer.model)


def test_a_lora_run_on_another_lora_runs_adapter_trains_on_the_merged_model(tmp_path, atlas_cache):
    """An SFT warm-up's adapter as the model of a LoRA GRPO run (bench/real_teaching.py --lora): the new adapter
    trains on the warm-up merged into its base, and the result loads as the base, the first adapter and the second,
    merged in that order."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from atlas_core.models.loading import load_causal_lm

    warmup = tmp_path / "sft"
    overrides = ["recipe=tiny_sft", f"output_dir={warmup}", "trainer.max_steps=2", "trainer.metrics_port=0"]
    run_training(parse_run_config(load_run_config([*overrides, "trainer.lora.r=4"])), quiet=True)
    assert (warmup / "adapter_config.json").is_file()
    out = tmp_path / "grpo"
    run_training(lora_run(out, 1, f"model={warmup}"), quiet=True)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(warmup)
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path(TINY_MODEL_URI))
    expected = PeftModel.from_pretrained(PeftModel.from_pretrained(base, warmup).merge_and_unload(), out)
    expected_state = expected.merge_and_unload().state_dict()
    loaded = load_causal_lm(str(out)).state_dict()
    assert loaded.keys() == expected_state.keys()
    assert all(torch.allclose(loaded[k], expected_state[k]) for k in loaded)


def test_what_trls_weight_sync_sends_vllm_for_a_lora_policy_is_the_merged_model(atlas_cache):
    """The rollout server's weights after a sync (server and colocate modes alike: both walk TRL's
    ``VLLMGeneration._iter_named_params``; its vLLM needs a GPU here): every weight of the base model under the base's
    names, with the adapter merged in, no LoRA tensor; and afterwards the policy is unmerged, its adapter as before."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    from accelerate import Accelerator
    from atlas_contract.lora import LoraSettings
    from atlas_core.training.lora import peft_config

    path = resolve_model_path(TINY_MODEL_URI)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(path), peft_config(LoraSettings(r=4)))
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:  # a trained adapter (B starts at zero: a merge would change nothing)
            torch.nn.init.normal_(parameter, std=0.02)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    expected = {k: v.clone() for k, v in policy.merge_and_unload(safe_merge=True).state_dict().items()}
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(path), peft_config(LoraSettings(r=4)))
    policy.load_state_dict(before, strict=False)

    generation = VLLMGeneration.__new__(VLLMGeneration)  # only what the weight walk reads
    generation.model, generation._dist = policy, DistributedBackend(Accelerator(cpu=True))
    sent = {name: tensor.clone() for name, tensor in generation._iter_named_params()}
    base_names = {n for n, _ in AutoModelForCausalLM.from_pretrained(path).named_parameters()}
    assert set(sent) == base_names and not any("lora_" in n for n in sent)
    assert all(torch.allclose(sent[n], expected[n], atol=1e-6) for n in sent)
    assert any(
        not torch.equal(sent[n], before[f"base_model.model.{n}".replace(".weight", ".base_layer.weight")])
        for n in sent
        if "q_proj" in n
    )
    after = dict(policy.named_parameters())
    assert all(torch.allclose(after[n], before[n], atol=1e-6) for n in before)  # unmerged again, adapter intact


def test_a_lora_teachers_frozen_student_is_left_alone(tmp_path, atlas_cache):
    """A LoRA AtlasTeacher (algorithm teacher): the adapter is the teacher's; the frozen student, the same model
    loaded on its own, has no adapter and nothing to train."""
    overrides = ["recipe=tiny_teacher", f"output_dir={tmp_path / 'run'}", "trainer.metrics_port=0", "trainer.lora.r=4"]
    trainer = build_trainer(parse_run_config(load_run_config(overrides)))
    assert any("lora_" in n for n, p in trainer.model.named_parameters() if p.requires_grad)
    student = trainer.student.model
    assert not any("lora_" in n for n, _ in student.named_modules())
    assert not any(p.requires_grad for p in student.parameters())
