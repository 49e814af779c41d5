"""Names both halves rely on: the API, child objects, labels, ports, files and environment variables."""

from __future__ import annotations

from dataclasses import dataclass

# ------------------------------------------------------------------ the API (atlas.arc.computer/v1alpha1)
GROUP = "atlas.arc.computer"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KINDS = {"AtlasTraining": "atlastrainings", "AtlasTeacher": "atlasteachers"}
SHORT_NAMES = {"AtlasTraining": ["atr"], "AtlasTeacher": ["ateach"]}
PHASES = ("Pending", "Queued", "Running", "Succeeded", "Failed", "Suspended", "Invalid")
BACKENDS = ("PyTorchJob", "JobSet", "TrainJob")  # spec.backend; the operator's default is ATLAS_DEFAULT_BACKEND
ALGORITHMS = ("grpo", "sft", "teacher")  # run configuration `algorithm`; AtlasTeacher runs `teacher`

# ------------------------------------------------------------------ ports
TRAINER_METRICS_PORT = 9400  # rank 0's /metrics in a trainer pod (and `atlas demo` on 127.0.0.1)
OPERATOR_METRICS_PORT = 8080  # the operator's /metrics and /healthz
VLLM_PORT = 8000  # rollout and student servers (OpenAI API, /health)
WEIGHT_SYNC_PORT = 51216  # TRL's vllm_group_port: the NCCL group the trainer joins to push weights
# The vLLM in the trainer image (trainer_image/requirements.txt pins it; a test checks the pin and TRL's range):
# the rollout server's command is rendered for it.
ROLLOUT_VLLM_VERSION = "0.30.0"
RENDEZVOUS_PORT = 23456  # Kubeflow's default for the `pytorchjob-port` container port

# ------------------------------------------------------------------ files
CONFIG_DIR = "/etc/atlas"  # the run's ConfigMap, mounted in every trainer pod
RUN_CONFIG_FILE = "run.yaml"  # the run configuration (atlas_core.cli.train recipe=<CONFIG_DIR>/run.yaml)
ACCELERATE_CONFIG_FILE = "accelerate.yaml"
REWARD_CONFIG_FILE = "reward.yaml"  # a named RIM config, embedded in the ConfigMap
METRICS_LOG_FILE = "metrics.jsonl"  # one line per logged step, in the output folder
CHECKPOINT_PREFIX = "checkpoint-"  # <output_dir>/checkpoint-<step>, as transformers names them
# Where a checkpoint is written before it is complete (<output_dir>/.atlas-staging/checkpoint-<step>): renamed to
# <output_dir>/checkpoint-<step> once every rank has written its part, so a kill mid-save leaves none half-written.
CHECKPOINT_STAGING_DIR = ".atlas-staging"
REWARD_SYSTEM_DIR = "reward_system"  # bundled RIM configs: <name>.yaml
RUN_IDENTITY_FILE = "atlas_run.json"  # in each checkpoint: which run wrote it, with which settings
RUN_LOCK_FILE = ".atlas-run.lock"  # in the output folder: one run at a time
EVAL_DIR = "evaluation"  # in the output folder: the evaluation after training (eval.json, problems.jsonl)
EVAL_REPORT_FILE = "eval.json"  # every figure of an evaluation (atlas eval, evaluation after training)
EVAL_PROBLEMS_FILE = "problems.jsonl"  # one line per evaluated problem; an interrupted evaluation resumes from it
TERMINATION_MESSAGE_PATH = "/dev/termination-log"  # the trainer container's terminationMessagePath

# ------------------------------------------------------------------ exit codes
# A trainer process the step watchdog ended (no optimizer step within spec.training.stepTimeoutSeconds, or an
# unreachable server): EX_TEMPFAIL, "try again" — the job restarts it and it resumes from its checkpoint.
WATCHDOG_EXIT_CODE = 75
# How the watchdog's reason begins (its last stderr line, and the container's termination message): the trainer
# container's launch script exits with WATCHDOG_EXIT_CODE when the message has it.
WATCHDOG_MARK = "atlas watchdog:"
# A trainer that stopped on SIGTERM (Kueue preemption, a node drain, a spot reclaim) after saving a checkpoint at
# the step in flight (atlas_core.training.preemption): 128 + SIGTERM, what a process ended by SIGTERM reports.
# A stop, not a failure: the JobSet and TrainJob trainer Job's podFailurePolicy ignores it (the pod is recreated
# and resumes, no restart counted), and PyTorchJob's ExitCode policy would call it retryable.
STOP_EXIT_CODE = 143
# How the stop's report begins (each node's termination message): "atlas stop: SIGTERM: saved checkpoint-<N>
# (step <N>) in <s> s"; the launch script exits with STOP_EXIT_CODE when the message has it.
STOP_MARK = "atlas stop:"

# ------------------------------------------------------------------ environment of trainer pods
ENV_NAMESPACE = "ATLAS_NAMESPACE"  # metric label `namespace`
ENV_RUN = "ATLAS_RUN"  # metric label `run`
ENV_KIND = "ATLAS_KIND"  # metric label `kind`
ENV_REWARD_SYSTEM_DIR = "ATLAS_REWARD_SYSTEM_DIR"  # extra folder of named RIM configs
ENV_RUN_UID = "ATLAS_RUN_UID"  # metadata.uid of the cluster run: checkpoints of another run are never resumed
ENV_RESULT_FILE = "ATLAS_RESULT_FILE"  # where rank 0 writes the run's result (atlas_contract.results)
# spec.terminationGracePeriodSeconds of the trainer pods: the trainer warns when a step plus its save took longer.
ENV_TERMINATION_GRACE = "ATLAS_TERMINATION_GRACE_SECONDS"
# torch elastic's wait for its workers after it passes SIGTERM on, before SIGKILL (torch's default: 30 s): the
# trainer pod sets it to the grace period so that a save on SIGTERM is not cut short by the launcher.
ENV_TORCH_ELASTIC_SHUTDOWN_TIMEOUT = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"

# ------------------------------------------------------------------ labels and annotations
MANAGED_BY = "atlas-operator"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
CONFIG_HASH_ANNOTATION = f"{GROUP}/config-hash"
# On the children a running trainer or server is made from (job, Deployments, ConfigMap): the run revision they were
# rendered from, and by which operator (atlas_operator/revisions.py: they change only when the run's spec changed).
RUN_GENERATION_ANNOTATION = f"{GROUP}/run-generation"
RUN_SPEC_HASH_ANNOTATION = f"{GROUP}/run-spec-hash"
OPERATOR_VERSION_ANNOTATION = f"{GROUP}/operator-version"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"  # spec.queueName: the Kueue LocalQueue that admits the job
# The operator's own pod as the Helm chart labels it (whatever the release or nameOverride): the runs'
# NetworkPolicies let it read the trainers' metrics.
OPERATOR_POD_LABELS = {"app.kubernetes.io/part-of": "atlas", LABEL_COMPONENT: "operator"}
# Pod Security Standards: the namespace label that enforces a profile, and the profile every rendered pod meets.
POD_SECURITY_ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
POD_SECURITY_LEVEL = "restricted"


@dataclass(frozen=True)
class ChildNames:
    """The objects a run named ``run`` owns (docs/architecture.md, "Components")."""

    run: str

    @property
    def job(self) -> str:
        return self.run

    @property
    def config_map(self) -> str:
        return f"{self.run}-config"

    @property
    def metrics(self) -> str:
        return f"{self.run}-metrics"

    @property
    def rollout(self) -> str:
        return f"{self.run}-rollout"

    @property
    def student(self) -> str:
        return f"{self.run}-student"

    @property
    def network_policy(self) -> str:
        """The run's NetworkPolicy: its pods accept traffic only from the run's own trainer pods."""
        return f"{self.run}-network"

    @property
    def trainer_network_policy(self) -> str:
        """What the trainer pods accept besides their peers: the rollout server's weight sync, metrics scrapes."""
        return f"{self.run}-network-trainer"

    @property
    def jobset(self) -> str:
        """The JobSet of a run on the JobSet backend (it replaces the PyTorchJob and the server Deployments)."""
        return self.run

    def host(self, replicated_job: str, index: int = 0) -> str:
        """The stable DNS name of pod ``index`` of the JobSet's replicated job (one Job each): hostname
        ``<run>-<job>-0-<index>`` (the Job controller's, for Indexed Jobs) in the JobSet's headless Service
        ``<run>`` (network.subdomain unset: the JobSet's name)."""
        return f"{self.run}-{replicated_job}-0-{index}.{self.run}"

    @property
    def master_pod(self) -> str:
        """The PyTorchJob's Master pod, as the Kubeflow controller names it: its termination message is
        the run's result."""
        return f"{self.run}-master-0"


# The longest suffix above must still leave a valid Service name (a DNS label of 63 characters); NetworkPolicy
# names are DNS subdomains (253), so their longer suffixes do not limit it.
MAX_RUN_NAME = 63 - max(len(s) for s in ("-config", "-metrics", "-rollout", "-student"))

# JobSet backend: replicated jobs (also the pods' app.kubernetes.io/component) in dependency order.
JOBSET_REPLICATED_JOBS = ("rollout", "student", "trainer")
JOBSET_TRAINER_CONTAINER = "trainer"


# TrainJob backend (Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1): the TrainJob names a ClusterTrainingRuntime
# the Helm chart installs; the Trainer controller turns both into a JobSet named after the TrainJob whose trainer job
# and container are both called "node" (its torch plugin hard-codes the master <trainjob>-node-0-0.<trainjob>:29500).
TRAINJOB_RUNTIME = "atlas-grpo"  # the chart's ClusterTrainingRuntime (value trainJob.runtime.name)
TRAINJOB_TRAINER_JOB = "node"
TRAINJOB_TRAINER_CONTAINER = "node"
TRAINJOB_MASTER_PORT = 29500  # the Trainer's PET_MASTER_PORT (ContainerTrainerPort), not ours to choose
TRAINJOB_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # "trainer" marks the trainer's job
# runtimePatches are a map keyed by their manager, a domain-prefixed path (the Trainer's webhook); Kueue adds its own.
TRAINJOB_PATCH_MANAGER = f"{GROUP}/operator"
# The torch plugin's: a TrainJob whose trainer env sets one is refused by the Trainer's webhook.
TRAINJOB_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")


def max_jobset_run_name(nodes: int) -> int:
    """The longest run name the JobSet backend takes: JobSet names each trainer pod
    ``<run>-trainer-0-<index>-<5 random>``, and that must be a DNS label (63 characters)."""
    return 63 - len(f"-trainer-0-{max(nodes - 1, 0)}-abcde")


def max_trainjob_run_name(nodes: int) -> int:
    """The longest run name the TrainJob backend takes: the Trainer's JobSet names each trainer pod
    ``<run>-node-0-<index>-<5 random>``, and that must be a DNS label (63 characters)."""
    return 63 - len(f"-{TRAINJOB_TRAINER_JOB}-0-{max(nodes - 1, 0)}-abcde")
