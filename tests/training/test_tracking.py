"""Experiment tracking on real trainers against a real MLflow server (``mlflow_server``, tests/support/mlflow.py) and
W&B's offline mode: what a tracked run holds, one tracking run across a resume, a server that does not answer, and no
secret in what is stored (atlas_core/training/tracking.py)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from atlas_contract import results, tracking
from atlas_contract.names import ENV_RESULT_FILE

pytestmark = pytest.mark.timeout(600)

TEACHER = [
    "recipe=tiny_teacher",
    "dataset.source=builtin://multistep",
    "trainer.per_device_train_batch_size=4",
    "trainer.num_generations=2",
    "trainer.max_completion_length=8",
    "trainer.metrics_port=0",
    "trainer.save_steps=2",
    "trainer.lr_scheduler_type=constant",
    "+evaluation={samples: 1, limit: 2}",
]
SECRET = "s3cr3t-value-that-must-not-be-stored"


def tracked_runs(server, experiment: str):
    client = server.client()
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def steps_of(server, run_id: str, metric: str) -> list[int]:
    return [m.step for m in sorted(server.client().get_metric_history(run_id, metric), key=lambda m: m.timestamp)]


def test_a_teacher_run_is_tracked_whole_and_a_resume_continues_its_run_logging_each_step_once(
    mlflow_server, tmp_path, monkeypatch
):
    """A teacher run (3 steps, a checkpoint at 2, its evaluation) logs to MLflow: params (run.yaml's settings and the
    library versions), tags, every step under the Prometheus names, the evaluation table, the artifacts, and its
    ``{runId, url}`` and final KL in the result. Then a "kill" after step 3 (its checkpoint-3 removed) and a resume to
    5 steps: the same MLflow run, steps 1-5 each once and in order (step 3 as first logged), no secret stored."""
    from atlas_core.cli.train import main

    experiment = "tracking-resume"
    out, result_file = tmp_path / "run", tmp_path / "termination-log"
    monkeypatch.setenv(tracking.ENV_MLFLOW_URI, mlflow_server.uri)
    monkeypatch.setenv(tracking.ENV_MLFLOW_EXPERIMENT, experiment)
    monkeypatch.setenv(ENV_RESULT_FILE, str(result_file))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)  # in the trainer's environment, as a pod's secretKeyRef
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    assert main([*TEACHER, f"output_dir={out}", "trainer.max_steps=3"]) == 0
    (run,) = tracked_runs(mlflow_server, experiment)
    run_id = run.info.run_id
    first = results.parse_result_message(result_file.read_text())
    assert first["tracking"]["runId"] == run_id
    assert first["tracking"]["url"] == f"{mlflow_server.uri}/#/experiments/{run.info.experiment_id}/runs/{run_id}"
    assert (
        run.info.status == "FINISHED" and run.data.tags[tracking.TAG_UID] == (out / tracking.LOCAL_UID_FILE).read_text()
    )
    assert run.data.params["run.algorithm"] == "teacher" and run.data.params["versions.mlflow-skinny"] == "3.17.2"
    assert steps_of(mlflow_server, run_id, "atlas_training_reward") == [1, 2, 3]
    assert steps_of(mlflow_server, run_id, "atlas_teaching_accuracy_delta") == [1, 2, 3]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"kl"' in line]
    history = {m.step: m.value for m in mlflow_server.client().get_metric_history(run_id, "atlas_training_kl")}
    assert history == {record["step"]: pytest.approx(record["kl"]) for record in logged}
    assert first["kl"] == pytest.approx(logged[-1]["kl"], abs=1e-6)
    evaluation = json.loads((out / "evaluation" / "eval.json").read_text())
    assert run.data.metrics["atlas_eval_problems"] == 2 == evaluation["problems"]
    assert run.data.metrics["atlas_eval_accuracy_delta"] == pytest.approx(evaluation["accuracy_delta"])
    artifacts = {a.path for a in mlflow_server.client().list_artifacts(run_id)}
    assert {"metrics.jsonl", "curves.png", "README.md", "eval.json"} <= artifacts
    card = Path(mlflow_server.client().download_artifacts(run_id, "README.md", str(tmp_path)))
    assert "| final step | 3 |" in card.read_text()

    # Killed after step 3 was logged, before its checkpoint: the resume starts again at step 3 from checkpoint-2.
    shutil.rmtree(out / "checkpoint-3")
    for name in ("model.safetensors", "config.json"):
        (out / name).unlink()
    step3 = {m.step: m.value for m in mlflow_server.client().get_metric_history(run_id, "atlas_training_loss")}[3]
    result_file.unlink()
    assert main([*TEACHER, f"output_dir={out}", "trainer.max_steps=5"]) == 0
    (resumed,) = tracked_runs(mlflow_server, experiment)  # one tracking run for the Atlas run
    assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
    for metric in ("atlas_training_step", "atlas_training_reward", "atlas_training_loss"):
        assert steps_of(mlflow_server, run_id, metric) == [1, 2, 3, 4, 5], metric
    kept = {m.step: m.value for m in mlflow_server.client().get_metric_history(run_id, "atlas_training_loss")}
    assert kept[3] == step3  # each step once: the first value logged for it
    assert results.parse_result_message(result_file.read_text())["tracking"]["runId"] == run_id

    stored = {**resumed.data.params, **resumed.data.tags}
    assert not [key for key, value in stored.items() if SECRET in value]
    database = (mlflow_server.server.directory / "mlflow.db").read_bytes()
    assert SECRET.encode() not in database


def test_a_server_that_does_not_answer_never_stops_training_and_gets_the_steps_when_back(mlflow_server, tmp_path):
    """The server down when training starts: the steps go on, ``atlas_tracking_up`` says 0 on the trainer's
    /metrics; started again at step 3, every step is logged once, in order, and the gauge says 1."""
    from transformers import TrainerCallback

    from atlas_core.telemetry.metrics import TRAINER_REGISTRY
    from atlas_core.training.finish import finish_tracking
    from atlas_core.training.load_config import load_run_config, parse_run_config
    from atlas_core.training.runner import run_training

    experiment = "tracking-outage"

    def up() -> float | None:
        return TRAINER_REGISTRY.get_sample_value(
            "atlas_tracking_up", {"namespace": "local", "run": "tiny-grpo", "kind": "local", "backend": "mlflow"}
        )

    class BringTheServerBack(TrainerCallback):
        said_down: float | None = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                deadline = time.monotonic() + 30  # the first step's log was tried at once: refused within ms
                while up() != 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                self.said_down = up()
                mlflow_server.start()

    mlflow_server.stop()
    back = BringTheServerBack()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv(tracking.ENV_MLFLOW_URI, mlflow_server.uri)
            env.setenv(tracking.ENV_MLFLOW_EXPERIMENT, experiment)
            run = parse_run_config(
                load_run_config(
                    [
                        "recipe=tiny_grpo",
                        f"output_dir={tmp_path / 'out'}",
                        "trainer.max_steps=6",
                        "trainer.metrics_port=0",
                        "trainer.save_strategy=no",
                    ]
                )
            )
            done = run_training(run, callbacks=[back], quiet=True)
            reference = finish_tracking(run, done, None, None, None, None)
    finally:
        mlflow_server.start()  # idempotent when already up: the next test expects it
    assert done.global_step == 6 and back.said_down == 0
    (tracked,) = tracked_runs(mlflow_server, experiment)
    assert reference["runId"] == tracked.info.run_id
    assert steps_of(mlflow_server, tracked.info.run_id, "atlas_training_step") == [1, 2, 3, 4, 5, 6]
    assert up() == 1


def test_wandb_offline_keeps_the_run_on_disk_under_the_prometheus_names(tmp_path, monkeypatch):
    """report_to wandb in W&B's offline mode (what a run without spec.tracking.wandb.secretRef gets): the run's files
    on disk under WANDB_DIR, named by WANDB_RUN_ID (the Atlas run's uid), holding the Prometheus names."""
    from atlas_core.cli.train import main

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv(tracking.ENV_WANDB_PROJECT, "atlas-tests")
    monkeypatch.setenv(tracking.ENV_WANDB_RUN_ID, "run-uid-1")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "out"
    args = [
        "recipe=tiny_grpo",
        f"output_dir={out}",
        "trainer.max_steps=2",
        "trainer.metrics_port=0",
        "trainer.save_strategy=no",
    ]
    assert main([*args, "trainer.report_to=[wandb]"]) == 0
    import wandb

    # What the trainer process's exit does (W&B's atexit hook): waits for W&B's service to have written every record
    # (wandb.finish() alone can return before the service flushed the run's file).
    wandb.teardown()
    (folder,) = (tmp_path / "wandb").glob("offline-run-*-run-uid-1")
    (log,) = folder.glob("run-run-uid-1.wandb")
    data = log.read_bytes()
    assert b"atlas_training_reward" in data and b"atlas_training_step" in data


def test_atlas_eval_logs_its_table_as_a_run_of_its_own(mlflow_server, tmp_path, atlas_cache, monkeypatch, capsys):
    """``atlas eval`` with MLFLOW_TRACKING_URI: one MLflow run of its own per evaluation, the table as metrics (equal
    to eval.json's), the models and settings as params, eval.json and problems.jsonl as artifacts."""
    from atlas_cli.main import main as atlas
    from tests.emulator.test_eval_cli import SMALL, eval_cmd

    experiment = "tracking-eval"
    monkeypatch.setenv(tracking.ENV_MLFLOW_URI, mlflow_server.uri)
    monkeypatch.setenv(tracking.ENV_MLFLOW_EXPERIMENT, experiment)
    output = tmp_path / "eval"
    code = atlas(eval_cmd("builtin://tiny-llama", "builtin://tiny-llama", output, "--limit", "3", "-k", "1", *SMALL))
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    (run,) = tracked_runs(mlflow_server, experiment)
    assert f"tracked: MLflow run {run.info.run_id}" in err
    report = json.loads((output / "eval.json").read_text())
    assert run.data.metrics["atlas_eval_problems"] == 3 == report["problems"]
    assert run.data.metrics["atlas_eval_non_degradation_rate"] == pytest.approx(report["non_degradation_rate"])
    assert run.data.params["eval.teacher"] == "builtin://tiny-llama" and run.data.params["eval.split"] == "test"
    assert run.data.tags[tracking.TAG_KIND] == "eval" and run.info.status == "FINISHED"
    artifacts = {a.path for a in mlflow_server.client().list_artifacts(run.info.run_id)}
    assert artifacts == {"eval.json", "problems.jsonl"}
