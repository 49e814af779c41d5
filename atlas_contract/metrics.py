"""Every metric Atlas exports: the trainer's (rank 0, ``:9400/metrics``) and the operator's (``:8080``).

The registries in ``atlas_core.telemetry.metrics`` and ``atlas_operator.metrics`` are built from these
lists, the operator mirrors ``PROGRESS`` into ``.status.progress``, and the chart's dashboard and alert
rules are checked against :func:`exported_names`. Counter names are given without ``_total``: the
client library adds it on the wire.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_LABELS = ("namespace", "run", "kind")


@dataclass(frozen=True)
class Metric:
    name: str
    type: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...] = ()
    log_key: str | None = None  # the trainer's log key this gauge mirrors (trainer metrics)

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names Prometheus sees."""
        if self.type == "counter":
            return (f"{self.name}_total",)
        if self.type == "histogram":
            return tuple(f"{self.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
        return (self.name,)


TRAINER = (
    Metric("atlas_training_step", "gauge", "Global optimizer step of the run.", RUN_LABELS),
    Metric(
        "atlas_training_last_step_timestamp_seconds",
        "gauge",
        "Unix time of the last optimizer step, while training (a stall shows before the watchdog fires).",
        RUN_LABELS,
    ),
    Metric("atlas_training_reward", "gauge", "Mean reward of the last logged steps.", RUN_LABELS, "reward"),
    Metric("atlas_training_reward_std", "gauge", "Standard deviation of the reward.", RUN_LABELS, "reward_std"),
    Metric("atlas_training_kl", "gauge", "Mean KL divergence to the reference model (beta > 0).", RUN_LABELS, "kl"),
    Metric("atlas_training_loss", "gauge", "Training loss.", RUN_LABELS, "loss"),
    Metric(
        "atlas_training_completion_length_mean",
        "gauge",
        "Mean completion length in tokens.",
        RUN_LABELS,
        "completions/mean_length",
    ),
    Metric("atlas_training_tokens", "counter", "Prompt and completion tokens processed.", RUN_LABELS),
    Metric(
        "atlas_teaching_reward",
        "gauge",
        "Mean teaching reward of the teacher's guidance.",
        RUN_LABELS,
        "teaching/reward",
    ),
    Metric(
        "atlas_teaching_accuracy_delta",
        "gauge",
        "Student accuracy with guidance minus without.",
        RUN_LABELS,
        "teaching/accuracy_delta",
    ),
    Metric(
        "atlas_teaching_improvement_rate",
        "gauge",
        "Fraction of tasks where guidance improved the student.",
        RUN_LABELS,
        "teaching/improvement_rate",
    ),
    Metric(
        "atlas_teaching_degradation_rate",
        "gauge",
        "Fraction of tasks where guidance made the student worse.",
        RUN_LABELS,
        "teaching/degradation_rate",
    ),
    Metric(
        "atlas_teaching_guidance_tokens_mean",
        "gauge",
        "Mean guidance length in tokens.",
        RUN_LABELS,
        "teaching/guidance_tokens_mean",
    ),
    Metric("atlas_eval_student_accuracy", "gauge", "Evaluation: student accuracy alone.", RUN_LABELS),
    Metric(
        "atlas_eval_guided_accuracy", "gauge", "Evaluation: student accuracy with the teacher's guidance.", RUN_LABELS
    ),
    Metric("atlas_eval_accuracy_delta", "gauge", "Evaluation: guided minus alone accuracy.", RUN_LABELS),
    Metric(
        "atlas_eval_non_degradation_rate",
        "gauge",
        "Evaluation: share of problems where guidance did not make the student worse.",
        RUN_LABELS,
    ),
    Metric(
        "atlas_tracking_up",
        "gauge",
        "1 while the run's experiment tracking server answers, 0 while it does not (training goes on; the steps are "
        "logged when it is back).",
        (*RUN_LABELS, "backend"),
    ),
    Metric(
        "atlas_tracking_run_info",
        "gauge",
        "1, labelled with the tracking run the run logs to (run_id) and its page (url).",
        (*RUN_LABELS, "backend", "run_id", "url"),
    ),
    Metric("atlas_rim_judge_score", "gauge", "Mean score of one RIM judge.", ("judge",)),
    Metric("atlas_rim_escalations", "counter", "RIM evaluations escalated to the large model."),
    Metric("atlas_rim_judge_calls", "counter", "RIM judge calls made (one judgment asked of a model)."),
    Metric("atlas_rim_judge_errors", "counter", "RIM judge calls that failed after retries."),
)

RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
OPERATOR = (
    Metric(
        "atlas_operator_reconcile",
        "counter",
        "Reconciliations of runs, by kind and result (success | error).",
        ("kind", "result"),
    ),
    Metric("atlas_operator_reconcile_duration_seconds", "histogram", "Time to reconcile one run, by kind.", ("kind",)),
    Metric("atlas_operator_runs", "gauge", "Runs the operator knows, by kind and phase.", ("kind", "phase")),
    Metric(
        "atlas_operator_run_phase",
        "gauge",
        "1 for each run in its current phase (one series per run: alerts name the run).",
        ("kind", "namespace", "run", "phase"),
    ),
    Metric(
        "atlas_operator_watchdog_restarts",
        "counter",
        "Restarts of a run's job after its step watchdog ended a trainer process (exit code 75), as the operator "
        "saw them.",
        ("kind", "namespace", "run"),
    ),
    Metric(
        "atlas_training_preemption_saves",
        "counter",
        "Checkpoints a run's trainer saved on SIGTERM (Kueue preemption, a node drain, a spot reclaim) at the step in "
        "flight, one per step, as the operator read them from the trainer pods' stop reports.",
        RUN_LABELS,
    ),
)

# .status.progress key → the trainer gauge the operator mirrors it from.
PROGRESS = {"step": "atlas_training_step", "reward": "atlas_training_reward", "kl": "atlas_training_kl"}


def by_name(metrics: tuple[Metric, ...]) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


def exported_names(metrics: tuple[Metric, ...] = TRAINER + OPERATOR) -> set[str]:
    """Every series name a PromQL expression may use."""
    return {series for metric in metrics for series in metric.series}
