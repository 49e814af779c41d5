"""The run's configuration (atlas_operator.render.config_map): run.yaml as the trainer reads it, evaluation and
colocate settings, and a run that trains here."""

from __future__ import annotations

import dataclasses
import subprocess

import yaml
from atlas_operator.manifests import render_children
from atlas_operator.render import run_config
from atlas_operator.spec import TrainingSpec
from atlas_operator.validation import parse_run

from harness.env import PYTHON, REPO, python_env
from harness.manifests import teacher, training


def test_every_training_field_is_a_trainer_field():
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    trainer_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    ours = {f.name for f in dataclasses.fields(TrainingSpec)} - {"extra"}
    assert ours <= trainer_fields, ours - trainer_fields


def test_rendered_run_config_is_accepted_by_the_trainer(tmp_path, tiny_model_dir):
    """The ConfigMap's run.yaml (a teacher's with its evaluation section), handed to the trainer's own loader and
    validator: no problem."""
    from atlas_core.training.load_config import load_run_config, validate_run_config

    for manifest in (
        training(model=str(tiny_model_dir), resources={"nodes": 1, "gpusPerNode": 0}, rollout={"replicas": 0}),
        teacher(
            model=str(tiny_model_dir),
            resources={"nodes": 1, "gpusPerNode": 0},
            rollout={"replicas": 0},
            reward={"config": "interpretation_offline"},
            student={"model": str(tiny_model_dir), "rollout": {"replicas": 0}},
            evaluation={"dataset": {"source": "builtin://arithmetic", "split": "test"}, "samples": 2, "limit": 3},
        ),
    ):
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump(run_config(parse_run(manifest))))
        cfg = load_run_config([f"recipe={path}"])
        problems = [p for p in validate_run_config(cfg) if not p.startswith("reward.config")]
        assert problems == []
        assert cfg.trainer.metrics_port == 9400 and cfg.trainer.save_steps == 50


def test_local_teacher_example_trains_here(tmp_path, tiny_model_dir):
    """`atlas train examples/local-teacher.yaml` on this CPU: the manifest's run, one process."""
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "atlas_cli.main",
            "train",
            str(REPO / "examples/local-teacher.yaml"),
            "trainer.metrics_port=0",
        ],
        capture_output=True,
        text=True,
        env=python_env(),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "note: generating inside the trainer" not in proc.stderr  # rollout.replicas is 0 already
    assert "note: one process (the cluster runs 2: 2 nodes x 1)" in proc.stderr
    out = tmp_path / "outputs/local-teacher"
    assert (out / "checkpoint-4" / "trainer_state.json").is_file() and (out / "metrics.jsonl").is_file()


def run_yaml(manifest) -> dict:
    (config_map,) = [c for c in render_children(parse_run(manifest)) if c["kind"] == "ConfigMap"]
    return yaml.safe_load(config_map["data"]["run.yaml"])


def test_evaluation_renders_into_run_yaml():
    """spec.evaluation → run.yaml's `evaluation` (the shape the trainer reads), defaults filled in; none without it."""
    assert run_yaml(teacher(evaluation={"samples": 2, "limit": 500}))["evaluation"] == {
        "dataset": {"source": "builtin://arithmetic", "split": "test"},
        "samples": 2,
        "limit": 500,
    }
    assert run_yaml(teacher(evaluation={}))["evaluation"] == {  # unset limit: every problem, no key
        "dataset": {"source": "builtin://arithmetic", "split": "test"},
        "samples": 4,
    }
    held_out = teacher(evaluation={"dataset": {"source": "hf://org/held-out", "split": "validation"}, "samples": 1})
    assert run_yaml(held_out)["evaluation"]["dataset"] == {"source": "hf://org/held-out", "split": "validation"}
    # Only a split: the run's own source, as the training dataset's source is written (a path on the volume too).
    on_volume = teacher(dataset={"source": "/checkpoints/data/problems.jsonl"}, evaluation={"dataset": {"split": "x"}})
    config = run_yaml(on_volume)
    assert config["evaluation"]["dataset"] == {"source": config["dataset"]["source"], "split": "x"}
    assert config["dataset"]["source"] == "/checkpoints/data/problems.jsonl"
    assert "evaluation" not in run_yaml(teacher()) and "evaluation" not in run_yaml(training())
    from atlas_contract.defaults import EVALUATION

    assert EVALUATION == {"split": "test", "samples": 4}


def test_the_trainer_config_takes_colocate_settings():
    """run.yaml's vLLM settings build TRL's real GRPOConfig (TRL checks them when the trainer starts)."""
    from atlas_core.training.algorithms.grpo_config import GRPOConfig

    manifest = training(rollout={"mode": "colocate", "gpuMemoryUtilization": 0.5}, resources={"gpusPerNode": 2})
    trainer = run_config(parse_run(manifest))["trainer"]
    vllm = {k: v for k, v in trainer.items() if "vllm" in k}
    args = GRPOConfig(output_dir="/tmp/colocate", report_to=[], per_device_train_batch_size=8, **vllm)
    assert (args.vllm_mode, args.vllm_gpu_memory_utilization, args.use_vllm) == ("colocate", 0.5, True)


def test_lora_renders_into_run_yaml_with_its_defaults():
    """spec.training.lora → run.yaml's `trainer.lora` (snake_case, every setting filled in from
    atlas_contract.defaults.LORA, [all-linear] as the string PEFT takes), which the contract reads back as it was
    written; none without it, for either kind."""
    from atlas_contract.defaults import LORA
    from atlas_contract.lora import LoraSettings
    from atlas_contract.run_config import RunConfig

    defaults = teacher(training={"perDeviceTrainBatchSize": 4, "numGenerations": 4, "lora": {}})
    assert (
        run_yaml(defaults)["trainer"]["lora"]
        == LORA
        == {
            "r": 16,
            "alpha": 32.0,
            "dropout": 0.05,
            "target_modules": "all-linear",
        }
    )
    named = training(
        training={
            "perDeviceTrainBatchSize": 4,
            "numGenerations": 4,
            "lora": {"r": 8, "targetModules": ["q_proj", "v_proj"]},
        }
    )
    config = run_yaml(named)
    assert config["trainer"]["lora"] == {"r": 8, "alpha": 32.0, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]}
    parsed = RunConfig.from_dict(config)
    assert LoraSettings.parse(parsed.trainer["lora"], "trainer.lora") == (
        LoraSettings(r=8, target_modules=("q_proj", "v_proj")),
        [],
    )
    example = yaml.safe_load((REPO / "examples/teacher-lora.yaml").read_text())
    assert run_yaml(example)["trainer"]["lora"] == {
        "r": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
    }
    for manifest in (teacher(), training()):
        config = run_yaml(manifest)
        assert "lora" not in config["trainer"] and RunConfig.from_dict(config).trainer.get("lora") is None
