"""Pure functions from a parsed run to the Kubernetes objects the operator owns.

No API calls here: ``render_children(run, images)`` returns plain dicts in the order they are
applied (ConfigMap, Services, then the backend's workload last so its pods find everything they
mount and call: server Deployments and the PyTorchJob, or one JobSet). ``atlas render`` prints
exactly these.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import yaml

from atlas_contract import defaults
from atlas_contract.names import (
    ACCELERATE_CONFIG_FILE,
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    ENV_KIND,
    ENV_NAMESPACE,
    ENV_RESULT_FILE,
    ENV_RUN,
    ENV_RUN_UID,
    JOBSET_TRAINER_CONTAINER,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    MANAGED_BY,
    OPERATOR_POD_LABELS,
    QUEUE_NAME_LABEL,
    RENDEZVOUS_PORT,
    REWARD_CONFIG_FILE,
    ROLLOUT_VLLM_VERSION,
    RUN_CONFIG_FILE,
    SPEC_HASH_ANNOTATION,
    TERMINATION_MESSAGE_PATH,
    TRAINER_METRICS_PORT,
    VLLM_PORT,
    WATCHDOG_EXIT_CODE,
    WATCHDOG_MARK,
    WEIGHT_SYNC_PORT,
    ChildNames,
)
from atlas_operator.presets import accelerate_config
from atlas_operator.schema import camel
from atlas_operator.spec import AtlasTeacherSpec, RolloutSpec, Run, TrainingSpec, reward_funcs
from atlas_operator.status import WATCHDOG_RESTART_RULE

REWARD_REF_DIR = "/etc/atlas-reward"  # a second ConfigMap volume cannot nest inside the first
CACHE_DIR = "/var/cache/atlas"
RUN_AS_USER = 65532  # the trainer image's `atlas` user (trainer_image/Dockerfile)
NCCL_ENV = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
TRAINER_CONTAINER = "pytorch"  # the name Kubeflow's PyTorchJob controller looks for
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# Set by the Job controller on each pod of an Indexed Job (label and annotation): the JobSet trainer's node rank.
COMPLETION_INDEX_KEY = "batch.kubernetes.io/job-completion-index"


@dataclass(frozen=True)
class Images:
    """Operator-wide defaults (flags/env of ``atlas operator``); a run's spec.image wins."""

    trainer: str = "ghcr.io/arc-computer/atlas-trainer:0.1.0"
    rollout: str = "ghcr.io/arc-computer/atlas-trainer:0.1.0"  # the trainer image carries vLLM


@dataclass(frozen=True)
class NetworkSettings:
    """Operator-wide: whether runs get NetworkPolicies, and who may read the trainers' metrics besides the run."""

    enabled: bool = True
    # The operator's namespace (its pod, labelled OPERATOR_POD_LABELS, scrapes the trainers); None: not in a cluster.
    operator_namespace: str | None = None
    # Every pod of this namespace may scrape the trainers' metrics port (Prometheus); None: no namespace.
    monitoring_namespace: str | None = "monitoring"


def has_student_server(run: Run) -> bool:
    return isinstance(run.spec, AtlasTeacherSpec) and bool(run.spec.student and run.spec.student.rollout.replicas)


def on_jobset(run: Run) -> bool:
    return run.backend == "JobSet"


def trainer_container(run: Run) -> str:
    """The trainer container's name: the one Kubeflow requires, or ``trainer`` in a JobSet."""
    return JOBSET_TRAINER_CONTAINER if on_jobset(run) else TRAINER_CONTAINER


def child_names(run: Run, network: bool = True) -> dict[str, str]:
    """status.children: the names of what the run owns (rollout/student only when they exist, the NetworkPolicies
    when ``network``)."""
    owned = ChildNames(run.name)
    policies = (
        {"networkPolicy": owned.network_policy, "trainerNetworkPolicy": owned.trainer_network_policy} if network else {}
    )
    if on_jobset(run):  # the servers are replicated jobs of the JobSet, not objects of their own
        return {"jobSet": owned.jobset, "configMap": owned.config_map, "metricsService": owned.metrics, **policies}
    names = {"pytorchJob": owned.job, "configMap": owned.config_map, "metricsService": owned.metrics, **policies}
    if run.spec.rollout.replicas:
        names["rollout"] = owned.rollout
    if has_student_server(run):
        names["student"] = owned.student
    return names


def labels(run: Run, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "atlas",
        LABEL_INSTANCE: run.name,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: MANAGED_BY,
    }


def _queued(run: Run, pod_labels: dict[str, str]) -> dict[str, str]:
    """Server pods of a queued PyTorchJob run: Kueue admits each pod on its own (not with the job's gang)."""
    if run.spec.queue_name:
        pod_labels[QUEUE_NAME_LABEL] = run.spec.queue_name
    return pod_labels


def _selector(run: Run, component: str) -> dict[str, str]:
    return {LABEL_INSTANCE: run.name, LABEL_COMPONENT: component}


def _metadata(run: Run, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": run.namespace, "labels": labels(run, component)}


# --------------------------------------------------------------------------- run configuration


def output_dir(run: Run) -> str:
    return f"{run.spec.checkpoint.path.rstrip('/')}/{run.name}"


def checkpoint_warning(run: Run) -> str | None:
    """Why restarts cannot resume, or None. Without spec.checkpoint.pvc every trainer pod writes to its own
    emptyDir: on PyTorchJob rank 0 alone writes the trainer state, so a multi-node run cannot resume (one node
    restarts in place and keeps it); on JobSet every restart makes new pods."""
    nodes = run.spec.resources.nodes
    if run.spec.checkpoint.pvc:
        return None
    if on_jobset(run):
        return (
            "spec.checkpoint.pvc: not set, so the trainer keeps its checkpoints on its pods' emptyDir, and a JobSet "
            "restart (spec.maxRestarts) replaces every pod: training starts again from step 0; set "
            "spec.checkpoint.pvc to a PersistentVolumeClaim (ReadWriteMany when nodes > 1)"
        )
    if nodes < 2:
        return None
    return (
        f"spec.checkpoint.pvc: not set, so each of the {nodes} trainer pods keeps its checkpoints on its own "
        "emptyDir and a restart cannot resume (every rank stops and says why); set spec.checkpoint.pvc to a "
        "ReadWriteMany PersistentVolumeClaim that every node shares"
    )


def _server_host(run: Run, component: str) -> str:
    """A server's address from the trainer pods: its Service, or (JobSet) its pod's stable hostname."""
    owned = ChildNames(run.name)
    return owned.host(component) if on_jobset(run) else f"{getattr(owned, component)}.{run.namespace}.svc"


def student_endpoint(run: Run) -> str:
    return f"http://{_server_host(run, 'student')}:{VLLM_PORT}/v1"


def rollout_endpoint(run: Run) -> str:
    return f"http://{_server_host(run, 'rollout')}:{VLLM_PORT}"


def run_config(run: Run) -> dict[str, Any]:
    """The run configuration the trainer pods load (`atlas_core.cli.train recipe=run.yaml`)."""
    spec = run.spec
    trainer = {**defaults.training_defaults(spec.algorithm), **training_fields(spec.training)}
    trainer.update(
        save_strategy="steps",
        save_steps=spec.checkpoint.save_steps,
        metrics_port=TRAINER_METRICS_PORT,
        metrics_host="0.0.0.0",  # scraped by Prometheus and the operator through <name>-metrics
        report_to=[],
    )
    if spec.resources.gpus_per_node == 0:
        trainer["bf16"] = False
    else:
        trainer.setdefault("bf16", True)
    trainer.update(rollout_fields(run))
    config: dict[str, Any] = {
        "algorithm": spec.algorithm,
        "model": spec.model,
        "run_name": run.name,
        "output_dir": output_dir(run),
        "resume": "auto",  # one decision for all ranks (atlas_core.training.resume)
        "dataset": {"source": spec.dataset.source, "split": spec.dataset.split},
        "reward": {"funcs": reward_funcs(run), "config": reward_config_path(run), "weights": spec.reward.weights},
        "trainer": trainer,
    }
    if isinstance(spec, AtlasTeacherSpec) and spec.student:
        config["student"] = student_endpoint(run) if spec.student.rollout.replicas else spec.student.model
        trainer.update(vars(spec.teaching))
    evaluation = evaluation_config(run)
    if evaluation is not None:
        config["evaluation"] = evaluation
    return config


def rollout_fields(run: Run) -> dict[str, Any]:
    """The trainer's vLLM settings for spec.rollout: a server to call (mode server), vLLM in every trainer process
    (mode colocate), or none (the trainer generates)."""
    rollout = run.spec.rollout
    if run.spec.algorithm == "sft":
        return {}
    if rollout.mode == "colocate":
        fields = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": rollout.gpu_memory_utilization,
            "vllm_tensor_parallel_size": rollout.tensor_parallel_size,
            "vllm_enable_sleep_mode": bool(rollout.enable_sleep_mode),
        }
        if rollout.max_model_len is not None:
            fields["vllm_max_model_length"] = rollout.max_model_len
        return fields
    if not rollout.replicas:
        return {}
    return {
        "use_vllm": True,
        "vllm_mode": "server",
        "vllm_server_base_url": rollout_endpoint(run),
        "vllm_group_port": WEIGHT_SYNC_PORT,
    }


def evaluation_config(run: Run) -> dict[str, Any] | None:
    """run.yaml's ``evaluation`` (AtlasTeacher spec.evaluation; None when unset): what the trainer's Master
    evaluates after training. The source is passed as spec.dataset.source is (the trainer resolves both alike)."""
    evaluation = getattr(run.spec, "evaluation", None)
    if evaluation is None:
        return None
    config: dict[str, Any] = {
        "dataset": {
            "source": evaluation.dataset.source or run.spec.dataset.source,
            "split": evaluation.dataset.split,
        },
        "samples": evaluation.samples,
    }
    if evaluation.limit is not None:
        config["limit"] = evaluation.limit
    return config


def training_fields(training: TrainingSpec) -> dict[str, Any]:
    """spec.training (camelCase fields that are set, plus extra) → trainer kwargs (snake_case)."""
    fields = {name: value for name, value in vars(training).items() if name != "extra" and value is not None}
    fields.update(training.extra)
    return fields


def reward_config_path(run: Run) -> str | None:
    if run.spec.reward.config_map_ref:
        return f"{REWARD_REF_DIR}/{run.spec.reward.config_map_ref.key}"
    if run.spec.reward.config:
        return f"{CONFIG_DIR}/{REWARD_CONFIG_FILE}"
    return None


def config_map(run: Run, reward_yaml: str | None = None) -> dict[str, Any]:
    """``<name>-config``: the run configuration, the Accelerate config and (named RIM config) the reward config.

    ``reward_yaml`` is the text of ``reward_system/<spec.reward.config>.yaml`` (read by the caller, so
    this stays pure)."""
    res = run.spec.resources
    mixed = "no" if res.gpus_per_node == 0 or run.spec.training.bf16 is False else "bf16"
    accelerate = accelerate_config(
        run.spec.deepspeed, num_machines=res.nodes, num_processes=res.nodes * res.processes(), mixed_precision=mixed
    )
    data = {
        RUN_CONFIG_FILE: _yaml_text(run_config(run), f"Run configuration of {run.kind} {run.namespace}/{run.name}"),
        ACCELERATE_CONFIG_FILE: _yaml_text(accelerate, f"Accelerate config: DeepSpeed preset {run.spec.deepspeed}"),
    }
    if run.spec.reward.config and reward_yaml is not None:
        data[REWARD_CONFIG_FILE] = reward_yaml
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(run, ChildNames(run.name).config_map, "trainer"),
        "data": data,
    }


# libyaml's emitter when PyYAML has it: the ConfigMap is rendered on every reconciliation.
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _yaml_text(document: dict[str, Any], title: str) -> str:
    text = yaml.dump(document, Dumper=_DUMPER, sort_keys=False)
    return f"# {title} (rendered by atlas-operator; edit the run, not this file)\n" + text


# --------------------------------------------------------------------------- PyTorchJob


def launch_command(run: Run) -> list[str]:
    """The trainer container's command, the same on both backends: accelerate on every node with the topology
    Kubeflow injects (PET_NNODES, PET_NODE_RANK = node index, PET_NPROC_PER_NODE, MASTER_ADDR, MASTER_PORT), or
    that a JobSet's trainer gets from :func:`jobset_topology_env`.

    The launcher's exit code is torch elastic's (1 for any failed worker), so a worker the step watchdog ended
    would look like any crash: when the watchdog's reason is in the termination message, the container exits
    with WATCHDOG_EXIT_CODE instead (what a JobSet's podFailurePolicy and `kubectl describe` see). The launcher
    runs in the background so that SIGTERM (pod deletion) is passed on to it."""
    launch = (
        "accelerate launch"
        f" --config_file {CONFIG_DIR}/{ACCELERATE_CONFIG_FILE}"
        ' --num_machines "$PET_NNODES" --machine_rank "$PET_NODE_RANK"'
        ' --num_processes "$((PET_NNODES * PET_NPROC_PER_NODE))"'
        ' --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
        f" -m atlas_core.cli.train recipe={CONFIG_DIR}/{RUN_CONFIG_FILE}"
    )
    script = f"""set -u
{launch} &
launcher=$!
trap 'kill -TERM "$launcher" 2>/dev/null' TERM INT
while true; do
  code=0
  wait "$launcher" || code=$?
  kill -0 "$launcher" 2>/dev/null || break  # still running: a signal interrupted the wait
done
if [ "$code" -ne 0 ] && grep -qs '^{WATCHDOG_MARK}' "${ENV_RESULT_FILE}"; then
  exit {WATCHDOG_EXIT_CODE}
fi
exit "$code"
"""
    return ["/bin/bash", "-c", script]


def _env(run: Run) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_RUN, "value": run.name},
        {"name": ENV_KIND, "value": run.kind},
        # Checkpoints record the run that wrote them: a re-created run of the same name never resumes them.
        *([{"name": ENV_RUN_UID, "value": run.uid}] if run.uid else []),
        # Rank 0 writes the run's result there; Kubernetes hands it to the operator as the termination message.
        {"name": ENV_RESULT_FILE, "value": TERMINATION_MESSAGE_PATH},
        {"name": "HF_HOME", "value": f"{run.spec.checkpoint.path.rstrip('/')}/.cache/huggingface"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    env += [{"name": k, "value": v} for k, v in NCCL_ENV.items()]
    own = {e["name"] for e in env}
    for var in run.spec.env:  # the user's values win over ours
        entry = {"name": var.name}
        if var.value_from is not None:
            entry["valueFrom"] = var.value_from
        else:
            entry["value"] = var.value or ""
        if var.name in own:
            env = [e for e in env if e["name"] != var.name]
        env.append(entry)
    return env


def _resources(gpus: int, cpu: str | None, memory: str | None) -> dict[str, Any]:
    amounts: dict[str, Any] = {}
    if cpu:
        amounts["cpu"] = cpu
    if memory:
        amounts["memory"] = memory
    limits = dict(amounts)
    if gpus:
        limits["nvidia.com/gpu"] = gpus
    resources: dict[str, Any] = {}
    if amounts:
        resources["requests"] = amounts
    if limits:
        resources["limits"] = limits
    return resources


def _placement(run: Run) -> dict[str, Any]:
    spec = run.spec
    # No API token in pods that never call the API (they run third-party model code), unless asked for.
    placement: dict[str, Any] = {"automountServiceAccountToken": spec.automount_service_account_token}
    if spec.service_account_name:
        placement["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        placement["imagePullSecrets"] = [{"name": ref.name} for ref in spec.image_pull_secrets]
    if spec.resources.node_selector:
        placement["nodeSelector"] = dict(spec.resources.node_selector)
    if spec.resources.tolerations:
        placement["tolerations"] = [_toleration(t) for t in spec.resources.tolerations]
    return placement


def _toleration(toleration) -> dict[str, Any]:
    return {camel(k): v for k, v in vars(toleration).items() if v is not None}


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def jobset_topology_env(run: Run) -> list[dict[str, Any]]:
    """What Kubeflow injects into PyTorchJob pods, for the JobSet trainer: the node rank is the pod's completion
    index (Indexed Job), the master the first trainer pod's stable hostname."""
    res = run.spec.resources
    return [
        {"name": "PET_NNODES", "value": str(res.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(res.processes())},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_KEY}']"}},
        },
        {"name": "MASTER_ADDR", "value": ChildNames(run.name).host("trainer")},
        {"name": "MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
    ]


def trainer_pod_template(run: Run, image: str) -> dict[str, Any]:
    spec = run.spec
    res, checkpoint = spec.resources, spec.checkpoint
    mounts = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "checkpoints", "mountPath": checkpoint.path},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": ChildNames(run.name).config_map}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": res.shm_size}},
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint.pvc}}
        if checkpoint.pvc
        else {"name": "checkpoints", "emptyDir": {}},
    ]
    if spec.reward.config_map_ref:
        mounts.append({"name": "reward-config", "mountPath": REWARD_REF_DIR, "readOnly": True})
        volumes.append({"name": "reward-config", "configMap": {"name": spec.reward.config_map_ref.name}})
    container = {
        "name": trainer_container(run),
        "image": image,
        "command": launch_command(run),
        "env": (jobset_topology_env(run) if on_jobset(run) else []) + _env(run),
        "ports": [
            {
                "name": "rendezvous" if on_jobset(run) else "pytorchjob-port",
                "containerPort": RENDEZVOUS_PORT,
                "protocol": "TCP",
            },
            {"name": "metrics", "containerPort": TRAINER_METRICS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": mounts,
        "securityContext": dict(_CONTAINER_SECURITY),
        # The finished Master's result (atlas_contract.results) reaches .status.result through this file: only
        # the file counts (never a log tail, which would not parse as a result anyway).
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    resources = _resources(res.gpus_per_node, res.cpu, res.memory)
    if resources:
        container["resources"] = resources
    return {
        "metadata": {"labels": labels(run, "trainer")},
        "spec": {**_placement(run), "securityContext": _pod_security(), "containers": [container], "volumes": volumes},
    }


def _configured_trainer_template(run: Run, images: Images, config: dict[str, Any] | None) -> dict[str, Any]:
    """The trainer pod template; ``config`` is the run's ConfigMap: its checksum in the template makes a
    configuration change a spec change (the trainer reads run.yaml once, at start)."""
    template = trainer_pod_template(run, run.spec.image or images.trainer)
    if config is not None:
        checksum = hashlib.sha256(json.dumps(config["data"], sort_keys=True).encode()).hexdigest()[:16]
        template["metadata"]["annotations"] = {CONFIG_HASH_ANNOTATION: checksum}
    return template


def pytorch_job(run: Run, images: Images, config: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = run.spec
    template = _configured_trainer_template(run, images, config)
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": template}}
    if spec.resources.nodes > 1:
        replicas["Worker"] = {"replicas": spec.resources.nodes - 1, "restartPolicy": "OnFailure", "template": template}
    job_spec = {
        "nprocPerNode": str(spec.resources.processes()),
        # With a queue, Kueue owns suspend: the job is created suspended and only Kueue resumes it.
        "runPolicy": {
            "cleanPodPolicy": "None",
            "backoffLimit": spec.max_restarts,
            "suspend": spec.suspend or bool(spec.queue_name),
        },
        "pytorchReplicaSpecs": replicas,
    }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _metadata(run, run.name, "trainer"),
        "spec": job_spec,
    }
    if spec.queue_name:
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job


def job_spec_hash(job: dict[str, Any]) -> str:
    """Identity of what a running job's pods were made from: everything but the suspend flag (PyTorchJob
    runPolicy.suspend, JobSet spec.suspend), which the job's controller applies in place; and its Kueue queue (a
    label Kueue refuses to change on a job it admitted: a queue change is a new job)."""
    spec = json.loads(json.dumps(job["spec"]))
    spec.get("runPolicy", {}).pop("suspend", None)
    if job["kind"] == "JobSet":
        spec.pop("suspend", None)
    identity = {"spec": spec, "queue": job["metadata"].get("labels", {}).get(QUEUE_NAME_LABEL)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- vLLM servers


def _vllm_pod_template(
    run: Run,
    component: str,
    rollout: RolloutSpec,
    image: str,
    command: list[str],
    args: list[str],
    probe_path: str,
    ports: list[dict[str, Any]],
) -> dict[str, Any]:
    """A vLLM server's pod template: a Deployment's (PyTorchJob backend) or a replicated job's (JobSet)."""
    container = {
        "name": "vllm",
        "image": image,
        "command": command,
        "args": args,
        "env": [{"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"}, {"name": "HOME", "value": CACHE_DIR}],
        "ports": ports,
        # Loading weights takes minutes: the startup probe allows 20 of them before liveness applies.
        "startupProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 10, "failureThreshold": 120},
        "readinessProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 30, "failureThreshold": 5},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": "cache", "mountPath": CACHE_DIR}],
        "securityContext": dict(_CONTAINER_SECURITY),
    }
    resources = _resources(rollout.gpus, rollout.cpu, rollout.memory)
    if resources:
        container["resources"] = resources
    pod_labels = labels(run, component)
    return {
        "metadata": {"labels": pod_labels if on_jobset(run) else _queued(run, pod_labels)},
        "spec": {
            **_placement(run),
            "securityContext": _pod_security(),
            "containers": [container],
            "volumes": [
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": run.spec.resources.shm_size}},
                {"name": "cache", "emptyDir": {}},
            ],
        },
    }


def _vllm_deployment(run: Run, component: str, rollout: RolloutSpec, template: dict[str, Any]) -> dict[str, Any]:
    name = getattr(ChildNames(run.name), component)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(run, name, component),
        "spec": {
            "replicas": 0 if run.spec.suspend else rollout.replicas,
            "selector": {"matchLabels": _selector(run, component)},
            "strategy": {"type": "Recreate"},  # GPUs: never two generations of servers at once
            "template": template,
        },
    }


def _server_args(rollout: RolloutSpec) -> list[str]:
    args = [
        "--tensor-parallel-size",
        str(rollout.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(rollout.gpu_memory_utilization),
    ]
    if rollout.max_model_len is not None:
        args += ["--max-model-len", str(rollout.max_model_len)]
    return args


def rollout_server_command(run: Run) -> list[str]:
    """The rollout server's command: what TRL 1.16 itself runs (``trl vllm-serve`` is deprecated and only execs
    this; ``trl/scripts/vllm_serve.py`` ``build_command``): plain ``vllm serve`` with the NCCL weight-transfer
    engine (the trainer pushes its weights over WEIGHT_SYNC_PORT) and processed logprobs, in dev mode
    (VLLM_SERVER_DEV_MODE=1, set in its env)."""
    rollout = run.spec.rollout
    command = [
        "vllm",
        "serve",
        run.spec.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(rollout.tensor_parallel_size),
        "--data-parallel-size",
        str(rollout.gpus // rollout.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(rollout.gpu_memory_utilization),
        "--dtype",
        "auto",
        "--kv-cache-dtype",
        "auto",
        "--model-impl",
        "vllm",
        "--uvicorn-log-level",
        "info",
    ]
    if rollout.max_model_len is not None:
        command += ["--max-model-len", str(rollout.max_model_len)]
    if run.spec.training.trust_remote_code:  # off unless the run asks: the server loads the trainer's model
        command += ["--trust-remote-code"]
    if _version(ROLLOUT_VLLM_VERSION) >= (0, 30, 0):  # TRL adds it for vLLM 0.30.0 and later
        command += ["--enable-scale-out"]
    command += [
        "--weight-transfer-config",
        json.dumps({"backend": "nccl"}),
        "--logprobs-mode",
        "processed_logprobs",
        "--max-logprobs",
        "-1",
    ]
    return command + list(rollout.args)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def rollout_pod_template(run: Run, images: Images) -> dict[str, Any]:
    rollout = run.spec.rollout
    command = rollout_server_command(run)
    ports = [
        {"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"},
        {"name": "weight-sync", "containerPort": WEIGHT_SYNC_PORT, "protocol": "TCP"},
    ]
    image = rollout.image or images.rollout
    template = _vllm_pod_template(run, "rollout", rollout, image, command[:2], command[2:], "/health", ports)
    # The weight-transfer endpoints the trainer calls live behind vLLM's dev mode (as `trl vllm-serve` sets it).
    template["spec"]["containers"][0]["env"].append({"name": "VLLM_SERVER_DEV_MODE", "value": "1"})
    return template


def student_pod_template(run: Run, images: Images) -> dict[str, Any]:
    student = run.spec.student
    rollout = student.rollout
    args = [
        student.model,
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--served-model-name",
        student.model,
        *_server_args(rollout),
        *rollout.args,
    ]
    ports = [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}]
    image = rollout.image or images.rollout
    return _vllm_pod_template(run, "student", rollout, image, ["vllm", "serve"], args, "/health", ports)


def rollout_deployment(run: Run, images: Images) -> dict[str, Any]:
    return _vllm_deployment(run, "rollout", run.spec.rollout, rollout_pod_template(run, images))


def student_deployment(run: Run, images: Images) -> dict[str, Any]:
    return _vllm_deployment(run, "student", run.spec.student.rollout, student_pod_template(run, images))


# --------------------------------------------------------------------------- JobSet


def _one_pod_job(template: dict[str, Any], pods: int = 1) -> dict[str, Any]:
    """A replicated job's Job spec: ``pods`` pods (Indexed), none retried by the Job controller (restartPolicy
    Never, backoffLimit 0): a failed pod fails its Job at once, and the JobSet's failurePolicy restarts the
    whole gang. (The JobSet webhook would default restartPolicy to OnFailure: in-place restarts the JobSet
    never sees.)"""
    template = json.loads(json.dumps(template))
    template["spec"]["restartPolicy"] = "Never"
    return {
        "completionMode": "Indexed",
        "completions": pods,
        "parallelism": pods,
        "backoffLimit": 0,
        "template": template,
    }


def jobset(run: Run, images: Images, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run as one JobSet: replicated jobs ``rollout`` and (teacher) ``student``, one Job per server replica,
    then ``trainer`` (one Indexed Job, a pod per node), created once every server is Ready (``dependsOn``).
    The trainer's success completes the JobSet (its servers are then deleted); any pod's failure restarts
    every Job, up to spec.maxRestarts, and the trainer resumes from its newest checkpoint. With a queue,
    Kueue admits the whole set as one workload."""
    spec = run.spec
    replicated: list[dict[str, Any]] = []
    servers = []
    if spec.rollout.replicas:
        servers.append(("rollout", spec.rollout.replicas, rollout_pod_template(run, images)))
    if has_student_server(run):
        servers.append(("student", spec.student.rollout.replicas, student_pod_template(run, images)))
    for name, replicas, template in servers:
        replicated.append({"name": name, "replicas": replicas, "template": {"spec": _one_pod_job(template)}})
    trainer_job = _one_pod_job(_configured_trainer_template(run, images, config), spec.resources.nodes)
    # A trainer the step watchdog ended fails its Job with reason PodFailurePolicy, which the JobSet's
    # WATCHDOG_RESTART_RULE names in its RestartingJobSet condition: the operator counts those restarts.
    trainer_job["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": JOBSET_TRAINER_CONTAINER,
                    "operator": "In",
                    "values": [WATCHDOG_EXIT_CODE],
                },
            }
        ]
    }
    trainer = {"name": "trainer", "replicas": 1, "template": {"spec": trainer_job}}
    if servers:
        trainer["dependsOn"] = [{"name": name, "status": "Ready"} for name, _, _ in servers]
    replicated.append(trainer)
    job_spec = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": ["trainer"]},
        "failurePolicy": {
            "maxRestarts": spec.max_restarts,
            "restartStrategy": "Recreate",
            # Any other failure: the default action, RestartJobSet, too (reason DefaultFailurePolicy).
            "rules": [
                {
                    "name": WATCHDOG_RESTART_RULE,
                    "action": "RestartJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                    "targetReplicatedJobs": ["trainer"],
                }
            ],
        },
        # With a queue, Kueue owns suspend: the JobSet is created suspended and only Kueue resumes it.
        "suspend": spec.suspend or bool(spec.queue_name),
        "replicatedJobs": replicated,
    }
    job = {
        "apiVersion": JOBSET_API_VERSION,
        "kind": "JobSet",
        "metadata": _metadata(run, ChildNames(run.name).jobset, "trainer"),
        "spec": job_spec,
    }
    if spec.queue_name:  # on the JobSet only: Kueue makes the whole set one workload
        job["metadata"]["labels"][QUEUE_NAME_LABEL] = spec.queue_name
    job["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: job_spec_hash(job)}
    return job


def service(
    run: Run, name: str, component: str, ports: list[tuple[str, int]], selector: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(run, name, component),
        "spec": {
            "selector": selector or _selector(run, component),
            "ports": [
                {"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}
                for port_name, port in ports
            ],
        },
    }


def metrics_service(run: Run) -> dict[str, Any]:
    # Only rank 0 serves metrics: Kubeflow's Master pod (labelled with its replica type), or the JobSet trainer's
    # pod of completion index 0.
    rank0 = {COMPLETION_INDEX_KEY: "0"} if on_jobset(run) else {"training.kubeflow.org/replica-type": "master"}
    selector = {**_selector(run, "trainer"), **rank0}
    return service(run, ChildNames(run.name).metrics, "trainer", [("metrics", TRAINER_METRICS_PORT)], selector)


# --------------------------------------------------------------------------- NetworkPolicies


def _run_pods(run: Run, component: str | None = None) -> dict[str, Any]:
    """A selector of the run's pods (of one component): the managed-by label keeps another app's pods that share
    app.kubernetes.io/instance (a Helm release of the same name) out. Both backends' pods carry these labels."""
    selected = {LABEL_INSTANCE: run.name, LABEL_MANAGED_BY: MANAGED_BY}
    if component:
        selected[LABEL_COMPONENT] = component
    return {"matchLabels": selected}


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {"kubernetes.io/metadata.name": name}}  # set on every namespace by the API server


def _ingress_policy(run: Run, name: str, pods: dict[str, Any], rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(run, name, "trainer"),
        # Ingress only: trainers and servers still reach model hubs, judges and DNS.
        "spec": {"podSelector": pods, "policyTypes": ["Ingress"], "ingress": rules},
    }


def network_policies(run: Run, network: NetworkSettings) -> list[dict[str, Any]]:
    """``<name>-network``: every pod of the run accepts traffic only from the run's trainer pods (their rendezvous
    and collectives, and their calls to the servers: HTTP and the weight-sync NCCL group). ``<name>-network-trainer``:
    the trainer pods also accept the rollout server's side of that NCCL group (NCCL connects both ways, on ports of
    its own choosing) and, on the metrics port only, the operator and the monitoring namespace. Needs a CNI that
    enforces NetworkPolicy; kubelet probes come from the node, which such CNIs allow."""
    if not network.enabled:
        return []
    owned = ChildNames(run.name)
    trainer_rules = []
    if run.spec.rollout.replicas:  # a rollout server
        trainer_rules.append({"from": [{"podSelector": _run_pods(run, "rollout")}]})
    scrapers = []
    if network.operator_namespace:
        scrapers.append(
            {
                "namespaceSelector": _namespace(network.operator_namespace),
                "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)},
            }
        )
    if network.monitoring_namespace:
        scrapers.append({"namespaceSelector": _namespace(network.monitoring_namespace)})
    if scrapers:
        trainer_rules.append({"from": scrapers, "ports": [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}]})
    return [
        _ingress_policy(
            run, owned.network_policy, _run_pods(run), [{"from": [{"podSelector": _run_pods(run, "trainer")}]}]
        ),
        _ingress_policy(run, owned.trainer_network_policy, _run_pods(run, "trainer"), trainer_rules),
    ]


def render_children(
    run: Run, images: Images | None = None, reward_yaml: str | None = None, network: NetworkSettings | None = None
) -> list[dict[str, Any]]:
    """Every child of ``run``, in apply order: the NetworkPolicies first, so no pod of the run is ever unprotected."""
    images = images or Images()
    config = config_map(run, reward_yaml)
    policies = network_policies(run, network or NetworkSettings())
    if on_jobset(run):
        return [*policies, config, metrics_service(run), jobset(run, images, config)]
    owned = ChildNames(run.name)
    children = [*policies, config]
    if run.spec.rollout.replicas:
        children.append(
            service(run, owned.rollout, "rollout", [("http", VLLM_PORT), ("weight-sync", WEIGHT_SYNC_PORT)])
        )
    if has_student_server(run):
        children.append(service(run, owned.student, "student", [("http", VLLM_PORT)]))
    children.append(metrics_service(run))
    if run.spec.rollout.replicas:
        children.append(rollout_deployment(run, images))
    if has_student_server(run):
        children.append(student_deployment(run, images))
    children.append(pytorch_job(run, images, config))
    return children
