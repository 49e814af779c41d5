"""spec.tracking through the operator: what the trainer pods get (TRL's report_to, MLflow's and W&B's own environment,
the W&B key by reference only, the params and tags in run.yaml), and how the trainer's /metrics and result become
``.status.tracking``, condition Tracking, its Warning and the run's final figures (atlas_operator/render/tracking.py,
atlas_operator/tracking_status.py)."""

from __future__ import annotations

import yaml
from atlas_operator.manifests import render_children
from atlas_operator.reconcile.observe import Observation
from atlas_operator.render import Images
from atlas_operator.run_status import EventReason
from atlas_operator.status_update import Outcome, status_update
from atlas_operator.tracking_status import parse_tracking, running_update
from atlas_operator.validation import parse_run

from atlas_contract import results, tracking
from atlas_contract.run_config import RunConfig
from harness.manifests import teacher, training
from tests.support.render import config_map_of, pod_templates

SERVER = "http://mlflow.monitoring:5000"
LITERAL = "not-a-secret-but-a-literal"


def rendered(manifest: dict) -> tuple[RunConfig, dict[str, dict]]:
    """run.yaml as the trainer reads it back, and the trainer container's env by name."""
    objects = render_children(parse_run(manifest), Images())
    config = yaml.safe_load(config_map_of(objects)["data"]["run.yaml"])
    job = next(o for o in objects if o["kind"] == "PyTorchJob")
    (container,) = [c for c in pod_templates(job)[0]["spec"]["containers"] if c["name"] == "pytorch"]
    return RunConfig.from_dict(config), {e["name"]: e for e in container["env"]}


def tracked_teacher(**tracking_spec) -> dict:
    manifest = teacher("tracked", tracking=tracking_spec, env=[{"name": "MY_SETTING", "value": LITERAL}])
    manifest["metadata"]["uid"] = "0f6e4c1a-uid"
    return manifest


def test_mlflow_and_wandb_reach_the_trainer_through_report_to_and_their_own_environment():
    run, env = rendered(
        tracked_teacher(mlflow={"uri": SERVER}, wandb={"project": "atlas", "secretRef": {"name": "wb"}})
    )
    assert run.trainer["report_to"] == ["mlflow", "wandb"]
    assert env[tracking.ENV_MLFLOW_URI]["value"] == SERVER
    assert env[tracking.ENV_MLFLOW_EXPERIMENT]["value"] == "team-a"  # the run's namespace
    assert env["WANDB_API_KEY"] == {
        "name": "WANDB_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "wb", "key": "WANDB_API_KEY"}},
    }
    assert env[tracking.ENV_WANDB_RUN_ID]["value"] == "0f6e4c1a-uid" and "WANDB_MODE" not in env
    params = run.tracking.params
    assert params["spec.tracking.mlflow.uri"] == SERVER and params["atlas.backend"] == "PyTorchJob"
    assert params["spec.student.model"] == "meta-llama/Llama-3.2-1B-Instruct" and params["atlas.image"].startswith(
        "ghcr.io/"
    )
    assert params["spec.env"] == "MY_SETTING" and not [k for k, v in params.items() if LITERAL in v]
    assert run.tracking.tags == {
        tracking.TAG_NAMESPACE: "team-a",
        tracking.TAG_NAME: "tracked",
        tracking.TAG_KIND: "AtlasTeacher",
        tracking.TAG_UID: "0f6e4c1a-uid",
    }


def test_a_named_experiment_wandb_without_a_key_is_offline_and_no_tracking_changes_nothing():
    run, env = rendered(tracked_teacher(mlflow={"uri": SERVER, "experiment": "teachers"}, wandb={"project": "p"}))
    assert env[tracking.ENV_MLFLOW_EXPERIMENT]["value"] == "teachers"
    assert env["WANDB_MODE"]["value"] == "offline" and env["WANDB_DIR"]["value"] == run.output_dir
    assert "WANDB_API_KEY" not in env
    plain, plain_env = rendered(training("plain"))
    assert plain.trainer["report_to"] == [] and plain.tracking is None
    assert not [name for name in plain_env if name.startswith(("MLFLOW_", "WANDB_"))]


def trainer_metrics(up: bool, run_id: str | None) -> str:
    """The trainer's /metrics text as its registry writes it, with the tracking gauges set as the trainer sets them."""
    from prometheus_client import generate_latest

    from atlas_core.telemetry import metrics

    labels = {"namespace": "team", "run": "tracked", "kind": "AtlasTeacher", "backend": "mlflow"}
    metrics.tracking_up.labels(**labels).set(1 if up else 0)
    if run_id:
        metrics.tracking_run_info.labels(**labels, run_id=run_id, url=f"{SERVER}/#/experiments/1/runs/{run_id}").set(1)
    try:
        return generate_latest(metrics.TRAINER_REGISTRY).decode()
    finally:
        metrics.tracking_up.clear()
        metrics.tracking_run_info.clear()


def test_the_trainers_metrics_say_whether_its_server_answers_and_which_run_it_logs_to():
    text = trainer_metrics(True, "a1b2")
    assert parse_tracking(text, "tracked", "team") == {
        "up": True,
        "runId": "a1b2",
        "url": f"{SERVER}/#/experiments/1/runs/a1b2",
    }
    assert parse_tracking(text, "another-run", "team") is None
    assert parse_tracking(trainer_metrics(False, None), "tracked", "team") == {"up": False}


def test_a_server_that_stops_answering_is_a_false_condition_and_one_warning_naming_the_uri():
    spec = {"tracking": {"mlflow": {"uri": SERVER}}}
    logging, reference, warning = running_update({}, spec, {"up": True, "runId": "a1b2", "url": "u"})
    assert logging["status"] == "True" and reference == {"runId": "a1b2", "url": "u"} and warning is None
    status = {"conditions": [logging], "tracking": reference}
    down, reference, warning = running_update(status, spec, {"up": False, "runId": "a1b2", "url": "u"})
    assert down["status"] == "False" and down["reason"] == EventReason.TRACKING_UNREACHABLE and reference is None
    assert warning == (EventReason.TRACKING_UNREACHABLE, down["message"]) and SERVER in down["message"]
    again = running_update({**status, "conditions": [down]}, spec, {"up": False, "runId": "a1b2", "url": "u"})
    assert again == (None, None, None)  # said once: no second write, no second Warning
    assert running_update(status, {}, {"up": False}) == (None, None, None)  # no spec.tracking.mlflow: nothing


def test_at_succeeded_the_result_fills_the_final_figures_and_the_tracking_run():
    """The result carries the last step, reward and KL and the tracking run: a run that ended before any scrape still
    shows them (kubectl get's STEP, REWARD and KL columns)."""
    message = results.result_message(6, 0.5, kl=0.0123, tracking={"runId": "a1b2", "url": "u"})
    parsed = results.parse_result_message(message)
    assert parsed == {"step": 6, "reward": 0.5, "kl": 0.0123, "tracking": {"runId": "a1b2", "url": "u"}}
    outcome = Outcome(
        phase="Succeeded",
        conditions=[],
        result={k: v for k, v in parsed.items() if k != "tracking"},
        tracking=parsed["tracking"],
        progress={"step": 6, "reward": 0.5, "kl": 0.0123},
    )
    patch, _ = status_update({"phase": "Running"}, 1, outcome, "2026-12-07T00:00:00Z")
    assert patch["tracking"] == {"runId": "a1b2", "url": "u"}
    assert patch["progress"] == {"step": 6, "reward": 0.5, "kl": 0.0123, "updatedAt": "2026-12-07T00:00:00Z"}
    assert patch["result"]["kl"] == 0.0123


def test_a_run_that_succeeded_before_any_tick_saw_its_server_down_still_gets_one_warning():
    """A short run can end between two ticks: the tick never scraped ``atlas_tracking_up 0``. Its end says it then
    (condition Tracking False and one Warning naming the URI); a run whose tick already said it gets no second one."""
    run = parse_run(teacher("tracked", tracking={"mlflow": {"uri": SERVER}}))

    def ended(shown: list[dict]) -> tuple[dict, list]:
        outcome = Outcome(phase="Succeeded", conditions=[])
        Observation.observe_tracking(run, {"status": {"phase": "Running", "conditions": shown}}, outcome)
        return status_update({"phase": "Running", "conditions": shown}, 1, outcome, "2026-12-07T00:00:00Z")

    patch, events = ended([])
    (said,) = [c for c in patch["conditions"] if c["type"] == "Tracking"]
    assert (said["status"], said["reason"]) == ("False", EventReason.TRACKING_UNREACHABLE) and SERVER in said["message"]
    warnings = [e for e in events if e.reason == EventReason.TRACKING_UNREACHABLE]
    assert [(e.type, e.message) for e in warnings] == [("Warning", said["message"])]
    down, _, _ = running_update({}, {"tracking": {"mlflow": {"uri": SERVER}}}, {"up": False})
    _, events = ended([{**down, "lastTransitionTime": "2026-12-07T00:00:00Z"}])
    assert not [e for e in events if e.reason == EventReason.TRACKING_UNREACHABLE]  # its tick posted it already
