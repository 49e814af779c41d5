"""Operator-wide settings, from the environment (the Helm chart sets them; ``atlas operator`` flags too)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from atlas_operator.reconcile import Settings
from atlas_operator.render import Images


@dataclass(frozen=True)
class OperatorConfig:
    """Each field: its environment variable, meaning and default."""

    # ATLAS_WATCH_NAMESPACES: comma-separated namespaces to watch; empty = cluster-wide.
    watch_namespaces: tuple[str, ...] = ()
    # ATLAS_TRAINER_IMAGE / ATLAS_ROLLOUT_IMAGE: images when a run's spec does not name one.
    images: Images = field(default_factory=Images)
    # ATLAS_PROGRESS_INTERVAL: seconds between status refreshes (PyTorchJob phase, metrics, missing children).
    progress_interval: float = 15.0
    # ATLAS_OPERATOR_METRICS_PORT / _HOST: /metrics and /healthz; port 0 = off.
    metrics_port: int = 8080
    metrics_host: str = "0.0.0.0"
    # ATLAS_METRICS_URL_TEMPLATE: where trainer metrics are read ({name} {namespace} {service} {port}).
    metrics_url_template: str = "http://{service}.{namespace}.svc:{port}/metrics"
    # ATLAS_RETRY_DELAY: seconds before a failed reconciliation (API error) is retried.
    retry_delay: float = 5.0
    # ATLAS_WORKERS: threads running reconciliations.
    workers: int = 16

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> OperatorConfig:
        env = dict(os.environ if env is None else env)
        defaults = cls()
        try:
            return cls(
                watch_namespaces=tuple(
                    n.strip() for n in env.get("ATLAS_WATCH_NAMESPACES", "").split(",") if n.strip()
                ),
                images=Images(
                    trainer=env.get("ATLAS_TRAINER_IMAGE") or defaults.images.trainer,
                    rollout=env.get("ATLAS_ROLLOUT_IMAGE") or env.get("ATLAS_TRAINER_IMAGE") or defaults.images.rollout,
                ),
                progress_interval=float(env.get("ATLAS_PROGRESS_INTERVAL", defaults.progress_interval)),
                metrics_port=int(env.get("ATLAS_OPERATOR_METRICS_PORT", defaults.metrics_port)),
                metrics_host=env.get("ATLAS_OPERATOR_METRICS_HOST", defaults.metrics_host),
                metrics_url_template=env.get("ATLAS_METRICS_URL_TEMPLATE", defaults.metrics_url_template),
                retry_delay=float(env.get("ATLAS_RETRY_DELAY", defaults.retry_delay)),
                workers=int(env.get("ATLAS_WORKERS", defaults.workers)),
            )
        except ValueError as exc:
            raise SystemExit(f"error: operator environment: {exc}") from exc

    def reconciler_settings(self) -> Settings:
        return Settings(images=self.images, metrics_url_template=self.metrics_url_template)
