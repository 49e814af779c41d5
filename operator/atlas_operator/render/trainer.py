"""The trainer's pod: its launch command, environment and template (every backend: what differs is its
:class:`TrainerShape`), and a job's identity hash."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atlas_contract import sources
from atlas_contract.names import (
    ACCELERATE_CONFIG_FILE,
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    ENV_KIND,
    ENV_NAMESPACE,
    ENV_RESULT_FILE,
    ENV_RUN,
    ENV_RUN_UID,
    ENV_TERMINATION_GRACE,
    ENV_TORCH_ELASTIC_SHUTDOWN_TIMEOUT,
    QUEUE_NAME_LABEL,
    RENDEZVOUS_PORT,
    RUN_CONFIG_FILE,
    STOP_EXIT_CODE,
    STOP_MARK,
    TERMINATION_MESSAGE_PATH,
    TRAINER_METRICS_PORT,
    WATCHDOG_EXIT_CODE,
    WATCHDOG_MARK,
    ChildNames,
)
from atlas_contract.results import EXPORT_ERROR_KEY
from atlas_operator.config import Images
from atlas_operator.render.config_map import output_dir
from atlas_operator.render.metadata import has_student_server, labels
from atlas_operator.render.pod_spec import (
    CONTAINER_SECURITY,
    NCCL_ENV,
    REWARD_REF_DIR,
    container_resources,
    pod_placement,
    pod_security,
)
from atlas_operator.render.sources import (
    claim_volumes,
    dataset_uris,
    initializer_command,
    model_uris,
    sources_dir,
    storage_env,
    trainer_fetches,
)
from atlas_operator.render.tracking import tracking_env
from atlas_operator.spec import Run


@dataclass(frozen=True)
class TrainerShape:
    """What a backend's controller asks of the trainer's pod: the container's name, the prefix of the rendezvous
    address's variables (``<master_env>_ADDR``, ``<master_env>_PORT``), the topology environment the controller does
    not inject itself, and the name of the rendezvous port (None: the controller adds its own)."""

    container: str
    master_env: str = "MASTER"
    topology_env: Callable[[Run], list[dict[str, Any]]] | None = None
    rendezvous_port: str | None = None


def launch_command(run: Run, master_env: str = "MASTER") -> list[str]:
    """The trainer container's command, the same on every backend: accelerate on every node with torch elastic's
    topology (PET_NNODES, PET_NODE_RANK = node index, PET_NPROC_PER_NODE, and the master at ``<master_env>_ADDR``
    and ``<master_env>_PORT``), as the backend's controller injects it or its :class:`TrainerShape`'s topology_env
    sets it.

    The launcher's exit code is torch elastic's (1 for any failed worker), so a worker the step watchdog ended
    would look like any crash: when the watchdog's reason is in the termination message, the container exits
    with WATCHDOG_EXIT_CODE instead (what a Job's podFailurePolicy and `kubectl describe` see). Likewise a
    trainer that stopped on SIGTERM after saving a checkpoint at the step in flight (its stop report, STOP_MARK,
    in the termination message) exits with STOP_EXIT_CODE, which a trainer Job's podFailurePolicy ignores
    (the backend's); and a trainer whose export failed (its result with ``exportError``) exits
    with SOURCES_EXIT_CODE, which the operator reads as Exported=False. The launcher runs in the background so that
    SIGTERM (pod deletion: Kueue preemption, a node drain, a spot reclaim) is passed on to it."""
    master = master_env
    launch = (
        "accelerate launch"
        f" --config_file {CONFIG_DIR}/{ACCELERATE_CONFIG_FILE}"
        ' --num_machines "$PET_NNODES" --machine_rank "$PET_NODE_RANK"'
        ' --num_processes "$((PET_NNODES * PET_NPROC_PER_NODE))"'
        f' --main_process_ip "${master}_ADDR" --main_process_port "${master}_PORT"'
        f" -m atlas_core.cli.train recipe={CONFIG_DIR}/{RUN_CONFIG_FILE}"
    )
    script = f"""set -u
{_export_retry_step(run)}{_fetch_step(run)}{launch} &
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
if [ "$code" -ne 0 ] && grep -qs '^{STOP_MARK}' "${ENV_RESULT_FILE}"; then
  exit {STOP_EXIT_CODE}
fi
if [ "$code" -ne 0 ] && grep -qs '"{EXPORT_ERROR_KEY}"' "${ENV_RESULT_FILE}"; then
  exit {sources.SOURCES_EXIT_CODE}
fi
exit "$code"
"""
    return ["/bin/bash", "-c", script]


def _export_retry_step(run: Run) -> str:
    """With spec.output: a restarted trainer pod whose run trained and evaluated but did not export (the pending
    file in the output folder, atlas_contract.sources.EXPORT_PENDING_FILE) retries the export alone on the first
    node, and the other nodes exit (atlas_core/cli/export.py): nothing trained again, no rank left waiting for a
    rendezvous its peers never join."""
    if run.spec.output is None:
        return ""
    pending = f"{output_dir(run)}/{sources.EXPORT_PENDING_FILE}"
    retry = f"python -m atlas_core.cli.export --config {CONFIG_DIR}/{RUN_CONFIG_FILE}"
    return f"""if [ -f {pending} ]; then
  if [ "${{PET_NODE_RANK:-0}}" = 0 ]; then {retry}; exit $?; fi
  exit 0
fi
"""


def _fetch_step(run: Run) -> str:
    """The trainer container's first step when the run has S3 or hub sources: the initializer
    (atlas_core/sources/initializer.py) fetches them into the run's cache, or skips what a pod before it fetched
    (whole: its manifest). A step of the trainer's own container rather than an init container, so that it is the
    same on every backend (a backend may not let the run add a container with its own command). A source that
    cannot be fetched ends the container with SOURCES_EXIT_CODE and ``{reason, uri, message}`` in the termination
    message, which the operator shows as SourcesReady=False."""
    if not trainer_fetches(run, has_student_server(run)):
        return ""
    command = " ".join(initializer_command(run))
    return f'{command} --message-file "${ENV_RESULT_FILE}" || exit $?\n'


def _env(run: Run) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_RUN, "value": run.name},
        {"name": ENV_KIND, "value": run.kind},
        # Checkpoints record the run that wrote them: a re-created run of the same name never resumes them.
        *([{"name": ENV_RUN_UID, "value": run.uid}] if run.uid else []),
        # Rank 0 writes the run's result there; Kubernetes hands it to the operator as the termination message.
        {"name": ENV_RESULT_FILE, "value": TERMINATION_MESSAGE_PATH},
        # SIGTERM: the trainer finishes the step in flight and saves within the pods' grace period (it warns when a
        # step plus its save took longer), and torch elastic's launcher waits that long for its workers before
        # SIGKILL (its default: 30 s).
        {"name": ENV_TERMINATION_GRACE, "value": str(run.spec.termination_grace_period_seconds)},
        {"name": ENV_TORCH_ELASTIC_SHUTDOWN_TIMEOUT, "value": str(run.spec.termination_grace_period_seconds)},
        {"name": "HF_HOME", "value": hf_home(run)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    env += [{"name": k, "value": v} for k, v in NCCL_ENV.items()]
    if _reads_sources(run):  # the fetched copies, and the store an export writes to
        env += [{"name": sources.ENV_SOURCES_DIR, "value": sources_dir(run)}, *storage_env(run)]
    env += tracking_env(run, output_dir(run))
    own = {e["name"] for e in env}
    for var in run.spec.env:  # the user's values win over ours
        entry: dict[str, Any] = {"name": var.name}
        if var.value_from is not None:
            entry["valueFrom"] = var.value_from
        else:
            entry["value"] = var.value or ""
        if var.name in own:
            env = [e for e in env if e["name"] != var.name]
        env.append(entry)
    return env


def hf_home(run: Run) -> str:
    return f"{run.spec.checkpoint.path.rstrip('/')}/.cache/huggingface"


def _trainer_uris(run: Run) -> list[str]:
    """The models and datasets the trainer pods load (the student only when no server holds it)."""
    models = model_uris(run)
    if has_student_server(run):
        models.pop("student", None)
    return [*models.values(), *dataset_uris(run)]


def _reads_sources(run: Run) -> bool:
    """Whether the trainer reads a fetched copy or a claim, or exports."""
    remote = any(sources.parse(uri).remote for uri in _trainer_uris(run))
    return remote or run.spec.output is not None


def _rendezvous_port(shape: TrainerShape) -> list[dict[str, Any]]:
    """The port the trainer pods rendezvous on, unless the backend's controller adds its own."""
    if shape.rendezvous_port is None:
        return []
    return [{"name": shape.rendezvous_port, "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"}]


def trainer_pod_template(run: Run, image: str, shape: TrainerShape) -> dict[str, Any]:
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
    output = spec.output.uri if spec.output else None
    claims, claim_mounts = claim_volumes(_trainer_uris(run), writable=output)
    volumes += claims
    mounts += claim_mounts
    container = {
        "name": shape.container,
        "image": image,
        "command": launch_command(run, shape.master_env),
        "env": (shape.topology_env(run) if shape.topology_env else []) + _env(run),
        "ports": [
            *_rendezvous_port(shape),
            {"name": "metrics", "containerPort": TRAINER_METRICS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
        # The finished Master's result (atlas_contract.results) reaches .status.result through this file: only
        # the file counts (never a log tail, which would not parse as a result anyway).
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "File",
    }
    resources = container_resources(res.gpus_per_node, res.cpu, res.memory)
    if resources:
        container["resources"] = resources
    return {
        "metadata": {"labels": labels(run, "trainer")},
        "spec": {
            **pod_placement(run),
            "securityContext": pod_security(),
            # Time to save a checkpoint at the step in flight on SIGTERM (Kueue preemption, a drain, a reclaim).
            "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
            "containers": [container],
            "volumes": volumes,
        },
    }


def configured_trainer_template(
    run: Run, images: Images, config: dict[str, Any] | None, shape: TrainerShape
) -> dict[str, Any]:
    """The trainer pod template; ``config`` is the run's ConfigMap: its checksum in the template makes a
    configuration change a spec change (the trainer reads run.yaml once, at start)."""
    template = trainer_pod_template(run, run.spec.image or images.trainer, shape)
    if config is not None:
        checksum = hashlib.sha256(json.dumps(config["data"], sort_keys=True).encode()).hexdigest()[:16]
        template["metadata"]["annotations"] = {CONFIG_HASH_ANNOTATION: checksum}
    return template


def job_spec_hash(job: dict[str, Any]) -> str:
    """Identity of what a running job's pods were made from: everything but the suspend flag (``spec.suspend``, or
    ``spec.runPolicy.suspend`` where the job keeps it in its run policy), which the job's controller applies in place;
    and its Kueue queue (a label Kueue refuses to change on a job it admitted: a queue change is a new job)."""
    spec = json.loads(json.dumps(job["spec"]))
    spec.get("runPolicy", {}).pop("suspend", None)
    spec.pop("suspend", None)
    identity = {"spec": spec, "queue": job["metadata"].get("labels", {}).get(QUEUE_NAME_LABEL)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
