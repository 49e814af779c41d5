"""Prometheus metrics a trainer pod exports on ``:9400/metrics`` (names fixed in design.md).

All trainer metrics live in one registry, ``TRAINER_REGISTRY``, so the HTTP endpoint
shows exactly these (no process/platform collectors mixed in) and so tests and the Helm
dashboard check can enumerate what the code really exports.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

TRAINER_REGISTRY = CollectorRegistry(auto_describe=True)

RUN_LABELS = ("namespace", "run", "kind")

training_step = Gauge("atlas_training_step", "Global optimizer step of the run.", RUN_LABELS, registry=TRAINER_REGISTRY)
training_reward = Gauge(
    "atlas_training_reward", "Mean reward of the last logged steps.", RUN_LABELS, registry=TRAINER_REGISTRY
)
training_reward_std = Gauge(
    "atlas_training_reward_std", "Standard deviation of the reward.", RUN_LABELS, registry=TRAINER_REGISTRY
)
training_kl = Gauge(
    "atlas_training_kl", "Mean KL divergence to the reference model (beta > 0).", RUN_LABELS, registry=TRAINER_REGISTRY
)
training_loss = Gauge("atlas_training_loss", "Training loss.", RUN_LABELS, registry=TRAINER_REGISTRY)
training_completion_length_mean = Gauge(
    "atlas_training_completion_length_mean",
    "Mean completion length in tokens.",
    RUN_LABELS,
    registry=TRAINER_REGISTRY,
)
training_tokens = Counter(
    "atlas_training_tokens", "Prompt and completion tokens processed.", RUN_LABELS, registry=TRAINER_REGISTRY
)

teaching_reward = Gauge(
    "atlas_teaching_reward", "Mean teaching reward of the teacher's guidance.", RUN_LABELS, registry=TRAINER_REGISTRY
)
teaching_accuracy_delta = Gauge(
    "atlas_teaching_accuracy_delta",
    "Student accuracy with guidance minus without.",
    RUN_LABELS,
    registry=TRAINER_REGISTRY,
)
teaching_improvement_rate = Gauge(
    "atlas_teaching_improvement_rate",
    "Fraction of tasks where guidance improved the student.",
    RUN_LABELS,
    registry=TRAINER_REGISTRY,
)
teaching_degradation_rate = Gauge(
    "atlas_teaching_degradation_rate",
    "Fraction of tasks where guidance made the student worse.",
    RUN_LABELS,
    registry=TRAINER_REGISTRY,
)
teaching_guidance_tokens_mean = Gauge(
    "atlas_teaching_guidance_tokens_mean", "Mean guidance length in tokens.", RUN_LABELS, registry=TRAINER_REGISTRY
)

rim_judge_score = Gauge("atlas_rim_judge_score", "Mean score of one RIM judge.", ("judge",), registry=TRAINER_REGISTRY)
rim_escalations = Counter(
    "atlas_rim_escalations", "RIM evaluations escalated to the large model.", registry=TRAINER_REGISTRY
)
rim_judge_errors = Counter(
    "atlas_rim_judge_errors", "RIM judge calls that failed after retries.", registry=TRAINER_REGISTRY
)

#: Log key written by the trainers → gauge mirrored from it.
LOG_KEY_GAUGES: dict[str, Gauge] = {
    "reward": training_reward,
    "reward_std": training_reward_std,
    "kl": training_kl,
    "loss": training_loss,
    "completions/mean_length": training_completion_length_mean,
    "teaching/reward": teaching_reward,
    "teaching/accuracy_delta": teaching_accuracy_delta,
    "teaching/improvement_rate": teaching_improvement_rate,
    "teaching/degradation_rate": teaching_degradation_rate,
    "teaching/guidance_tokens_mean": teaching_guidance_tokens_mean,
}

_server_lock = threading.Lock()
_servers: dict[tuple[str, int], object] = {}


def exported_metric_names() -> set[str]:
    """Sample names this registry can expose (counters with their ``_total`` suffix)."""
    names = set()
    for metric in TRAINER_REGISTRY.collect():
        if metric.type == "counter":
            names.add(f"{metric.name}_total")
        else:
            names.add(metric.name)
    return names


def serve_metrics(port: int, host: str = "0.0.0.0") -> int:
    """Start (once per address) the ``/metrics`` HTTP server; returns the bound port.

    ``port=0`` is not special here: callers decide whether metrics are on.
    """
    with _server_lock:
        key = (host, port)
        if key not in _servers:
            server, _thread = start_http_server(port, addr=host, registry=TRAINER_REGISTRY)
            _servers[key] = server
        return _servers[key].server_address[1]


def stop_metrics_servers() -> None:
    """Stop every server started by :func:`serve_metrics` (used at the end of a local run)."""
    with _server_lock:
        for server in _servers.values():
            server.shutdown()
            server.server_close()
        _servers.clear()
