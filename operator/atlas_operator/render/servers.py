"""The vLLM servers (rollout and student): their command, pod templates, Deployments and Services."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from atlas_contract import defaults
from atlas_contract.names import (
    ROLLOUT_VLLM_VERSION,
    TRAINER_METRICS_PORT,
    VLLM_PORT,
    WEIGHT_SYNC_PORT,
    ChildNames,
)
from atlas_contract.sources import SOURCES_DIR
from atlas_contract.vllm import SERVE, server_flags
from atlas_operator.config import Images
from atlas_operator.render.metadata import (
    child_metadata,
    has_student_server,
    labels,
    pod_selector,
    student,
    with_queue_label,
)
from atlas_operator.render.pod_spec import CACHE_DIR, CONTAINER_SECURITY, pod_placement, pod_security
from atlas_operator.render.quantities import byte_quantity, qos_class, quantity
from atlas_operator.render.sources import claim_volumes, fetched, initializer_container, served_model, sources_dir
from atlas_operator.spec import RolloutSpec, Run


def server_sources_dir(run: Run) -> str:
    """Where a server finds its model's fetched copy: the run's cache on the checkpoint PVC (shared with the trainer:
    fetched once per run), else its own cache volume (fetched once per pod)."""
    return sources_dir(run) if run.spec.checkpoint.pvc else f"{CACHE_DIR}/{SOURCES_DIR}"


TMP_DIR = "/tmp"  # the servers' root filesystem is read-only: /tmp is an emptyDir of its own


def _amount(value: str | None) -> str | None:
    """A set resource amount, or None where it is unset or zero (``0``: none, by the spec's word)."""
    return value if value is not None and quantity(value) > 0 else None


def cache_size(run: Run, rollout: RolloutSpec, model: str) -> str | None:
    """The server's cache volume's size (spec's ``cacheSize``, else the default for where its model is), None when
    unbounded (``0``)."""
    if rollout.cache_size is not None:
        return _amount(rollout.cache_size)
    holds_model = fetched(model, model=True) and not run.spec.checkpoint.pvc
    return f"{defaults.SERVER_MODEL_CACHE_GI if holds_model else defaults.SERVER_CACHE_GI}Gi"


def server_resources(run: Run, rollout: RolloutSpec, model: str) -> dict[str, Any]:
    """The vllm container's resources: the spec's cpu and memory (request and limit), else the defaults per GPU
    (atlas_contract/defaults.py: CPU requested with no limit, memory requested and the limit); the cache, /tmp and
    the logs as its ephemeral-storage request and limit; its GPUs."""
    gpus = rollout.gpus or rollout.tensor_parallel_size
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if rollout.cpu is None:
        requests["cpu"] = str(defaults.SERVER_CPU_PER_GPU * gpus)
    elif _amount(rollout.cpu):
        requests["cpu"] = limits["cpu"] = rollout.cpu
    memory = f"{defaults.SERVER_MEMORY_GI_PER_GPU * gpus}Gi" if rollout.memory is None else _amount(rollout.memory)
    if memory:
        requests["memory"] = limits["memory"] = memory
    cache = cache_size(run, rollout, model)
    if cache:
        scratch = (defaults.SERVER_TMP_MI + defaults.SERVER_LOGS_MI) * 2**20
        requests["ephemeral-storage"] = limits["ephemeral-storage"] = byte_quantity(quantity(cache) + scratch)
    limits["nvidia.com/gpu"] = gpus
    return {"requests": requests, "limits": limits} if requests else {"limits": limits}


def initializer_resources() -> dict[str, Any]:
    """The server's initializer's resources (atlas_contract/defaults.py)."""
    memory, storage = defaults.INITIALIZER_MEMORY, defaults.INITIALIZER_EPHEMERAL_STORAGE
    return {
        "requests": {"cpu": defaults.INITIALIZER_CPU, "memory": memory, "ephemeral-storage": storage},
        "limits": {"memory": memory, "ephemeral-storage": storage},
    }


def _vllm_pod_template(
    run: Run,
    component: str,
    rollout: RolloutSpec,
    image: str,
    command: list[str],
    args: list[str],
    probe_path: str,
    ports: list[dict[str, Any]],
    model: str,
    trainer_image: str,
) -> dict[str, Any]:
    """A vLLM server's pod template: a Deployment's, or (a backend that runs its servers in its job) a replicated
    job's. ``model``:
    the URI the server loads, whose local copy an initializer fetches first (with the trainer image, which has the
    fetcher) when it is an S3 or hub model, and whose claim is mounted when it is a ``pvc://`` one. Its root
    filesystem is read-only: what it writes goes to /dev/shm, /tmp and the cache volume (HOME, HF_HOME)."""
    cache = {"name": "cache", "mountPath": CACHE_DIR}
    tmp = {"name": "tmp", "mountPath": TMP_DIR}
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, cache, tmp]
    size = cache_size(run, rollout, model)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": run.spec.resources.shm_size}},
        {"name": "cache", "emptyDir": {"sizeLimit": size} if size else {}},
        {"name": "tmp", "emptyDir": {"sizeLimit": byte_quantity(Decimal(defaults.SERVER_TMP_MI * 2**20))}},
    ]
    claims, claim_mounts = claim_volumes([model])
    volumes += claims
    mounts += claim_mounts
    init = []
    if fetched(model, model=True):
        source_mounts = [dict(cache), dict(tmp)]
        if run.spec.checkpoint.pvc:  # the run's shared cache: the trainer's and every server's copy is one
            checkpoints = {"name": "checkpoints", "mountPath": run.spec.checkpoint.path}
            volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": run.spec.checkpoint.pvc}})
            mounts.append({**checkpoints, "readOnly": True})
            source_mounts.append(checkpoints)
        hf_home = f"{CACHE_DIR}/huggingface"
        fetch = initializer_container(run, trainer_image, source_mounts, server_sources_dir(run), hf_home, uris=[model])
        fetch["env"].append({"name": "HOME", "value": CACHE_DIR})
        fetch["resources"] = initializer_resources()
        fetch["securityContext"]["readOnlyRootFilesystem"] = True
        init.append(fetch)
    container = {
        "name": "vllm",
        "image": image,
        "command": command,
        "args": args,
        "env": [{"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"}, {"name": "HOME", "value": CACHE_DIR}],
        "ports": ports,
        # Loading weights takes minutes: the startup probe allows 20 of them before the others apply.
        "startupProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 10, "failureThreshold": 120},
        # Ready while vLLM answers its health check: a server too busy to answer within 5 s takes no new requests
        # from its Service (and is not killed for it).
        "readinessProbe": {"httpGet": {"path": probe_path, "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5},
        # Alive while its port accepts connections: only a dead server is restarted (vLLM's API server exits when
        # its engine dies; a busy one still accepts).
        "livenessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 30, "failureThreshold": 5},
        "resources": server_resources(run, rollout, model),
        "volumeMounts": mounts,
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
    }
    return {
        "metadata": {"labels": labels(run, component)},
        "spec": {
            **pod_placement(run),
            "securityContext": pod_security(),
            **({"initContainers": init} if init else {}),
            "containers": [container],
            "volumes": volumes,
        },
    }


def _vllm_deployment(run: Run, component: str, rollout: RolloutSpec, template: dict[str, Any]) -> dict[str, Any]:
    name = getattr(ChildNames(run.name), component)
    with_queue_label(run, template["metadata"]["labels"])
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(run, name, component),
        "spec": {
            "replicas": 0 if run.spec.suspend else rollout.replicas,
            "selector": {"matchLabels": pod_selector(run, component)},
            "strategy": {"type": "Recreate"},  # GPUs: never two generations of servers at once
            "template": template,
        },
    }


def rollout_server_command(run: Run) -> list[str]:
    """The rollout server's command: what TRL 1.16 itself runs (``trl vllm-serve`` is deprecated and only execs
    this; ``trl/scripts/vllm_serve.py`` ``build_command``): plain ``vllm serve`` with the NCCL weight-transfer
    engine (the trainer pushes its weights over WEIGHT_SYNC_PORT) and processed logprobs, in dev mode
    (VLLM_SERVER_DEV_MODE=1, set in its env)."""
    rollout = run.spec.rollout
    command = [
        "vllm",
        "serve",
        served_model(run.spec.model, server_sources_dir(run)),
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
        "--tensor-parallel-size",
        str(rollout.tensor_parallel_size),
        "--data-parallel-size",
        str((rollout.gpus or rollout.tensor_parallel_size) // rollout.tensor_parallel_size),
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
    trainer_image = run.spec.image or images.trainer
    template = _vllm_pod_template(
        run, "rollout", rollout, image, command[:2], command[2:], "/health", ports, run.spec.model, trainer_image
    )
    # The weight-transfer endpoints the trainer calls live behind vLLM's dev mode (as `trl vllm-serve` sets it).
    template["spec"]["containers"][0]["env"].append({"name": "VLLM_SERVER_DEV_MODE", "value": "1"})
    return template


def student_pod_template(run: Run, images: Images) -> dict[str, Any]:
    served = student(run)
    rollout = served.rollout
    flags = server_flags(  # atlas_contract/vllm.py: the one source of these flags (the CPU variant beside them)
        host="0.0.0.0",
        port=VLLM_PORT,
        served_model_name=served.model,
        tensor_parallel_size=rollout.tensor_parallel_size,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        max_model_len=rollout.max_model_len,
    )
    args = [served_model(served.model, server_sources_dir(run)), *flags, *rollout.args]
    ports = [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}]
    image = rollout.image or images.rollout
    trainer_image = run.spec.image or images.trainer
    return _vllm_pod_template(
        run, "student", rollout, image, list(SERVE), args, "/health", ports, served.model, trainer_image
    )


def best_effort_warning(run: Run) -> str | None:
    """Which of the run's vLLM servers would run as BestEffort pods (cpu and memory both 0, and no initializer
    requesting any), and what that costs; None when every server requests CPU or memory (or the run has none)."""
    servers: list[tuple[str, str, RolloutSpec, Callable[[Run, Images], dict[str, Any]]]] = []
    if run.spec.rollout.replicas:
        servers.append(("rollout", "spec.rollout", run.spec.rollout, rollout_pod_template))
    if has_student_server(run):
        servers.append(("student", "spec.student.rollout", student(run).rollout, student_pod_template))
    best_effort = [
        (name, field)
        for name, field, rollout, template in servers
        # an unset cpu or memory requests the default: only a server that sets both can request neither
        if rollout.cpu is not None
        and rollout.memory is not None
        and qos_class(template(run, Images())["spec"]) == "BestEffort"
    ]
    if not best_effort:
        return None
    which = " and ".join(f"the {name} server ({field}.cpu and .memory: 0)" for name, field in best_effort)
    verb, whose = ("request", "their") if len(best_effort) > 1 else ("requests", "its")
    return (
        f"{which} {verb} no CPU and no memory, so {whose} pods are BestEffort: the scheduler may place them where "
        "the model does not fit, and the kubelet evicts them first under memory pressure, stalling the trainer; "
        "leave cpu and memory unset for the defaults, or set them"
    )


def rollout_deployment(run: Run, images: Images) -> dict[str, Any]:
    return _vllm_deployment(run, "rollout", run.spec.rollout, rollout_pod_template(run, images))


def student_deployment(run: Run, images: Images) -> dict[str, Any]:
    return _vllm_deployment(run, "student", student(run).rollout, student_pod_template(run, images))


def service(
    run: Run, name: str, component: str, ports: list[tuple[str, int]], selector: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(run, name, component),
        "spec": {
            "selector": selector or pod_selector(run, component),
            "ports": [
                {"name": port_name, "port": port, "targetPort": port_name, "protocol": "TCP"}
                for port_name, port in ports
            ],
        },
    }


def metrics_service(run: Run, rank0: dict[str, str]) -> dict[str, Any]:
    """The trainer's metrics Service. Only rank 0 serves metrics: ``rank0`` are the labels of its pod only (the
    backend's: atlas_operator/backends/)."""
    selector = {**pod_selector(run, "trainer"), **rank0}
    metrics = service(run, ChildNames(run.name).metrics, "trainer", [("metrics", TRAINER_METRICS_PORT)], selector)
    # Headless: its name resolves to rank 0's pod IP, which the operator and Prometheus scrape, and it takes no
    # ClusterIP (a cluster's service range would run out at a few hundred runs).
    metrics["spec"]["clusterIP"] = "None"
    return metrics
