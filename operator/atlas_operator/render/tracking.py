"""spec.tracking as the trainer pods see it (atlas_contract/tracking.py): TRL's ``report_to``, MLflow's and W&B's own
environment (the W&B key by ``secretKeyRef``: the operator never reads a Secret), and run.yaml's ``tracking`` section
(the params and tags of the tracking run). Pure."""

from __future__ import annotations

from typing import Any

from atlas_contract import tracking
from atlas_contract.run_config import TrackingRecord
from atlas_operator import __version__
from atlas_operator.schema import to_object
from atlas_operator.spec import Run


def report_to(run: Run) -> list[str]:
    """TRL's ``report_to``: the trackers spec.tracking names (none without it)."""
    settings = run.spec.tracking
    if settings is None:
        return []
    return [name for name, section in ((tracking.MLFLOW, settings.mlflow), (tracking.WANDB, settings.wandb)) if section]


def tracking_env(run: Run, output_dir: str) -> list[dict[str, Any]]:
    """The libraries' environment for spec.tracking: where MLflow logs and in which experiment (the run's namespace
    unless named), W&B's project, entity and key (offline, into ``output_dir``, without a key); a W&B run resumed by
    the Atlas run's uid."""
    settings = run.spec.tracking
    if settings is None:
        return []
    env: list[dict[str, Any]] = []
    if settings.mlflow:
        env.append({"name": tracking.ENV_MLFLOW_URI, "value": settings.mlflow.uri})
        env.append({"name": tracking.ENV_MLFLOW_EXPERIMENT, "value": settings.mlflow.experiment or run.namespace})
    wandb = settings.wandb
    if wandb:
        env.append({"name": tracking.ENV_WANDB_PROJECT, "value": wandb.project})
        if wandb.entity:
            env.append({"name": tracking.ENV_WANDB_ENTITY, "value": wandb.entity})
        if wandb.secret_ref:
            key = tracking.WANDB_SECRET_KEY
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": wandb.secret_ref.name, "key": key}}})
        else:
            env += [{"name": "WANDB_MODE", "value": "offline"}, {"name": "WANDB_DIR", "value": output_dir}]
        if run.uid:  # every attempt of the run continues one W&B run
            env += [
                {"name": tracking.ENV_WANDB_RUN_ID, "value": run.uid},
                {"name": tracking.ENV_WANDB_RESUME, "value": "allow"},
            ]
    return env


def tracking_record(run: Run, trainer_image: str | None = None) -> TrackingRecord | None:
    """run.yaml's ``tracking``: the spec flattened, the image, the backend and the operator's version as params; the
    run's namespace, name, uid and kind as tags. None without spec.tracking."""
    if run.spec.tracking is None:
        return None
    params = tracking.spec_params(to_object(run.spec))
    params.update(
        {
            "atlas.image": run.spec.image or trainer_image or "",
            "atlas.backend": run.backend,
            "atlas.operator_version": __version__,
        }
    )
    tags = {
        tracking.TAG_NAMESPACE: run.namespace,
        tracking.TAG_NAME: run.name,
        tracking.TAG_KIND: run.kind,
        **({tracking.TAG_UID: run.uid} if run.uid else {}),
    }
    return TrackingRecord(params={k: v for k, v in params.items() if v}, tags=tags)
