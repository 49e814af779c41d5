"""The operator's settings: one object, read once (the Helm chart sets the environment; ``atlas operator``
flags override it), handed to the reconciler and the handlers."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from atlas_contract.names import BACKENDS, OPERATOR_METRICS_PORT, TRAINER_METRICS_PORT, TRAINJOB_RUNTIME


@dataclass(frozen=True)
class Images:
    """What runs' pods are made from, operator-wide (flags/env of ``atlas operator``); a run's spec.image wins."""

    trainer: str = "ghcr.io/arc-computer/atlas-trainer:0.1.0"
    rollout: str = "ghcr.io/arc-computer/atlas-trainer:0.1.0"  # the trainer image carries vLLM
    # The ClusterTrainingRuntime a TrainJob run's TrainJob names (the chart installs it: trainJob.runtime.name).
    trainjob_runtime: str = TRAINJOB_RUNTIME


@dataclass(frozen=True)
class NetworkSettings:
    """Operator-wide: whether runs get NetworkPolicies, and who may read the trainers' metrics besides the run."""

    enabled: bool = True
    # The operator's namespace (its pod, labelled OPERATOR_POD_LABELS, scrapes the trainers); None: not in a cluster.
    operator_namespace: str | None = None
    # Every pod of this namespace may scrape the trainers' metrics port (Prometheus); None: no namespace.
    monitoring_namespace: str | None = "monitoring"


# Environment variable of each setting (the chart's deployment.yaml sets them).
ENV = {
    "watch_namespaces": "ATLAS_WATCH_NAMESPACES",
    "trainer_image": "ATLAS_TRAINER_IMAGE",
    "rollout_image": "ATLAS_ROLLOUT_IMAGE",
    "progress_interval": "ATLAS_PROGRESS_INTERVAL",
    "metrics_port": "ATLAS_OPERATOR_METRICS_PORT",
    "metrics_host": "ATLAS_OPERATOR_METRICS_HOST",
    "metrics_url_template": "ATLAS_METRICS_URL_TEMPLATE",
    "retry_delay": "ATLAS_RETRY_DELAY",
    "workers": "ATLAS_WORKERS",
    "default_backend": "ATLAS_DEFAULT_BACKEND",
    "trainjob_runtime": "ATLAS_TRAINJOB_RUNTIME",
    "network_policy": "ATLAS_NETWORK_POLICY",
    "monitoring_namespace": "ATLAS_MONITORING_NAMESPACE",
    "operator_namespace": "ATLAS_OPERATOR_NAMESPACE",
    "leader_election_lease": "ATLAS_LEADER_ELECTION_LEASE",
}
# Settings where an empty value means "none" rather than "unset".
_EMPTY_MEANS_NONE = ("watch_namespaces", "monitoring_namespace")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a namespace name (a DNS label)
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class OperatorConfig:
    """Each field: meaning and default; its environment variable is in :data:`ENV`."""

    # Comma-separated namespaces to watch; empty = cluster-wide.
    watch_namespaces: tuple[str, ...] = ()
    # Images when a run's spec does not name one (the rollout image defaults to the trainer image).
    images: Images = field(default_factory=Images)
    # Seconds between status refreshes (the job's phase, metrics, missing children).
    progress_interval: float = 15.0
    # /metrics and /healthz; port 0 = off.
    metrics_port: int = OPERATOR_METRICS_PORT
    metrics_host: str = "0.0.0.0"
    # Where trainer metrics are read: {name} {namespace} {service} {port}.
    metrics_url_template: str = "http://{service}.{namespace}.svc:{port}/metrics"
    trainer_metrics_port: int = TRAINER_METRICS_PORT
    # Seconds before a failed reconciliation (API error) is retried.
    retry_delay: float = 5.0
    # Threads running reconciliations.
    workers: int = 16
    # Seconds a trainer scrape may take; how long a prerequisite found (a job CRD, the runtime, a PVC, a reward
    # ConfigMap) is trusted before it is checked again.
    scrape_timeout_s: float = 5.0
    crd_cache_s: float = 60.0
    # spec.backend of a run that leaves it unset (one of BACKENDS).
    default_backend: str = BACKENDS[0]
    # A NetworkPolicy per run (its pods accept only its trainers; metrics also the operator and the monitoring
    # namespace). Enforced only by a CNI that implements NetworkPolicy (Calico, Cilium, ...).
    network_policy: bool = True
    # Namespace whose pods may scrape the trainers' metrics port (Prometheus); empty = none.
    monitoring_namespace: str = "monitoring"
    # The operator's own namespace (the chart sets it from the downward API); empty = not in a cluster.
    operator_namespace: str = ""
    # The Lease in the operator's namespace that elects one active replica (atlas_operator/leader.py); empty = no
    # election (one replica, or `atlas operator` run by hand).
    leader_election_lease: str = ""

    @property
    def network(self) -> NetworkSettings:
        return NetworkSettings(
            enabled=self.network_policy,
            operator_namespace=self.operator_namespace or None,
            monitoring_namespace=self.monitoring_namespace or None,
        )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> OperatorConfig:
        """The settings from ``env`` (default: the process environment); ``overrides`` that are not None
        (command-line flags) win. Raises SystemExit naming the variable of a malformed value."""
        env = dict(os.environ if env is None else env)
        values: dict[str, Any] = {}
        defaults = cls()
        for name, variable in ENV.items():
            raw = overrides.get(name)
            if raw is None:
                raw = env.get(variable)
            if raw is None or (raw == "" and name not in _EMPTY_MEANS_NONE):
                continue
            try:
                values[name] = _convert(name, raw, defaults)
            except ValueError as exc:
                raise SystemExit(f"error: {variable}: {exc}") from None
        problems = _setting_problems(values)
        if problems:
            raise SystemExit("\n".join(f"error: {problem}" for problem in problems))
        trainer = values.pop("trainer_image", None)
        rollout = values.pop("rollout_image", None) or trainer  # the trainer image carries vLLM
        images = Images(
            trainer=trainer or defaults.images.trainer,
            rollout=rollout or defaults.images.rollout,
            trainjob_runtime=values.pop("trainjob_runtime", None) or defaults.images.trainjob_runtime,
        )
        return replace(defaults, images=images, **values)


# Ranges of the numeric settings: an interval of 0 would re-read every run in a hot loop.
_RANGES = {
    "progress_interval": (1.0, None),
    "metrics_port": (0, 65535),
    "retry_delay": (0.1, None),
    "workers": (1, 256),
}


def _setting_problems(values: dict[str, Any]) -> list[str]:
    problems = []
    for namespace in values.get("watch_namespaces") or ():
        if not _NAMESPACE.fullmatch(namespace):  # a kopf pattern (team-*, !team-b) needs Namespace list/watch
            problems.append(f"{ENV['watch_namespaces']}: {namespace!r} is not a namespace name (no patterns)")
    backend = values.get("default_backend")
    if backend is not None and backend not in BACKENDS:
        problems.append(f"{ENV['default_backend']}: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    for name, (low, high) in _RANGES.items():
        value = values.get(name)
        if value is None:
            continue
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            problems.append(f"{ENV[name]}: expected {bound}, got {value}")
    return problems


def _convert(name: str, raw: Any, defaults: OperatorConfig) -> Any:
    if name == "watch_namespaces":
        items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
        return tuple(n.strip() for n in items if n.strip())
    if name in (
        "trainer_image",
        "rollout_image",
        "trainjob_runtime",
        "default_backend",
        "monitoring_namespace",
        "operator_namespace",
        "leader_election_lease",
    ):
        return str(raw).strip()
    if name == "network_policy":
        if isinstance(raw, bool):
            return raw
        if str(raw).strip().lower() not in _BOOLEANS:
            raise ValueError(f"expected true or false, got {raw!r}")
        return _BOOLEANS[str(raw).strip().lower()]
    return type(getattr(defaults, name))(raw)


_configured: OperatorConfig | None = None


def configure(config: OperatorConfig) -> None:
    """Set the settings the handlers use (``atlas operator`` does this before kopf loads them)."""
    global _configured
    _configured = config


def current() -> OperatorConfig:
    """The configured settings, else the environment's (``kopf run -m atlas_operator.handlers``)."""
    return _configured if _configured is not None else OperatorConfig.from_env()
