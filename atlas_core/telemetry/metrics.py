"""Prometheus metrics a trainer pod exports (rank 0, port ``atlas_contract.names.TRAINER_METRICS_PORT``).

The names, types, help and labels are declared once in :mod:`atlas_contract.metrics`; this module
builds them into one registry, ``TRAINER_REGISTRY``, so the HTTP endpoint shows exactly these (no
process/platform collectors mixed in) and the dashboard check enumerates what the code really exports.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

from atlas_contract import metrics as contract

TRAINER_REGISTRY = CollectorRegistry(auto_describe=True)
RUN_LABELS = contract.RUN_LABELS
_SPECS = contract.by_name(contract.TRAINER)
_built: dict[str, Gauge | Counter] = {}


def _metric(name: str):
    spec = _SPECS[name]
    cls = Counter if spec.type == "counter" else Gauge
    _built[name] = cls(spec.name, spec.help, list(spec.labels), registry=TRAINER_REGISTRY)
    return _built[name]


training_step = _metric("atlas_training_step")
training_last_step_timestamp = _metric("atlas_training_last_step_timestamp_seconds")
training_reward = _metric("atlas_training_reward")
training_reward_std = _metric("atlas_training_reward_std")
training_kl = _metric("atlas_training_kl")
training_loss = _metric("atlas_training_loss")
training_completion_length_mean = _metric("atlas_training_completion_length_mean")
training_tokens = _metric("atlas_training_tokens")
teaching_reward = _metric("atlas_teaching_reward")
teaching_accuracy_delta = _metric("atlas_teaching_accuracy_delta")
teaching_improvement_rate = _metric("atlas_teaching_improvement_rate")
teaching_degradation_rate = _metric("atlas_teaching_degradation_rate")
teaching_guidance_tokens_mean = _metric("atlas_teaching_guidance_tokens_mean")
eval_student_accuracy = _metric("atlas_eval_student_accuracy")
eval_guided_accuracy = _metric("atlas_eval_guided_accuracy")
eval_accuracy_delta = _metric("atlas_eval_accuracy_delta")
eval_non_degradation_rate = _metric("atlas_eval_non_degradation_rate")
tracking_up = _metric("atlas_tracking_up")
tracking_run_info = _metric("atlas_tracking_run_info")
rim_judge_score = _metric("atlas_rim_judge_score")
rim_escalations = _metric("atlas_rim_escalations")
rim_judge_calls = _metric("atlas_rim_judge_calls")
rim_judge_errors = _metric("atlas_rim_judge_errors")
if set(_built) != set(_SPECS):  # the contract is the list: a metric declared there is exported here
    raise ImportError(f"atlas_core.telemetry.metrics does not build {sorted(set(_SPECS) - set(_built))}")

#: Log key written by the trainers → the gauge mirrored from it (the contract's ``log_key``).
LOG_KEY_GAUGES: dict[str, Gauge] = {
    spec.log_key: cast(Gauge, _built[spec.name]) for spec in contract.TRAINER if spec.log_key
}

_server_lock = threading.Lock()
_servers: dict[tuple[str, int], WSGIServer] = {}


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
