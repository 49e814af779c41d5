"""Trainer callbacks that report progress: Prometheus gauges and a JSON-lines file.

Both act on rank 0 only (``state.is_world_process_zero``): the other ranks train but
neither serve metrics nor write files.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from transformers import TrainerCallback

from atlas_core.telemetry import metrics

logger = logging.getLogger(__name__)


def _finite(value) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class PrometheusMetricsCallback(TrainerCallback):
    """Mirrors the trainer's logs into the ``atlas_training_*`` / ``atlas_teaching_*`` gauges.

    The endpoint starts when training begins (rank 0 only) on ``port``; a log key that a
    step did not produce (``kl`` when ``beta == 0``) leaves its gauge unset.
    """

    def __init__(self, port: int, host: str = "0.0.0.0", labels: dict[str, str] | None = None):
        self.port = port
        self.host = host
        self.labels = labels or {"namespace": "local", "run": "atlas", "kind": "local"}
        self.bound_port: int | None = None
        self._tokens_seen = 0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.port:
            try:
                self.bound_port = metrics.serve_metrics(self.port, self.host)
            except OSError as exc:  # telemetry must not stop training
                logger.warning(
                    "metrics_port: cannot serve /metrics on %s:%s (%s); training continues without it",
                    self.host,
                    self.port,
                    exc.strerror or exc,
                )
            self._tokens_seen = int(getattr(state, "num_input_tokens_seen", 0) or 0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            metrics.training_last_step_timestamp.labels(**self.labels).set(time.time())

    def on_train_end(self, args, state, control, **kwargs):
        # No longer stepping: what the process does now (a final save, the evaluation) is not a stall.
        if state.is_world_process_zero:
            try:
                metrics.training_last_step_timestamp.remove(*(self.labels[k] for k in metrics.RUN_LABELS))
            except KeyError:  # no step was completed
                pass

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        metrics.training_step.labels(**self.labels).set(state.global_step)
        for key, gauge in metrics.LOG_KEY_GAUGES.items():
            value = _finite(logs.get(key))
            if value is not None:
                gauge.labels(**self.labels).set(value)
        tokens = _finite(logs.get("num_tokens"))
        if tokens is not None and tokens > self._tokens_seen:
            metrics.training_tokens.labels(**self.labels).inc(tokens - self._tokens_seen)
            self._tokens_seen = int(tokens)


class JsonlMetricsCallback(TrainerCallback):
    """Appends every log (with ``step`` and wall-clock ``time``) to a ``metrics.jsonl`` file."""

    def __init__(self, path: str | Path, extra: dict | None = None):
        self.path = Path(path)
        self.extra = dict(extra or {})

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        record = {"step": state.global_step, "time": time.time(), **self.extra}
        record.update({k: v for k, v in logs.items() if isinstance(v, (int, float, str)) or v is None})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class RunIdentityCallback(TrainerCallback):
    """Records in every checkpoint which run wrote it and with which settings (``atlas_run.json``), so that
    a resume can refuse another run's checkpoint or one trained with other settings."""

    def __init__(self, identity: dict):
        self.identity = identity

    def fill_checkpoint(self, checkpoint: Path, args, state) -> None:
        """Called by the saving process with the checkpoint's folder before it is published (written whole:
        atlas_core/training/checkpoints.py)."""
        from atlas_core.training.resume import write_identity

        write_identity(checkpoint, self.identity)


def telemetry_callbacks(args) -> list[TrainerCallback]:
    """The Prometheus callback when ``args.metrics_port`` is set (Atlas configs); none otherwise."""
    port = int(getattr(args, "metrics_port", 0) or 0)
    if not port:
        return []
    return [PrometheusMetricsCallback(port=port, host=args.metrics_host, labels=args.metric_labels())]
