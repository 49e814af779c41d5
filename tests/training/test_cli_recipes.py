"""``python -m atlas_core.cli.train`` and ``atlas train``: real runs of a bundled recipe and of a file recipe (bad
input: tests/unit/test_cli.py)."""

from __future__ import annotations

import json

import yaml

from harness.env import PYTHON, run

TRAIN = [PYTHON, "-m", "atlas_core.cli.train"]


def test_recipe_runs_and_leaves_model_checkpoint_and_metrics_even_with_its_metrics_port_busy(tmp_path, atlas_cache):
    """One run for both: what a run leaves, and that a metrics port another process holds does not stop it."""
    import socket

    out = tmp_path / "out"
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(
            [
                *TRAIN,
                "recipe=tiny_grpo",
                f"output_dir={out}",
                "trainer.max_steps=2",
                f"trainer.metrics_port={port}",
                "trainer.save_steps=2",
            ],
            tmp_path,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "metrics_port: cannot serve /metrics" in proc.stderr
    assert (out / "config.json").exists() and (out / "tokenizer.json").exists()
    assert (out / "checkpoint-2" / "trainer_state.json").exists()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [1, 2]


def test_sft_recipe_and_file_recipe(tmp_path, atlas_cache):
    recipe = tmp_path / "my-run.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "algorithm": "sft",
                "dataset": {"source": "builtin://arithmetic"},
                "run_name": "from-file",
                "output_dir": str(tmp_path / "sft"),
                "trainer": {"max_steps": 3, "per_device_train_batch_size": 4, "save_strategy": "no"},
            }
        )
    )
    proc = run([PYTHON, "-m", "atlas_cli.main", "train", str(recipe), "trainer.logging_steps=1"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
