"""The API types of a run's status (``AtlasTraining`` and ``AtlasTeacher``, atlas.arc.computer/v1alpha1).

With :mod:`atlas_operator.spec`, the one source of truth of the CRDs (``python -m atlas_operator.generate``):
the condition types the operator may set, the children it names, the progress and the result it mirrors; and the
reasons of the Events it posts. At run time a condition type, a child key or an Event reason not declared here is
refused (reconcile/conditions.py's ``condition``, :mod:`atlas_operator.status_update`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from atlas_contract.names import PHASES
from atlas_contract.results import RESULT_RANGES
from atlas_operator.schema import camel, spec_field


class ConditionType(enum.StrEnum):
    """The run's conditions: the CRD's enum of ``status.conditions[].type`` and the only types the operator sets."""

    VALID = "Valid"  # the spec passed validation (False: Invalid, every problem named)
    CHECKPOINTS_SHARED = "CheckpointsShared"  # every rank's checkpoints are where every rank resumes from
    SERVERS_REQUEST_RESOURCES = "ServersRequestResources"  # no vLLM server of the run is a BestEffort pod
    PREREQUISITES_MET = "PrerequisitesMet"  # the backend's CRD, the PVC, the reward ConfigMap exist
    CHILDREN_READY = "ChildrenReady"  # every child exists as rendered (False: rejected, or a name conflict)
    SPEC_APPLIED = "SpecApplied"  # the running job runs the current spec
    ROLLOUT_READY = "RolloutReady"  # the vLLM servers are Ready
    PODS_STARTED = "PodsStarted"  # no pod of the run is kept from starting (an image, a Secret)
    TRAINING = "Training"  # the trainer runs (the job's own words)
    SOURCES_READY = "SourcesReady"  # the run's S3, hub and PVC sources are fetched (runs that name one)
    EXPORTED = "Exported"  # the trained model is exported to spec.output.uri (runs with spec.output)
    TRACKING = "Tracking"  # the trainer logs to spec.tracking.mlflow's server (False: it does not answer)


class EventReason(enum.StrEnum):
    """The reason of every Event the operator posts (status_update.Event refuses any other). Several are also the
    reason of the condition that says the same."""

    # A phase entered: the transition's Event has the phase's name (Warning for Failed and Invalid).
    PENDING = "Pending"
    QUEUED = "Queued"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    INVALID = "Invalid"
    # Warnings: the spec, the names, the cluster.
    INVALID_SPEC = "InvalidSpec"
    NAME_TAKEN = "NameTaken"  # names held by a run of the other kind: this run is refused
    NAME_CONFLICT = "NameConflict"  # an object the run does not control under one of its child names
    CHECKPOINTS_NOT_SHARED = "CheckpointsNotShared"
    SERVERS_BEST_EFFORT = "ServersBestEffort"  # a vLLM server requests no CPU and no memory (cpu and memory: 0)
    CHILD_REJECTED = "ChildRejected"  # the API server refused a child as rendered
    PYTORCHJOB_CRD_MISSING = "PyTorchJobCRDMissing"
    JOBSET_CRD_MISSING = "JobSetCRDMissing"
    TRAINJOB_CRD_MISSING = "TrainJobCRDMissing"
    TRAINING_RUNTIME_MISSING = "TrainingRuntimeMissing"
    MAX_RESTARTS_NOT_THE_RUNTIMES = "MaxRestartsNotTheRuntimes"
    CHECKPOINT_PVC_MISSING = "CheckpointPVCMissing"
    REWARD_CONFIG_MAP_MISSING = "RewardConfigMapMissing"
    # A pod the kubelet keeps from starting: the kubelet's own reason, passed on (status_update.STUCK_REASONS).
    ERR_IMAGE_PULL = "ErrImagePull"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    INVALID_IMAGE_NAME = "InvalidImageName"
    ERR_IMAGE_NEVER_PULL = "ErrImageNeverPull"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    # What the training did.
    WATCHDOG_RESTART = "WatchdogRestart"
    RESULT_OUT_OF_RANGE = "ResultOutOfRange"
    EVALUATION_FAILED = "EvaluationFailed"
    PREEMPTION_SAVE = "PreemptionSave"  # Normal
    # A source that could not be fetched, or an export that failed (atlas_contract.sources.REASONS), and the
    # export's other failures.
    ACCESS_DENIED = "AccessDenied"
    NOT_FOUND = "NotFound"
    UNREACHABLE = "Unreachable"
    EXPORT_FAILED = "ExportFailed"
    TRACKING_UNREACHABLE = "TrackingUnreachable"  # the MLflow server does not answer the trainer (training goes on)
    # What the operator changed (Normal).
    JOB_RECREATED = "JobRecreated"
    QUEUED_RUN_SUSPENDED = "QueuedRunSuspended"
    BACKEND_CHANGED = "BackendChanged"
    SERVER_REMOVED = "ServerRemoved"
    NETWORK_POLICY_OFF = "NetworkPolicyOff"


@dataclass
class Condition:
    """Kubernetes-style condition."""

    type: str = spec_field(
        ", ".join(ConditionType) + " (see ConditionType in atlas_operator/run_status.py)",
        required=True,
        enum=tuple(str(t) for t in ConditionType),
    )
    status: str = spec_field("True, False or Unknown", required=True, enum=("True", "False", "Unknown"))
    reason: str | None = spec_field("CamelCase reason")
    message: str | None = spec_field("what happened, for people")
    last_transition_time: str | None = spec_field("when status last changed (RFC 3339)")
    observed_generation: int | None = spec_field("metadata.generation this condition was computed from")


@dataclass
class Progress:
    """Mirrored from the trainer's metrics endpoint; a metric the trainer does not export is left out."""

    step: int | None = spec_field("global optimizer step (atlas_training_step)")
    reward: float | None = spec_field("mean reward of the last logged step (atlas_training_reward)")
    kl: float | None = spec_field("KL to the reference model (atlas_training_kl; absent when beta is 0)")
    updated_at: str | None = spec_field("when these values were read (RFC 3339)")


@dataclass
class Children:
    """Names of the objects the run owns."""

    pytorch_job: str | None = spec_field("PyTorchJob (kubeflow.org/v1; backend PyTorchJob)")
    job_set: str | None = spec_field(
        "JobSet (jobset.x-k8s.io/v1alpha2; backend JobSet): the trainer and the servers, one gang"
    )
    train_job: str | None = spec_field(
        "TrainJob (trainer.kubeflow.org/v1alpha1; backend TrainJob): the trainer, on the chart's ClusterTrainingRuntime"
    )
    rollout: str | None = spec_field("rollout Deployment and Service (backends PyTorchJob and TrainJob)")
    student: str | None = spec_field(
        "student Deployment and Service (vllm serve; AtlasTeacher, backends PyTorchJob and TrainJob)"
    )
    config_map: str | None = spec_field("ConfigMap with run.yaml, accelerate.yaml, reward.yaml")
    metrics_service: str | None = spec_field("Service in front of the trainer's metrics endpoint (rank 0)")
    network_policy: str | None = spec_field(
        "NetworkPolicy: the run's pods accept traffic only from its trainer pods (operator setting network_policy)"
    )
    trainer_network_policy: str | None = spec_field(
        "NetworkPolicy: the trainer pods also accept the rollout server's weight sync, and metrics scrapes from "
        "the operator and the monitoring namespace"
    )


def _result_range(key: str) -> dict[str, Any]:
    """A result value's bounds (atlas_contract.results.RESULT_RANGES) as schema keywords."""
    low, high = RESULT_RANGES[key]
    return {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}


#: ``status.children`` keys: the fields of :class:`Children`, as the CRD names them.
CHILD_KEYS = frozenset(camel(field.name) for field in dataclasses.fields(Children))


@dataclass
class EvaluationResult:
    """Summary of the evaluation after training (the run's <checkpoint.path>/<name>/evaluation/eval.json has
    every figure)."""

    problems: int | None = spec_field("problems evaluated", **_result_range("problems"))
    student_accuracy: float | None = spec_field(
        "accuracy of the student alone (0-1)", **_result_range("studentAccuracy")
    )
    guided_accuracy: float | None = spec_field(
        "accuracy of the student with the teacher's guidance (0-1)", **_result_range("guidedAccuracy")
    )
    accuracy_delta: float | None = spec_field("guidedAccuracy - studentAccuracy", **_result_range("accuracyDelta"))
    accuracy_delta_low: float | None = spec_field(
        "lower end of the delta's paired-bootstrap 95% interval", **_result_range("accuracyDeltaLow")
    )
    accuracy_delta_high: float | None = spec_field(
        "upper end of the delta's paired-bootstrap 95% interval", **_result_range("accuracyDeltaHigh")
    )
    non_degradation_rate: float | None = spec_field(
        "share of problems where guidance did not make the student worse", **_result_range("nonDegradationRate")
    )
    guidance_tokens_mean: float | None = spec_field(
        "mean tokens of the teacher's guidance", **_result_range("guidanceTokensMean")
    )


@dataclass
class RunResult:
    """What the finished trainer reported (the Master container's termination message)."""

    step: int | None = spec_field("last global optimizer step", **_result_range("step"))
    reward: float | None = spec_field("mean reward of the last logged step")
    kl: float | None = spec_field("KL to the reference model at the last logged step (absent when beta is 0)")
    evaluation: EvaluationResult | None = spec_field("the evaluation after training (AtlasTeacher spec.evaluation)")
    evaluation_error: str | None = spec_field(
        "why the evaluation after training failed, in one line (the trained run still succeeded; a Warning Event "
        "EvaluationFailed says the same)"
    )


@dataclass
class Output:
    """Where the trained model was exported (spec.output), as the trainer reported it: whole, its manifest last."""

    uri: str | None = spec_field("spec.output.uri")
    files: int | None = spec_field(
        "files exported: the model's and its card README.md (atlas-manifest.json beside them lists them)", minimum=0
    )
    bytes: int | None = spec_field("bytes exported", minimum=0)


@dataclass
class Tracking:
    """The tracking run the trainer logs to (spec.tracking.mlflow): one for the run, across every resume."""

    run_id: str | None = spec_field("the MLflow run's id", max_length=1024)
    url: str | None = spec_field("its page in the MLflow UI", max_length=1024)


@dataclass
class Preemption:
    """The trainer's saves on SIGTERM (Kueue preemption, a node drain, a spot reclaim): every rank finished the step in
    flight and saved a checkpoint at it (each trainer node's stop report, its termination message)."""

    saves: int | None = spec_field("saves on SIGTERM so far, one per step saved", minimum=0)
    step: int | None = spec_field("the step of the last one (its checkpoint: checkpoint-<step>)", minimum=0)
    seconds: float | None = spec_field("from SIGTERM to the saved checkpoint, the last time", minimum=0)
    time: str | None = spec_field("when the last one's trainer container ended (RFC 3339)")


@dataclass
class RunStatus:
    """Observed state of the run."""

    phase: str | None = spec_field(
        "follows the job (the PyTorchJob's last condition; the JobSet's conditions and terminalState); Queued = "
        "Kueue has not admitted the job (spec.queueName), or suspended it again after it ran (Training reason "
        "Preempted: it resumes from its newest checkpoint when readmitted); Invalid = rejected spec",
        enum=PHASES,
    )
    observed_generation: int | None = spec_field("metadata.generation last reconciled")
    conditions: list[Condition] = spec_field("latest observations", [])
    progress: Progress | None = spec_field("training progress")
    children: Children | None = spec_field("owned objects")
    restarts: int | None = spec_field("whole-gang restarts so far (the JobSet's status.restarts; backend JobSet)")
    preemption: Preemption | None = spec_field("the trainer's checkpoint saves on SIGTERM (absent: none yet)")
    result: RunResult | None = spec_field(
        "read from the finished rank-0 trainer pod's termination message once the job has succeeded"
    )
    output: Output | None = spec_field("the export of the trained model (spec.output; condition Exported)")
    tracking: Tracking | None = spec_field(
        "the tracking run (spec.tracking.mlflow; condition Tracking), as the trainer reported it"
    )
    kopf: dict[str, Any] = spec_field("the operator framework's bookkeeping (last handled spec, handler progress)", {})
